"""Pins and drift of Python patch operations (issue 28): ``importpatch pin`` and ``check``'s
drift verdict.

``pin(names, against)`` records, for every replace / wrap / subclass / set (add and field: the
class they go into) of the named patches, the release its target comes from and the original's
source (``importpatch.rewrite.pins``: the text and the digest of its normalised text), in the
patch's pin file, ``<patch>.pin.toml``.

``drift_of(op, module, file, source, pins)`` compares an operation's pinned original with the one
in ``source`` (the installed packages, a wheel, an sdist, a release): one of

- ``unpinned``: the patch (or this target) has no pin;
- ``unchanged``: the normalised text is the pinned one;
- ``changed``: it differs; ``diff`` is upstream's own change of it, a unified diff from the pinned
  text to ``source``'s; for a class, ``added`` / ``removed`` name the members upstream added or
  removed (added: only those the replacement does not define);
- ``moved``: the name is no longer bound where it was, and the same function is bound elsewhere:
  ``candidates`` are where (another module of the package binding the name, or a name of the same
  module), each with the pinned code, changed by at most a little (``SAME_FUNCTION``);
- ``inherited``: a method (``Class.attr``) no longer bound by its class, which now inherits it:
  ``candidates`` names the base class that binds it;
- ``gone``: none of those: a name that is bound elsewhere but is another function is no move.

What is pinned and compared is every binding of the name that can run (``rewrite.pins``: each
branch of an ``if``, a fallback, a redefinition).

Drift never changes whether a patch applies (``check``'s status); ``check --fail-on-drift`` makes
it the exit status (``DRIFT_EXIT``) for CI.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import re
from collections.abc import Iterable, Sequence
from typing import Any

from importpatch.discover.declare import Op
from importpatch.rewrite import pins as rpins
from importpatch.tools.packages import InstalledSource, Source, UsageError

UNPINNED, UNCHANGED, CHANGED, MOVED, GONE = "unpinned", "unchanged", "changed", "moved", "gone"
INHERITED = "inherited"
DRIFTED = (CHANGED, MOVED, INHERITED, GONE)
# How much of the pinned code a binding elsewhere keeps to be called the same function, moved
# (difflib ratio of the normalised texts, the def line's name aside).
SAME_FUNCTION = 0.8
DRIFT_EXIT = 3  # check --fail-on-drift: everything applies, but a pinned original drifted


@dataclasses.dataclass
class Drift:
    verdict: str
    pinned: str = ""  # "vllm 0.30.0"
    against: str = ""  # the release / source compared with
    module: str = ""
    qualname: str = ""
    diff: str = ""
    added: list[str] = dataclasses.field(default_factory=list)
    removed: list[str] = dataclasses.field(default_factory=list)
    candidates: list[str] = dataclasses.field(default_factory=list)
    pin_file: str = ""

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def summary(self) -> str:
        where = f"{self.module}:{self.qualname}"
        if self.verdict == UNPINNED:
            return "unpinned (importpatch pin NAME records what it was written against)"
        if self.verdict == UNCHANGED:
            return f"unchanged since the pin ({self.pinned})"
        if self.verdict == CHANGED:
            text = f"{where} changed since the pin ({self.pinned} -> {self.against})"
            if self.added:
                text += f"; upstream added {', '.join(self.added)} (not in the replacement)"
            if self.removed:
                text += f"; upstream removed {', '.join(self.removed)}"
            return text
        if self.verdict == MOVED:
            edited = " (changed there too: see the diff)" if self.diff else ""
            return (f"{where} moved since the pin ({self.pinned}) to "
                    f"{', '.join(self.candidates)}{edited}: target it there")
        if self.verdict == INHERITED:
            base = self.candidates[0] if self.candidates else "a base class"
            return (f"{where} is inherited from {base} since the pin ({self.pinned}): the class "
                    "no longer defines it itself")
        return (f"{where} is gone since the pin ({self.pinned}): no function of the package is "
                "it now (removed, or rewritten under another name)")


# -- Where the original is -----------------------------------------------------------------------


def _tree(source: Source, file: str) -> ast.Module | None:
    try:
        return ast.parse(source.text(file))
    except (SyntaxError, ValueError):
        return None


def original_node(tree: ast.Module, qual: str) -> ast.stmt | None:
    from importpatch.rewrite import bindings

    v = bindings.verdict(tree, qual)
    if v.state == bindings.BOUND and v.binding is not None:
        return v.binding.node
    if v.binding is not None and v.state == bindings.MAYBE:
        return v.binding.node
    return None


def release_of(source: Source, module: str) -> tuple[str, str]:
    """(distribution, version) of the package ``module`` is in, as ``source`` knows them."""
    top = module.partition(".")[0]
    version = source.version(top) or ""
    dist = next((d.name for d in source.dists if top in d.top_levels), "")
    if not dist and isinstance(source, InstalledSource):
        from importlib import metadata

        try:
            dist = metadata.packages_distributions().get(top, [""])[0]
        except Exception:
            dist = ""
    if not dist and len(source.dists) == 1:
        dist = source.dists[0].name
    return dist or top, version


# -- Pinning -------------------------------------------------------------------------------------


@dataclasses.dataclass
class Pinned:
    patch: str
    kind: str
    target: str
    file: str  # the pin file
    release: str = ""
    problem: str = ""


def pin(names: Sequence[str], against: str | None = None, *, every: bool = False,
        source: Source | None = None, environ: dict[str, str] | None = None) -> list[Pinned]:
    """Write the pins of the named patches (``every``: every discovered one) taken from
    ``against`` (default: the installed packages). A patch's other pins in the file are kept."""
    from importpatch.tools.packages import open_source

    broken: list[tuple[str, str, str]] = []
    patches = _patches(names, every, environ, broken)
    # A patch whose file fails to load has nothing pinned: that is a failure, never "nothing to
    # pin" (its operations are unknown, so are its targets).
    out = [Pinned(name, "", "", "", problem=f"its file {where} does not load ({error}): fix "
                  f"it, then pin again ('importpatch check {name}' shows the error)")
           for name, where, error in broken]
    src = source if source is not None else open_source(against)
    for patch in patches:
        path = rpins.path_of(patch)
        pinnable = [op for op in patch.ops if rpins.pinned_qual(rpins.pin_kind(op), op.qualname)]
        if not pinnable:
            continue
        if path is None:
            out.append(Pinned(patch.name, "", "", "", problem="no file to put its pins beside "
                              "(a patch made in code that is not a .py file)"))
            continue
        new: list[rpins.Pin] = []
        for op in pinnable:
            made = pin_of(op, src)
            if isinstance(made, str):
                out.append(Pinned(patch.name, op.kind, op.target, path, problem=made))
                continue
            if all((p.module, p.qualname) != (made.module, made.qualname) for p in new):
                new.append(made)
            out.append(Pinned(patch.name, op.kind, op.target, path, made.release))
        write(path, patch.name, new)
    return out


def pin_of(op: Op, source: Source) -> rpins.Pin | str:
    """The pin of ``op``'s original in ``source``, or why there is none."""
    qual = rpins.pinned_qual(rpins.pin_kind(op), op.qualname)
    assert qual is not None
    for module in op.modules:
        file = source.find(module)
        if file is None:
            continue
        tree = _tree(source, file)
        node = original_node(tree, qual) if tree is not None else None
        if node is None:
            continue
        assert tree is not None
        lines = source.text(file).splitlines(keepends=True)
        # every binding that can run: each branch of an if, a fallback, a redefinition
        text = rpins.original_text(lines, rpins.bound_nodes(tree, qual) or [node])
        dist, version = release_of(source, module)
        # An add or field goes into a class (often a large one): its pin keeps the class's digest
        # and, as its text, the names the class body binds (what an addition can clash with).
        kind = rpins.pin_kind(op)
        kept = member_list(node) if kind in rpins.OWNER_KINDS else text
        # (a class bound twice: the members of its first statement, as check compares them)
        return rpins.Pin(patch=op.patch.name, kind=kind, target=op.target, module=module,
                         qualname=qual, dist=dist, version=version, digest=rpins.digest(text),
                         source=kept)
    return f"{op.target}: {qual} is not bound in {source.label}"


def read(path: str) -> list[rpins.Pin]:
    """The pins of a pin file; [] when there is none; UsageError when it is malformed."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        return []
    try:
        return rpins.parse(text)
    except ValueError as exc:
        raise UsageError(f"{path}: not a pin file: {exc}", "fix it, or delete it and run "
                         "'importpatch pin NAME' again") from None


def write(path: str, patch: str, new: list[rpins.Pin]) -> None:
    from importpatch import safefiles

    kept = [p for p in read(path) if p.patch != patch]
    pins = sorted([*kept, *new], key=lambda p: (p.patch, p.module, p.qualname))
    safefiles.write_atomic(path, rpins.render(pins).encode("utf-8"))


def _patches(names: Sequence[str], every: bool, environ: dict[str, str] | None,
             broken: list[tuple[str, str, str]] | None = None) -> list[Any]:
    """The named (``every``: all) discovered patches, loaded; those that fail to load go into
    ``broken`` as (name, source, error)."""
    from importpatch import _boot, config
    from importpatch.discover import catalog

    if not names and not every:
        raise UsageError("name the patches to pin", "or --all for every discovered patch")
    toggles = config.read(os.environ if environ is None else environ)
    entries = catalog.load(toggles) + _boot.api_entries()
    known = {e.name for e in entries}
    unknown = [n for n in names if n not in known]
    if unknown:
        import difflib

        close = [c for n in unknown for c in difflib.get_close_matches(n, sorted(known), n=1)]
        raise UsageError(f"unknown patch name(s): {', '.join(unknown)}"
                         + (f"; did you mean {', '.join(close)}?" if close else ""),
                         "see 'importpatch list'")
    out = []
    for e in entries:
        if not (every or e.name in names):
            continue
        try:
            out.append(catalog.load_patch(e))
        except Exception as exc:
            if broken is not None:
                broken.append((e.name, str(e.source or e.file or ""), str(exc) or repr(exc)))
    return out


# -- Drift ---------------------------------------------------------------------------------------


def drift_of(op: Op, module: str | None, file: str | None, source: Source,
             pins: dict[tuple[str, str], rpins.Pin], pin_file: str = "") -> Drift | None:
    """``op``'s drift in ``source`` (``module``/``file``: where check found its module, None when
    it did not); None for an operation that is not pinned by kind (diff, transform)."""
    qual = rpins.pinned_qual(rpins.pin_kind(op), op.qualname)
    if qual is None:
        return None
    pin = next((p for m in ((module,) if module else ()) + op.modules
                if (p := pins.get((m, qual)))), None)
    if pin is None:
        return Drift(UNPINNED, module=module or op.modules[0], qualname=qual)
    against = source.label
    if module:
        dist, version = release_of(source, module)
        against = f"{dist} {version}".strip() or against
    out = Drift(UNCHANGED, pin.release, against, module or pin.module, qual, pin_file=pin_file)
    tree = _tree(source, file) if file else None
    node = original_node(tree, qual) if tree is not None else None
    if node is None:
        base = _inherited_from(source, tree, module, file, qual) if tree is not None else ""
        if base:
            out.verdict, out.candidates = INHERITED, [base]
            return out
        moved = _candidates(source, pin, tree, file)
        out.candidates = [where for where, _ in moved]
        out.verdict = MOVED if moved else GONE
        if moved and _similarity(pin, moved[0][1]) < 1:  # edited there, not only renamed
            out.diff = upstream_diff(pin.source, moved[0][1], f"{pin.module}:{qual} -> "
                                     f"{moved[0][0]}", pin.release, against)
        return out
    assert file is not None and tree is not None
    lines = source.text(file).splitlines(keepends=True)
    now = rpins.original_text(lines, rpins.bound_nodes(tree, qual) or [node])
    if rpins.matches(pin.digest, current_digests(lines, tree, qual, node)):
        return out
    out.verdict = CHANGED
    if pin.kind in rpins.OWNER_KINDS:  # the pin holds the class's member names, not its text
        before_names = pin.source.splitlines()
        after_names = member_list(node).splitlines()
        out.diff = upstream_diff(pin.source, member_list(node),
                                 f"{pin.module}:{qual} (members)", pin.release, against)
        out.added = sorted(set(after_names) - set(before_names))
        out.removed = sorted(set(before_names) - set(after_names))
        return out
    out.diff = upstream_diff(pin.source, now, f"{pin.module}:{qual}", pin.release, against)
    if isinstance(node, ast.ClassDef):
        before = members(_class_of(pin.source))
        after = members(node)
        defined = replacement_members(op)
        out.added = sorted(n for n in after.keys() - before.keys() if n not in defined)
        out.removed = sorted(before.keys() - after.keys())
    return out


def current_digests(lines: list[str], tree: ast.Module, qual: str, node: ast.stmt) -> str:
    """``rpins.digests_of``, what a pin is compared with (the import hook keeps the same)."""
    return rpins.digests_of(tree, lines, qual) or (
        f"{rpins.digest(rpins.segment(lines, node))} "
        f"{rpins.digest_v1(rpins.segment(lines, node))}")


def _inherited_from(source: Source, tree: ast.Module, module: str | None, file: str | None,
                    qual: str) -> str:
    """``pkg.mod:Base`` when ``Class.attr`` is no longer bound by ``Class`` but by a base class
    it now inherits it from (``bindings.inherited_from``, as check's hint finds it); ""."""
    from importpatch.rewrite import bindings

    if not module or not file or "." not in qual:
        return ""

    def load(name: str) -> tuple[ast.Module, bool] | None:
        found = source.find(name)
        mtree = _tree(source, found) if found is not None else None
        if found is None or mtree is None:
            return None
        return mtree, os.path.basename(found) == "__init__.py"

    package = module if os.path.basename(file) == "__init__.py" else module.rpartition(".")[0]
    try:
        return bindings.inherited_from(tree, module, package, qual, load)
    except Exception:  # a verdict's detail only: a base that cannot be read is no base
        return ""


def upstream_diff(old: str, new: str, where: str, old_label: str, new_label: str) -> str:
    import difflib

    return "".join(difflib.unified_diff(
        old.splitlines(keepends=True), new.splitlines(keepends=True),
        f"{where} ({old_label})", f"{where} ({new_label})"))


def _class_of(text: str) -> ast.ClassDef | None:
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    return next((n for n in tree.body if isinstance(n, ast.ClassDef)), None)


def member_list(node: ast.stmt) -> str:
    """The names a class body binds, one a line (a pin's text for an add or field)."""
    return "".join(f"{name}\n" for name in members(node if isinstance(node, ast.ClassDef)
                                                    else None))


def members(cls: ast.ClassDef | None) -> dict[str, None]:
    """Names a class body binds (methods, nested classes, attributes), in order."""
    out: dict[str, None] = {}
    if cls is None:
        return out
    from importpatch.rewrite.bindings import direct

    for stmt in cls.body:
        for name, _ in direct(stmt):
            out[name] = None
    return out


def replacement_members(op: Op) -> set[str]:
    """What the replacement class defines itself: a replace's class, or the class a subclass
    factory's source defines (empty when it cannot be told)."""
    obj = op.obj
    if isinstance(obj, type):
        return set(vars(obj))
    if op.kind == "subclass" and callable(obj):
        import inspect
        import textwrap

        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(obj)))
        except (OSError, TypeError, SyntaxError):
            return set()
        return {name for cls in ast.walk(tree) if isinstance(cls, ast.ClassDef)
                for name in members(cls)}
    return set()


def _candidates(source: Source, pin: rpins.Pin, tree: ast.Module | None, file: str | None
                ) -> list[tuple[str, str]]:
    """Where the pinned function (or class) is bound now, as (``module:qualname``, its text):
    another name of its module, or a module of the package binding the same name, whose code is
    the pinned code or close to it (``SAME_FUNCTION``). Another function that happens to have the
    same or a close name is not it (a removed ``get_tokenizer_group`` is not ``get_tokenizer``)."""
    from importpatch.rewrite import bindings

    out: list[tuple[str, str]] = []
    owner, _, name = pin.qualname.rpartition(".")
    if tree is not None and file is not None:
        close = bindings.close_symbol(tree, pin.qualname)
        found = _same_function(pin, tree, close, source.text(file)) if close else None
        if found is not None:
            out.append((f"{pin.module}:{close}", found))
    top = pin.module.partition(".")[0]
    pattern = re.compile(rf"^\s*(?:async\s+def|def|class)\s+{re.escape(name)}\b|^\s*"
                         rf"{re.escape(name)}\s*[:=]", re.M)
    for module, file in _package_files(source, top):
        if module == pin.module:
            continue
        try:
            text = source.text(file)
        except Exception:
            continue
        if not pattern.search(text):
            continue
        t = _tree(source, file)
        if t is None:
            continue
        for qual in (pin.qualname, name) if owner else (pin.qualname,):
            found = _same_function(pin, t, qual, text)
            if found is not None:
                out.append((f"{module}:{qual}", found))
                break
        if len(out) >= 5:
            break
    # the closest first: the diff shown is to it
    return sorted(out, key=lambda c: -_similarity(pin, c[1]))


def _same_function(pin: rpins.Pin, tree: ast.Module, qual: str, text: str) -> str | None:
    """The text of ``qual`` in ``tree`` when it is the pinned function moved (its code the
    pinned code, or close to it, its name aside); None when it is another one, or unbound."""
    node = original_node(tree, qual)
    if node is None:
        return None
    if pin.kind in rpins.OWNER_KINDS:  # the pin's text: the names the class binds
        now = member_list(node)
    else:
        lines = text.splitlines(keepends=True)
        now = rpins.original_text(lines, rpins.bound_nodes(tree, qual) or [node])
    return now if _similarity(pin, now) >= SAME_FUNCTION else None


def _similarity(pin: rpins.Pin, now: str) -> float:
    """difflib's ratio of the pinned and ``now``'s normalised lines, the names of their first
    def/class line made the same (a rename alone keeps a function what it is)."""
    import difflib

    def lines(text: str) -> list[str]:
        out = rpins.normalise(text).splitlines()
        for i, line in enumerate(out):
            m = re.match(r"(\s*(?:async\s+def|def|class)\s+)\w+", line)
            if m:
                out[i] = m.group(1) + "_" + line[m.end():]
                break
        return out

    before, after = lines(pin.source), lines(now)
    if not before or not after:
        return 0.0
    return difflib.SequenceMatcher(None, before, after, autojunk=False).ratio()


def _package_files(source: Source, top: str) -> Iterable[tuple[str, str]]:
    """(module, file) of every module of package ``top`` in ``source``."""
    names = getattr(source, "_names", None)
    if names is not None:
        for root in source.roots:
            prefix = f"{root}{top}/"
            for rel in sorted(names):
                if rel.startswith(prefix) and rel.endswith(".py"):
                    mod = rel[len(root):-3].replace("/", ".").removesuffix(".__init__")
                    yield mod, rel
        return
    init = source.find(top)
    if init is None or not os.path.isabs(init):
        return
    base = os.path.dirname(init)
    for folder, dirs, files in os.walk(base):
        dirs.sort()
        for f in sorted(files):
            if f.endswith(".py"):
                path = os.path.join(folder, f)
                rel = os.path.relpath(path, os.path.dirname(base))[:-3]
                yield rel.replace(os.sep, ".").removesuffix(".__init__"), path


def for_patch(patch: Any, pairs: list[tuple[Op, Any]], source: Source) -> list[Drift | None]:
    """``drift_of`` of each (op, check.OpResult) of a patch, in order."""
    path = rpins.path_of(patch)
    try:
        pins = [p for p in read(path) if p.patch == patch.name] if path else []
    except UsageError:
        pins = []
    by = {(p.module, p.qualname): p for p in pins}
    return [drift_of(op, res.module, res.file, source, by, path or "") for op, res in pairs]


def overall(drifts: Iterable[Drift | None]) -> str:
    """A patch's drift: the worst of its operations' (gone > moved > inherited > changed >
    unpinned > unchanged), "" when none of its operations is pinned by kind."""
    order = [GONE, MOVED, INHERITED, CHANGED, UNPINNED, UNCHANGED]
    seen = {d.verdict for d in drifts if d is not None}
    return next((v for v in order if v in seen), "")


def enabled_drift(entries: Iterable[Any], toggles: Any) -> list[str]:
    """One line per drifted pinned original of the patches on here, on the installed release
    (``doctor``)."""
    from importpatch.discover import catalog

    source = InstalledSource()
    lines = []
    for entry in entries:
        if entry.error or not toggles.decide_entry(entry)[0]:
            continue
        try:
            patch = catalog.load_patch(entry)
        except Exception:
            continue
        path = rpins.path_of(patch)
        if path is None or not os.path.exists(path):
            continue
        pairs = []
        for op in patch.ops:
            module = next((m for m in op.modules if source.find(m)), None)
            pairs.append((op, _Where(module, source.find(module) if module else None)))
        for d in for_patch(patch, pairs, source):
            if d is not None and d.verdict in DRIFTED:
                lines.append(f"{patch.name}: {d.summary()} ('importpatch check {patch.name}' "
                             "shows upstream's diff)")
    return lines


@dataclasses.dataclass
class _Where:
    module: str | None
    file: str | None


# -- A copied-and-edited replace becomes a diff ------------------------------------------------


@dataclasses.dataclass
class Converted:
    name: str  # the new diff patch's name
    out: str  # where it was written ("" on --dry-run)
    text: str  # the diff patch's text
    base: str  # the release it is made against
    target: str  # the replace it comes from
    similarity: float  # how much of the original's statements the copy keeps (difflib ratio)


def convert(patch_name: str, *, target: str | None = None, name: str | None = None,
            base: str | None = None, out: str | None = None, dry_run: bool = False,
            min_similarity: float = 0.6) -> Converted:
    """The source diff of just the user's edit in a ``replace`` whose function is an edited copy
    of the original, in the module of ``base`` (default: the release of its pin; ``installed``:
    this interpreter's packages). The copy is aligned with the original by statement
    (``tools/align.py``): its shortened docstring, dropped comments, renamed locals and re-written
    ``def`` line are not the edit, and the diff neither adds nor removes them; only the statements
    the copy changed (and the signature, when it really changed) are. ``rebase`` then carries it
    by 3-way merge. The replace is left in its file: remove it there."""
    from importpatch.rewrite import diffs
    from importpatch.tools import align, authoring
    from importpatch.tools.packages import open_source

    broken: list[tuple[str, str, str]] = []
    patches = _patches([patch_name], False, None, broken)
    if not patches:
        why = f": {broken[0][1]}: {broken[0][2]}" if broken else ""
        raise UsageError(f"patch {patch_name} does not load{why}", "see 'importpatch check NAME'")
    patch = patches[0]
    ops = [op for op in patch.ops if op.kind == "replace" and callable(op.obj)
           and not isinstance(op.obj, type) and (target is None or op.target == target)]
    if len(ops) != 1:
        which = ", ".join(op.target for op in ops) or "none"
        raise UsageError(f"patch {patch_name}: {len(ops)} replace(s) of a function to convert "
                         f"({which})", "name one with --target MODULE:QUALNAME")
    op = ops[0]
    if op.original:
        raise UsageError(f"{op.target}: a replace with original=True calls the original; it "
                         "is no copy of it", "only an edited copy converts to a diff")
    pin = _pin_for(patch, op)
    if base is None and pin is None:
        raise UsageError(f"{op.target} is not pinned: the release it was copied from is unknown",
                         "run 'importpatch pin NAME --against THAT_RELEASE', or pass --base")
    spec = base or f"{pin.dist}=={pin.version}"  # type: ignore[union-attr]
    # --base installed: this interpreter's packages, as 'rebase --to installed'
    source = InstalledSource() if spec == "installed" else open_source(spec, option="--base")
    found = next(((m, f) for m in op.modules if (f := source.find(m))), None)
    if found is None:
        raise UsageError(f"{op.target}: the module is not in {source.label}", "")
    module, file = found
    text = source.text(file)
    tree = ast.parse(text)
    node = original_node(tree, op.qualname or "")
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        raise UsageError(f"{op.target}: no function of that name in {source.label}", "")
    lines = text.splitlines(keepends=True)
    if pin is not None and not rpins.matches(pin.digest,
                                             current_digests(lines, tree, op.qualname or "", node)):
        raise UsageError(f"{op.target}: the original in {source.label} is not the pinned one",
                         "pass --base with the release the copy was made from")
    copy = _copy_text(op, node.name)
    copy_fn = align.function_of(ast.parse(copy))
    assert copy_fn is not None  # _copy_text read a function
    # By statement: the copy's shortened docstring, dropped comments and renamed locals are no
    # part of the edit; the diff changes only the statements (and signature) it changed.
    aligned = align.align(lines, node, copy.splitlines(keepends=True), copy_fn)
    ratio = aligned.kept
    if ratio < min_similarity:
        raise UsageError(f"{op.target}: the replacement keeps {ratio:.0%} of the original's "
                         "statements: not an edited copy of it", "a rewrite stays a replace")
    new_text = "".join(aligned.apply(lines))
    rel = file_rel(module, file)
    body = diffs.make_diff(text, new_text, rel)
    if not body:
        raise UsageError(f"{op.target}: the copy is the original unchanged", "nothing to convert")
    dist, version = release_of(source, module)
    base_spec = base if base and "==" in base else f"{dist}=={version}"
    name = name or f"{patch.name}-{node.name.replace('_', '-')}"
    summary = (f"{op.target}: the edit of {patch.name}'s copy, as a diff (importpatch convert)")
    requires = authoring.minor_series(module.partition(".")[0], version)
    header = authoring.new_header(name, base_spec, requires, summary)
    diff_text = header + body
    where = ""
    if not dry_run:
        where = authoring.output_path(name, out, None)
        authoring.write_or_explain(where, diff_text)
    return Converted(name, where, diff_text, base_spec, op.target, ratio)


def file_rel(module: str, file: str) -> str:
    """``vllm/v1/sample/sampler.py`` of ``module`` (whose file is ``file``)."""
    path = module.replace(".", "/")
    return f"{path}/__init__.py" if file.endswith("__init__.py") else f"{path}.py"


def _pin_for(patch: Any, op: Op) -> rpins.Pin | None:
    path = rpins.path_of(patch)
    qual = rpins.pinned_qual(rpins.pin_kind(op), op.qualname)
    pins = [p for p in read(path) if p.patch == patch.name] if path else []
    return next((p for p in pins if p.qualname == qual and p.module in op.modules), None)


def _copy_text(op: Op, name: str) -> str:
    """The replacement function's text from ``def`` on, dedented, named ``name``."""
    import inspect
    import textwrap

    try:
        text = textwrap.dedent(inspect.getsource(op.obj))
    except (OSError, TypeError) as exc:
        raise UsageError(f"{op.target}: the replacement's source cannot be read: {exc}",
                         "") from None
    tree = ast.parse(text)
    fn = tree.body[0]
    assert isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
    lines = text.splitlines(keepends=True)
    own = lines[fn.lineno - 1:fn.end_lineno]
    head = own[0]
    keyword = "async def " if isinstance(fn, ast.AsyncFunctionDef) else "def "
    at = head.index(keyword) + len(keyword)
    own[0] = head[:at] + name + head[at + len(fn.name):]
    return "".join(own)
