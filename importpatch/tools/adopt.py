"""A team's monkeypatch functions carried as they are: ``importpatch adopt MODULE:FUNCTION``.

Most monkeypatches are a function that assigns attributes of a package's modules and classes
(``Cls.method = new``, the original kept in a closure). Called in the parent, they miss vLLM's
spawned processes and every ``from x import y`` copy made before the call. ``adopt`` keeps the
function as it is and runs it where the import hook runs everything, at the definition site:

1. A child process (``adoptchild``: the standard library only, importpatch's hook off) imports
   the function's module and calls it, to learn the modules it imports ("probe").
2. A second child imports those modules first, snapshots every module's globals and the
   ``__dict__`` of every class they define, calls the function, snapshots again and compares by
   identity: each attribute added, replaced or deleted, attributed to the module that defines it
   (a module global: that module; a class member: the class's ``__module__``, where the class is
   bound at its ``__qualname__``). Both children run with HOME, the cache folders, TMPDIR and the
   working folder inside a temporary work folder, and write no bytecode, so nothing is written
   outside it.
3. The patch file it writes runs the same function, imported by name, through ``Patch.adopt``:
   an ``after_import`` on each changed module, the first to be imported running the function
   once per process, with the changed attributes declared as the patch's targets (``check``,
   ``pin``, ``status`` and the compile-cache key see them) and ``requires`` the installed
   release series of each changed package's distribution.

Refused, saying what the function did: a function that raises, that changes no attribute of a
module or class, or whose changes all lie where no import runs after (built-in and extension
modules, classes made in a function or in ``__main__``). Changes of the function's own package
(a ``_PATCHED = True`` guard of its module) are its own, not targets.

Invariant: nothing is written before every function was run and attributed; the patch file is
written once, atomically, never over an existing file.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Any

from importpatch.discover.declare import CHANGES
from importpatch.tools.packages import UsageError

CHILD_TIMEOUT = 600.0  # seconds per child: importing vLLM on a loaded machine takes minutes


@dataclasses.dataclass
class Change:
    target: str  # "pkg.mod:Qual.name"
    how: str  # replaced | added | deleted
    value: str = ""  # the type of the new (or deleted) value
    why: str = ""  # why it is no target: own, or where no import runs after


@dataclasses.dataclass
class Adopted:
    function: str
    changes: list[Change]  # its targets, in the order their modules were imported
    own: list[Change]  # changes of the function's own package (guards): not targets
    unattributed: list[Change]  # run with it, but no import runs after them
    requires: list[str]
    imported: int  # how many modules were imported in the child by the call's end


@dataclasses.dataclass
class Result:
    name: str
    out: str
    functions: list[Adopted]
    text: str

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def adopt(functions: list[str], *, name: str | None = None, out: str | None = None,
          dry_run: bool = False) -> Result:
    """Run each ``"pkg.mod:function"`` in children, attribute what it changed, and write one
    patch that runs them all at their definition sites (see the module docstring)."""
    for function in functions:
        module, sep, qual = function.partition(":")
        if not sep or not all(p.isidentifier() for p in (*module.split("."), *qual.split("."))):
            raise UsageError(f"{function!r} is not MODULE:FUNCTION",
                             "e.g. importpatch adopt myproj.vllm_patches:monkey_patch_sampler")
    if not functions:
        raise UsageError("name the functions to adopt", "importpatch adopt MODULE:FUNCTION ...")
    name = name or default_name(functions)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name):
        raise UsageError(f"patch name {name!r}: use letters, digits, - _ .", "")
    path = output_path(name, out)
    adopted = [measure(function) for function in functions]
    text = render(name, adopted)
    if not dry_run:
        from importpatch import safefiles

        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        if os.path.lexists(path):  # (checked again: a child ran in between)
            raise UsageError(f"{path} exists", "remove it, or pass --out another folder")
        safefiles.write_atomic(path, text.encode("utf-8"))
    return Result(name, path, adopted, text)


def default_name(functions: list[str]) -> str:
    """The function's own name (``monkey_patch_x`` -> ``monkey-patch-x``) for one function, the
    module's last part for several."""
    module, _, qual = functions[0].partition(":")
    base = qual if len(functions) == 1 else module
    return base.rpartition(".")[2].strip("_").replace("_", "-") or "adopted"


def output_path(name: str, out: str | None) -> str:
    from importpatch import config

    folder = out or next(iter(config.read().path), None)
    if not folder:
        raise UsageError("where should the patch go? IMPORTPATCH_PATH is not set",
                         "pass --out FOLDER, or set IMPORTPATCH_PATH to your patches folder")
    path = os.path.join(folder, name.replace("-", "_").replace(".", "_") + ".py")
    if os.path.lexists(path):
        raise UsageError(f"{path} exists", "remove it, or pass --out another folder")
    return path


# -- Running the function ------------------------------------------------------------------------


def measure(function: str) -> Adopted:
    """What ``function`` changes, from two children in a work folder removed afterwards."""
    work = tempfile.mkdtemp(prefix="importpatch-adopt-")
    try:
        probe = _run_child("probe", function, work)
        modules = os.path.join(work, "modules.json")
        with open(modules, "w", encoding="utf-8") as f:
            json.dump(probe["modules"], f)
        found = _run_child("compare", function, work, modules)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return attribute(function, found)


def child_env(work: str) -> dict[str, str]:
    """The environment of a child: this one's, importpatch's hook off (the function is measured
    on the package as it is installed), everything a process writes pointed into ``work``."""
    env = dict(os.environ)
    for var in ("IMPORTPATCH_ENABLE", "IMPORTPATCH_DISABLE", "VLLM_IMPORTPATCH_ENABLE"):
        env.pop(var, None)
    home = os.path.join(work, "home")
    cache = os.path.join(work, "cache")
    for folder in (home, cache, os.path.join(work, "tmp"), os.path.join(work, "cwd")):
        os.makedirs(folder, exist_ok=True)
    env.update({
        "IMPORTPATCH_OFF": "1", "PYTHONDONTWRITEBYTECODE": "1", "HOME": home,
        "XDG_CACHE_HOME": cache, "XDG_CONFIG_HOME": os.path.join(home, ".config"),
        "XDG_DATA_HOME": os.path.join(home, ".local", "share"),
        "TMPDIR": os.path.join(work, "tmp"), "VLLM_CACHE_ROOT": os.path.join(cache, "vllm"),
        "VLLM_CONFIG_ROOT": os.path.join(home, ".config", "vllm"),
        "HF_HOME": env.get("HF_HOME") or os.path.join(cache, "huggingface"),
        "TRITON_CACHE_DIR": os.path.join(cache, "triton"),
        "TORCHINDUCTOR_CACHE_DIR": os.path.join(cache, "inductor"),
        "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
    })
    return env


def _run_child(mode: str, function: str, work: str, *extra: str) -> dict[str, Any]:
    child = os.path.join(os.path.dirname(os.path.abspath(__file__)), "adoptchild.py")
    with open(child, encoding="utf-8") as f:
        code = f.read()
    out = os.path.join(work, f"{mode}.json")
    try:
        proc = subprocess.run([sys.executable, "-c", code, mode, function, out, *extra],
                              cwd=os.path.join(work, "cwd") if os.path.isdir(
                                  os.path.join(work, "cwd")) else work,
                              env=child_env(work), capture_output=True, text=True,
                              timeout=CHILD_TIMEOUT, check=False)
    except subprocess.TimeoutExpired:
        raise UsageError(f"{function}: did not finish in {CHILD_TIMEOUT:.0f} s",
                         "a function that waits on a server or a GPU cannot be adopted") from None
    try:
        with open(out, encoding="utf-8") as f:
            result: dict[str, Any] = json.load(f)
    except (OSError, ValueError):
        tail = (proc.stderr or proc.stdout or "").strip()[-2000:]
        raise UsageError(f"{function}: the child that runs it ended (exit status "
                         f"{proc.returncode}) without a result: {tail}", "") from None
    if result["error"]:
        hint = ("it must be importable here, on sys.path without the working folder, as in "
                "every process that will run it: install its package or put its folder on "
                "PYTHONPATH") if "ModuleNotFoundError" in result["error"] and \
            function.partition(":")[0].split(".")[0] in result["error"] else ""
        raise UsageError(f"{function} raised when called with no arguments ({mode}): "
                         f"{result['error']}", hint or (result.get("traceback") or "")[-800:])
    return result


# -- Attribution -----------------------------------------------------------------------------


def attribute(function: str, found: dict[str, Any]) -> Adopted:
    """Targets, own changes and unattributed ones; UsageError when nothing is a target."""
    own_top = function.partition(":")[0].split(".")[0]
    order = {m: i for i, m in enumerate(found.get("modules", []))}
    targets: list[Change] = []
    own: list[Change] = []
    stray: list[Change] = []
    for c in sorted(found["changes"], key=lambda c: (order.get(c["module"], 1 << 30),
                                                      c["module"], c["qualname"])):
        change = Change(f"{c['module']}:{c['qualname']}", c["how"], c["value"])
        top = c["module"].split(".")[0]
        if c["kind"] == "stray":
            change.why = (f"a class that no importable module binds at its name "
                          f"({c['module']}.{c['qualname'].rpartition('.')[0]})")
            stray.append(change)
        elif top == own_top:
            change.why = "the function's own package"
            own.append(change)
        elif c["module"] == "__main__" or not c["source"]:
            change.why = (f"{c['module']} has no Python source (built in or an extension "
                          "module): no import of it runs after the hook starts")
            stray.append(change)
        else:
            assert change.how in CHANGES
            targets.append(change)
    if not targets:
        did = [f"{c.how} {c.target} ({c.why})" for c in own + stray]
        imported = len(found.get("modules", []))
        raise UsageError(
            f"{function}: nothing to adopt: " + (
                "it changed " + "; ".join(did) if did else
                f"it ran, importing {imported} module(s), and changed no attribute of any "
                "module or class (a function that only mutates objects — a dict's entries, an "
                "instance's attributes — is not adopted)"),
            "adopt a function that assigns module or class attributes; for a registry call, "
            "write patch.after_import(MODULE, fn) (docs/writing-patches.md)")
    return Adopted(function, targets, own, stray, requires_of(targets),
                   len(found.get("modules", [])))


def requires_of(changes: list[Change]) -> list[str]:
    """The installed release series of each changed package's distribution (none for the
    standard library)."""
    from importpatch.tools.authoring import minor_series
    from importpatch.tools.packages import find_dist

    out: list[str] = []
    for top in dict.fromkeys(c.target.partition(":")[0].split(".")[0] for c in changes):
        if top in sys.stdlib_module_names:
            continue
        try:
            dist = find_dist(top)
        except UsageError:
            continue
        req = minor_series(dist.metadata["Name"], dist.version)
        if req not in out:
            out.append(req)
    return out


# -- The patch file ------------------------------------------------------------------------------


def _q(text: str) -> str:
    """A Python string literal in double quotes (JSON's escapes are Python's)."""
    return json.dumps(text)


def render(name: str, adopted: list[Adopted]) -> str:
    import textwrap

    from importpatch import _version

    requires = list(dict.fromkeys(r for a in adopted for r in a.requires))
    versions = "; ".join(requires) or "no distribution found for the changed modules"
    command = " ".join(["importpatch adopt", *(a.function for a in adopted)])
    lines = textwrap.wrap(f'"""Adopted by `{command}` (importpatch {_version.__version__}, '
                          f"on {versions}).", 96, break_long_words=False,
                          break_on_hyphens=False)
    lines += [
        "",
        "Each function runs unchanged, imported by name, once per process, right after the first",
        "of the modules it changes is imported (before that import returns), in every process",
        "where the patch is on. Its module must be importable there (installed, or on",
        "PYTHONPATH). The targets are what it changed when adopt ran it:",
        "'importpatch check' says when one is gone, 'importpatch pin' records them.",
    ]
    for a in adopted:
        for c in a.own:
            lines.append(f"{a.function} also {c.how} {c.target} ({c.why}: not a target).")
        for c in a.unattributed:
            lines.append(f"{a.function} also {c.how} {c.target}, which no import runs after "
                         f"({c.why}): done when it runs.")
    lines += ['"""', "", "from importpatch import Patch", "", "patch = Patch(",
              f"    {_q(name)},"]
    if requires:
        lines.append(f"    requires={_q('; '.join(requires))},")
    lines += [f"    doc={_q('adopted: ' + ', '.join(a.function for a in adopted))},", ")"]
    for a in adopted:
        lines += ["", f"patch.adopt({_q(a.function)}, {{"]
        # (the comment: what the function put there, or took away)
        lines += [f"    {_q(c.target)}: {_q(c.how)},  # {c.value}" for c in a.changes]
        lines.append("})")
    return "\n".join(lines) + "\n"
