"""vLLM's compile caches keyed on the patches that are on (the ``vllm-compile-cache-key`` patch).

vLLM keeps what ``torch.compile`` made of a model between runs: the AOT artifact
(``<VLLM_CACHE_ROOT>/torch_compile_cache/torch_aot_compile/<hash>``, torch >= 2.10) and the
Inductor artifacts of the other path (``torch_compile_cache/<hash>``, ``VLLM_USE_AOT_COMPILE=0``).
Both hashes start from ``vllm.envs.compile_factors()``, the factors of the environment, and
neither knows what importpatch changed: an artifact compiled without a patch is loaded by a run
with it ("Directly load AOT compilation", the patch silently absent from the model). vLLM's
source check does not help: it re-reads only the files the artifact recorded, from disk, and a
patch's code is in none of them (a source diff's text never is on disk).

The built-in patch ``vllm-compile-cache-key`` (on by default where vLLM is installed) wraps
``compile_factors`` to add one factor, ``IMPORTPATCH_PATCHES``: the name and a digest of the code
of every other patch on in the process (``factor``). So
- a run with a different set of patches, or a patch whose code changed, gets another folder and
  compiles; the same set finds its folder again and loads it (no needless recompile);
- with no patch on, nothing is added: the key is vLLM's own, and artifacts made before
  importpatch was installed stay valid;
- the factor is in vLLM's own record of the key (``cache_key_factors.json``) and in the process's
  events (``importpatch status``: "compile cache key ..."); ``importpatch doctor`` prints the one
  this environment gives.

What a patch's digest covers (invariant: equal digests mean equal code, in every process):
- a patch file (``.py``, ``.diff``, ``.patch``): its bytes, and for a ``.py`` its folder's helper
  files (``_name``), which it may import;
- a patch package's patch (entry point): every ``.py`` file of the package that defines it;
- a ``Patch(...)`` made in the process: the source file of each operation's function (an
  ``after_import`` hook given as ``"helper.module:function"``: the helper's file);
- a ``redirect``, however declared: the file of the module it redirects to (a package: its
  ``.py`` files), which runs in the redirected module's place;
- a patch that failed or was skipped in this process so far counts as such (``!failed``), not as
  the code it would have added: the artifact then records the model as it ran; one whose version
  requirement does not hold here is not counted (it changes nothing).
Patches are counted when they are on, whether or not their targets are imported yet.

Which patches are counted (``counts``): exactly those whose code a compiled model can run. A
patch is left out of the key only when every module its operations name (each candidate of an
``"a|b"`` target) is in ``NEVER_COMPILED`` or under one of its packages: vLLM code that runs as
plain Python outside every ``@support_torch_compile`` forward, and whose changes reach the
compiled graph, if at all, only through the config, whose hash vLLM keys the artifact with
already. Turning such a patch on or off keeps the key: the artifact is loaded again. Everything
else counts, the undecidable cases included (the invariant: never an artifact compiled without a
patch that it could run):
- a module not in the list (model code, layers, attention, kernels, custom ops, the compiler,
  the config, the platform, the worker and its model runner, ``torch``, ``transformers``, any
  other package);
- a patch that names no target, whose declaration is broken or unsure, or that has an
  ``after_import`` hook (its function runs any code, not a change of what it names);
- a source diff or transform counts like any operation, by the module it changes.
The list is an allow-list of modules known never traced (vLLM >= 0.12, where the patch
applies), checked against vLLM 0.32's source: none of them has a ``@support_torch_compile`` class
or is called from a model's ``forward``; the sampler's own ``torch.compile``'d helpers
(``vllm.v1.sample.ops``) are keyed by torch's caches on their graph. A module missing from it
costs a recompile, never a wrong model: add one only with that proof. The rule assumes that a
patch changes what it declares: a wrap of the scheduler whose body assigns into model code is
outside it (declare that target instead).
"""

from __future__ import annotations

import hashlib
import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

    from importpatch.discover.catalog import Entry

NAME = "vllm-compile-cache-key"  # the built-in patch that adds the factor (patches/)
FACTOR = "IMPORTPATCH_PATCHES"
_recorded: set[str] = set()

# Modules (and the packages under them) whose code no compiled model runs: plain Python in the
# driver, the API server or the EngineCore, or in the Worker after the compiled forward. The
# rule and the proof each needs: module docstring; docs/triton.md lists them with the reason.
NEVER_COMPILED = (
    "vllm.entrypoints",  # LLM, the OpenAI API server, the CLI
    "vllm.engine",  # EngineArgs (builds the config: its hash is in the key), engine front ends
    "vllm.v1.engine",  # EngineCore, AsyncLLM, input and output processing, the detokenizer
    "vllm.v1.core",  # the scheduler, the KV-cache manager, the block pool
    "vllm.v1.sample",  # the sampler, logits processors: they run on the logits of the forward
    "vllm.v1.structured_output",  # grammars and their bitmasks (applied to the logits)
    "vllm.v1.metrics",  # stats loggers, Prometheus
    "vllm.tokenizers",  # tokenizers and detokenizing (vLLM >= 0.13)
    "vllm.transformers_utils.tokenizer",  # the same before 0.13
    "vllm.transformers_utils.tokenizer_base",
    "vllm.transformers_utils.detokenizer_utils",
    "vllm.reasoning",  # the API server's reasoning parsers
    "vllm.tool_parsers",  # the API server's tool-call parsers
    "vllm.sampling_params",  # SamplingParams (the sampler reads it)
    "vllm.outputs",  # RequestOutput
    "vllm.usage",  # usage statistics
    "vllm.snapshot",  # the `vllm snapshot` command's host runtime (only its CLI imports it)
)
_UNBOUNDED_KINDS = ("after_import",)  # its function runs any code: not a change of what it names


def never_compiled(module: str) -> bool:
    """Whether ``module`` is in ``NEVER_COMPILED`` or under one of its packages."""
    return any(module == m or module.startswith(m + ".") for m in NEVER_COMPILED)


def counts(entry: Entry) -> bool:
    """Whether ``entry``'s patch can change code that a compiled model runs, so that it must be
    in the key (the rule: module docstring). True wherever that cannot be decided."""
    modules = [m for group in (entry.modules or ()) for m in group]
    if entry.error or entry.unsure or not modules:
        return True
    if any(kind in _UNBOUNDED_KINDS for kind in entry.kinds or ()):
        return True
    return not all(map(never_compiled, modules))


def factor() -> str | None:
    """``name=digest`` of every patch on in this process that ``counts``, but this one, sorted,
    ``;``-joined; None when there is none."""
    from importpatch.load.finder import installed

    active = installed()
    if active is None:
        return None
    from importpatch import versions

    entries = [e for e in active.entries
               if e.name != NAME and versions.check(e.requires)[0] and counts(e)]
    if not entries:
        return None
    bad = _failed_here()
    return ";".join(f"{e.name}={'!failed' if e.name in bad else entry_digest(e)}"
                    for e in sorted(entries, key=lambda e: e.name))


def left_out() -> list[str]:
    """Names of the patches on in this process that the key leaves out (``counts``), sorted."""
    from importpatch.load.finder import installed

    active = installed()
    if active is None:
        return []
    from importpatch import versions

    return sorted(e.name for e in active.entries
                  if e.name != NAME and versions.check(e.requires)[0] and not counts(e))


def with_factor(factors: dict[str, object]) -> dict[str, object]:
    """vLLM's compile factors with ours added (``vllm.envs.compile_factors``, wrapped)."""
    value = factor()
    if value is None:
        return factors
    factors = dict(factors)
    factors[FACTOR] = value
    if value not in _recorded:  # once per distinct key per process: status shows it
        _recorded.add(value)
        from importpatch import events

        key = hashlib.sha256(value.encode()).hexdigest()[:12]
        outside = left_out()
        note = f" (left out, no compiled model runs them: {', '.join(outside)})" if outside else ""
        events.record("info", NAME, "vllm.envs:compile_factors", "compile-cache-key",
                      f"compile cache key {key}: {FACTOR}={value}{note}", level=20)
    return factors


def entry_digest(entry: Entry) -> str:
    """A short digest of what ``entry``'s patch is made of (see the module docstring)."""
    h = hashlib.sha256()
    for path in _code_files(entry):
        h.update(path.encode("utf-8", "surrogateescape") + b"\0")
        h.update(_read(path))
    return h.hexdigest()[:16]


def _code_files(entry: Entry) -> list[str]:
    return [*_declared_files(entry), *_redirected_files(entry)]


def _declared_files(entry: Entry) -> list[str]:
    if entry.file:
        files = [entry.file]
        if entry.file.endswith(".py"):
            from importpatch.discover.folders import helper_files

            files += helper_files(os.path.dirname(entry.file))
            files += _hook_files(entry.file)
        return files
    if entry.origin == "entry-point":  # "entry point NAME = module:attr"
        module = entry.source.partition("=")[2].strip().partition(":")[0]
        return _package_files(module.partition(".")[0])
    patch = getattr(entry, "_patch", None)  # made with Patch(...) in this process
    ops = getattr(patch, "ops", ())
    codes = (getattr(op.obj, "__code__", None) for op in ops)
    found = {code.co_filename for code in codes if code is not None}
    # an after_import "helper.module:function": the helper's file, found without importing it
    helpers = {op.obj.partition(":")[0] for op in ops
               if op.kind == "after_import" and isinstance(op.obj, str)}
    helpers |= {op.obj.function.partition(":")[0] for op in ops
                if op.kind == "after_import" and hasattr(op.obj, "function")}  # Patch.adopt
    if helpers:
        from importpatch.load.finder import source_file

        found |= {f for f in map(source_file, helpers) if f}
    return sorted(found)


def _redirected_files(entry: Entry) -> list[str]:
    """The code a redirect puts in its module's place, whatever declared it: the file of the
    module it redirects to (a package: every ``.py`` file under its folder), found, not
    imported. Only an entry that states a redirect loads its declaration for this."""
    if "redirect" not in (entry.kinds or ()) or entry.error:
        return []
    from importpatch.discover import catalog
    from importpatch.load.finder import source_file

    try:
        patch = catalog.load_patch(entry)
    except Exception:  # (its import fails closed and says why; counted as its declaration)
        return []
    out: list[str] = []
    for to in sorted({str(op.obj) for op in patch.ops if op.kind == "redirect"}):
        file = source_file(to)
        if file is None:
            out.append(f"<{to}: not found>")  # (read as unreadable: a digest of its own)
        elif os.path.basename(file) == "__init__.py":
            for folder, dirs, files in os.walk(os.path.dirname(file)):
                dirs[:] = sorted(d for d in dirs if d != "__pycache__")
                out += [os.path.join(folder, f) for f in sorted(files) if f.endswith(".py")]
        else:
            out.append(file)
    return out


def _hook_files(patch_file: str) -> list[str]:
    """The files of the functions a ``.py`` patch file runs by name, ``"pkg.mod:function"``:
    ``patch.adopt(FUNCTION, ...)`` and ``patch.after_import(MODULE, FUNCTION)``, read from its
    text (nothing imported): their code is the patch's as much as the file's is."""
    import ast

    try:
        tree = ast.parse(_read(patch_file))
    except (SyntaxError, ValueError):
        return []
    named = set()
    for call in ast.walk(tree):
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)):
            continue
        at = {"adopt": 0, "after_import": 1}.get(call.func.attr)
        arg = call.args[at] if at is not None and len(call.args) > at else None
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and ":" in arg.value:
            named.add(arg.value.partition(":")[0])
    if not named:
        return []
    from importpatch.load.finder import source_file

    return sorted({f for f in map(source_file, sorted(named)) if f})


def _package_files(top: str) -> list[str]:
    from importlib.util import find_spec

    try:
        spec = find_spec(top)  # a top-level name: finds, executes nothing
    except (ImportError, ValueError):
        return []
    if spec is None:
        return []
    if not spec.submodule_search_locations:
        return [spec.origin] if spec.origin else []
    out = []
    for base in spec.submodule_search_locations:
        for folder, dirs, files in os.walk(base):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            out += [os.path.join(folder, f) for f in sorted(files) if f.endswith(".py")]
    return out


def _read(path: str) -> bytes:
    from importpatch.safefiles import read_regular

    try:
        return read_regular(path)
    except OSError:  # a folder among a folder's helpers, a file gone: named, not read
        return b"\0unreadable"


def _failed_here() -> set[str]:
    from importpatch import events

    return {e["patch"] for e in events.events() if e["outcome"] in ("failed", "skipped")}


def described(entries: Iterable[Entry]) -> str:
    """The factor ``entries`` (the patches on) give, for ``importpatch doctor``."""
    return ";".join(f"{e.name}={entry_digest(e)}"
                    for e in sorted(entries, key=lambda e: e.name)
                    if e.name != NAME and counts(e))
