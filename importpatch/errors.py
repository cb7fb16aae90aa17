"""The one error a failed patch raises at the import of its target (``PatchError``), and the
error of a command-line request that cannot be carried out as asked (``UsageError``)."""

from __future__ import annotations

import sys


class UsageError(Exception):
    """A request that cannot be carried out as asked (bad path, unknown patch name); the
    commands print it with its hint and exit 2. Imported by them from importpatch.tools.packages."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.hint = hint


class PatchError(ImportError):
    """An enabled patch could not be applied; the target module was not imported.

    The message names the patch, the target (module and symbol or hunk), the file and the
    installed version of the target's distribution, so the log line alone is enough to act on.
    """

    def __init__(self, patch: str, module: str, what: str, *, file: str | None = None) -> None:
        version = installed_version(module)
        where = f" ({file})" if file else ""
        msg = f"importpatch: patch {patch!r} cannot apply to {module}{where}, {version}: {what}"
        super().__init__(msg, name=module, path=file)
        self.patch = patch
        self.module = module
        self.what = what
        self.file = file
        self.version = version
        self.recorded = False  # an event for it was recorded already


def installed_version(module: str) -> str:
    """'<top> <version>' for the package that holds ``module``, as well as can be told cheaply."""
    top = module.partition(".")[0]
    mod = sys.modules.get(top)
    version = getattr(mod, "__version__", None)
    if not isinstance(version, str):
        from importpatch.versions import distribution_version

        version = distribution_version(top)
    return f"{top} {version or 'version unknown'}"
