"""Where distributions live, in one place: the start-up hook, discovery and its index, ``doctor``
and the pytest plugin all ask here.

- ``site_packages()``: the site folders of this interpreter (where pip puts ``importpatch.pth``),
  the user site flagged;
- ``search_path()``: the folders entry points are looked up in, i.e. ``sys.path`` as the site
  module left it, without the script folder or working folder that the interpreter puts first
  afterwards (so every process of an environment shares one catalog index).
"""

from __future__ import annotations

import os
import sys

# sys.path as it was when site had finished (recorded by _boot at start-up, before the
# interpreter put the script folder first); None in a process where the hook did not run.
site_path: list[str] | None = None


def site_packages() -> list[tuple[str, bool]]:
    """(folder, is_user_site) for every site folder of this interpreter, in site's order."""
    import site

    dirs = [(d, False) for d in getattr(site, "getsitepackages", list)()]
    user_site = site.getusersitepackages()
    if isinstance(user_site, str):
        dirs.append((user_site, True))
    unique: dict[str, bool] = {}
    for folder, user in dirs:
        unique.setdefault(folder, user)
    return list(unique.items())


def user_site_if_enabled() -> str | None:
    """The user site folder when this interpreter would put it on sys.path (even if it does not
    exist yet: `pip install --user` creates it), else None."""
    site = sys.modules.get("site")
    if site is None or sys.flags.no_user_site or not getattr(site, "ENABLE_USER_SITE", False):
        return None
    user_site = getattr(site, "USER_SITE", None)
    return user_site if isinstance(user_site, str) else None


def search_path() -> list[str]:
    """The folders of sys.path that exist, as site left them (see the module docstring)."""
    path = site_path
    if path is None:
        path = list(sys.path)
        first_is_script = not (sys.flags.isolated or getattr(sys.flags, "safe_path", False))
        if first_is_script and path and "site" in sys.modules:
            path = path[1:]
    out: list[str] = []
    for entry in path:
        folder = os.path.abspath(entry or os.curdir)
        if folder not in out and os.path.isdir(folder):
            out.append(folder)
    return out
