"""Issue 36, items 1 and 2: ``check`` and ``doctor`` judge the *set* a process runs (definition-site
and in-place landings together, by the import's own rule), and ``list``, ``check``, ``doctor`` and
``status`` say one word per patch.

The first case of the issue, on a stand-in: ``fakevllm.sched.Scheduler`` (tests/
test_decl_imports_target.py) with the blog post's package migrated as docs/migration.md says (its
module-level import of the target stays: it lands in place), named in ``VLLM_CUSTOM_PATCHES``,
plus a patch file that wraps ``Scheduler.schedule`` at the definition site (the shipped
``vllm-priority-scheduler``'s shape) in ``IMPORTPATCH_ENABLE``. Real child interpreters of the
session's wheel venv, real CLI runs.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from coreutil import Lab, install_dist
from test_decl_imports_target import FAKEVLLM, blog_lab, env

from importpatch.install.activation import IN_PLACE_FIX, TOGETHER

BLOG, WRAP = "PriorityScheduler", "prio-wrap"
WRAP_FILE = {"prio_wrap.py": '''
    from importpatch import Patch

    p = Patch("prio-wrap")


    @p.wrap("fakevllm.sched:Scheduler.schedule")
    def schedule(wrapped, instance, args, kwargs):
        return "wrapped(" + wrapped(*args, **kwargs) + ")"
    '''}
USE = "import fakevllm.sched as m; print(m.Scheduler().schedule())"


def both_on(lab: Lab, extra: dict[str, str] | None = None) -> dict[str, str | None]:
    return {**env(lab, "120"), "VLLM_CUSTOM_PATCHES": BLOG, **(extra or {})}


def cli(lab: Lab, *args: str, extra: dict[str, str] | None = None) -> tuple[int, Any]:
    proc = lab.run(["-m", "importpatch", *args, "--json"], enable=WRAP, env=both_on(lab, extra))
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def test_check_and_doctor_refuse_the_set_the_import_refuses_and_name_the_fix(lab: Lab) -> None:
    blog_lab(lab).patch(WRAP_FILE)
    # The real import: both on from interpreter start, the in-place set dies on the wrap.
    run = lab.run(USE, enable=WRAP, env=both_on(lab))
    assert run.returncode != 0 and "PatchError" in run.stderr, run.stderr
    assert "already wrapped by 'prio-wrap'" in run.stderr, run.stderr
    assert IN_PLACE_FIX in run.stderr, run.stderr
    assert TOGETHER not in run.stderr, run.stderr  # unfollowable: both are on at start already

    status, report = cli(lab, "check")
    assert status == 1 and report["exit_status"] == 1, report
    by_name = {p["name"]: p for p in report["patches"]}
    assert by_name[BLOG]["status"] == "fail" and by_name[BLOG]["landing"] == "in-place"
    assert by_name[WRAP]["status"] == "ok", by_name[WRAP]
    (conflict,) = [c for c in report["conflicts"] if c["kind"] == "landing"]
    assert conflict["patches"] == [BLOG, WRAP], conflict
    assert "already wrapped by 'prio-wrap'" in conflict["detail"], conflict
    assert IN_PLACE_FIX in conflict["detail"] and TOGETHER not in conflict["detail"], conflict

    status, doctor = cli(lab, "doctor")
    assert status == 1 and not doctor["ok"], doctor
    assert any(BLOG in p and "already wrapped by 'prio-wrap'" in p for p in doctor["problems"]), \
        doctor["problems"]


# The fix the conflict names, followed: the module-level import deleted, the target a string, the
# saved original a wrap; then both land at the definition site, in one chain.
FIXED = '''
from importpatch import Patch

p = Patch("PriorityScheduler")


@p.wrap("fakevllm.sched:Scheduler.schedule", order=10)
def schedule(wrapped, instance, args, kwargs):
    return "priority(" + wrapped(*args, **kwargs) + ")"


def register_patches():
    return [p]
'''


def test_the_fix_check_names_starts_and_check_says_ok(lab: Lab) -> None:
    lab.target(FAKEVLLM).patch(WRAP_FILE)
    install_dist(lab.venv, lab.targets, "fixed-patches", "0.1.0", {"fixed_patches.py": FIXED},
                 top_level=["fixed_patches"],
                 entry_points="[importpatch.patches]\nfixed = fixed_patches:register_patches\n")
    run = lab.ok(USE, enable=f"{WRAP},{BLOG}", env=env(lab, "120"))
    assert run.stdout.strip().splitlines()[-1] == "priority(wrapped(scheduled))", run.stdout
    proc = lab.run(["-m", "importpatch", "check", "--json"], enable=f"{WRAP},{BLOG}",
                   env=env(lab, "120"))
    report = json.loads(proc.stdout)
    assert proc.returncode == 0, report
    assert {p["name"]: p["status"] for p in report["patches"]} == {WRAP: "ok", BLOG: "ok"}


@pytest.mark.parametrize("with_wrap", [True, False], ids=["conflict", "alone"])
def test_list_check_doctor_and_status_say_one_word_per_patch(lab: Lab, with_wrap: bool) -> None:
    blog_lab(lab)
    if with_wrap:
        lab.patch(WRAP_FILE)
    events = lab.root / "events"
    events.mkdir()
    lab.run(USE, enable=WRAP, env=both_on(lab, {"IMPORTPATCH_EVENTS_DIR": str(events)}))
    _, listed = cli(lab, "list")
    _, checked = cli(lab, "check")
    _, doctor = cli(lab, "doctor")
    _, status = cli(lab, "status", "--events-dir", str(events))
    on = {BLOG, WRAP} if with_wrap else {BLOG}
    words = {
        "list": {r["name"]: r["verdict"] for r in listed["patches"] if r["name"] in on},
        "check": {p["name"]: p["status"] for p in checked["patches"] if p["name"] in on},
        "doctor": {v["patch"]: v["verdict"] for v in doctor["verdicts"] if v["patch"] in on},
        "status": {n: t["verdict"] for n, t in status["patches"].items() if n in on},
    }
    expected = {BLOG: "fail", WRAP: "ok"} if with_wrap else {BLOG: "ok"}
    # list decides only what the declarations and the set's landings decide (the wrap file: a dry
    # run of its source, check's business): the word it gives is the same, and it gives one for
    # the in-place patch, which it used to call "error ... not applied".
    assert words["list"][BLOG] == expected[BLOG], words
    assert words["list"].get(WRAP) in (None, expected.get(WRAP)), words
    for command in ("check", "doctor", "status"):
        assert words[command] == expected, (command, words)

