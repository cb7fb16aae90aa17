"""The command line tells the truth (issue 36, item 5 and Required 2): a mistyped command or
option gets a "did you mean"; an unknown patch name says where discovery looked; ``status`` keeps
default-on patches apart from requested ones and counts a failure once; a hidden binder's warning
says what it risks; ``list`` and ``check`` give one verdict word to one patch. Each runs the real
command (``python -m importpatch``) in the wheel's venv."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from coreutil import Lab
from test_compat import TARGET, custom, install_published

pytestmark = pytest.mark.lab(target=TARGET)


def ip(lab: Lab, *args: str, **kw: object) -> tuple[int, str, str]:
    proc = lab.run(["-m", "importpatch", *args], **kw)  # type: ignore[arg-type]
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, proc.stdout, proc.stderr


@pytest.mark.parametrize(("args", "error", "hint"), [
    (["chek"], "unknown command 'chek' - did you mean 'check'?", "the commands are list, check,"),
    (["check", "--agaisnt", "x"], "unrecognized arguments: --agaisnt; did you mean '--against'?",
     "see 'importpatch check --help'"),
    (["list", "--jsn"], "unrecognized arguments: --jsn; did you mean '--json'?",
     "see 'importpatch list --help'"),
    (["--tracebak", "list"], "unrecognized arguments: --tracebak; did you mean '--traceback'?",
     "see 'importpatch list --help'"),
    (["cache", "prnue"], "argument action: invalid choice: 'prnue' (choose from show, prune, "
     "clear); did you mean 'prune'?", "see 'importpatch cache --help'"),
])
def test_a_mistyped_command_option_or_choice_gets_did_you_mean(
    lab: Lab, args: list[str], error: str, hint: str
) -> None:
    rc, out, err = ip(lab, *args)
    assert rc == 2 and out == ""
    assert err.splitlines()[0] == f"importpatch: error: {error}"
    assert err.splitlines()[1].startswith(f"hint: {hint}"), err


def test_an_unknown_name_says_where_discovery_looked_and_how_a_patch_is_found(lab: Lab) -> None:
    lab.patch({"mine.py": "from importpatch import Patch\n"
                          "Patch('my-fix').replace('tpkg.kv:resolve', lambda x: x)\n"})
    # IMPORTPATCH_PATH unset, no patch package: said, with the two ways a patch is found
    rc, _, err = ip(lab, "check", "my-fix", enable=None, env={"IMPORTPATCH_PATH": None})
    assert rc == 2
    error, hint = err.splitlines()
    assert error == "importpatch: error: unknown patch name(s): my-fix"
    assert "looked in: " in hint and "built-in patch(es)" in hint
    assert "no IMPORTPATCH_PATH folder (IMPORTPATCH_PATH is not set)" in hint
    assert "the entry points of group importpatch.patches (no installed package has one)" in hint
    assert "a patch file is found with IMPORTPATCH_PATH=<its folder>" in hint
    assert "a patch package once it is pip-installed here" in hint
    # the folder set: named, and the did-you-mean among what it holds
    rc, _, err = ip(lab, "check", "my-fixx", enable=None)
    assert rc == 2
    error, hint = err.splitlines()
    assert error == "importpatch: error: unknown patch name(s): my-fixx; did you mean my-fix?"
    assert f"the IMPORTPATCH_PATH folders ({lab.patches})" in hint
    # a name in IMPORTPATCH_ENABLE that no patch has: its row says the same
    rc, out, _ = ip(lab, "check", "--json", enable="nope", env={"IMPORTPATCH_PATH": None})
    assert rc == 1
    (row,) = [p for p in json.loads(out)["patches"] if p["name"] == "nope"]
    assert row["problems"] == ["no patch of this name is discovered here"]
    assert "no IMPORTPATCH_PATH folder (IMPORTPATCH_PATH is not set)" in row["suggestion"]


def test_status_keeps_unrequested_defaults_apart_and_counts_one_failure_once(
    lab: Lab, tmp_path: Path
) -> None:
    lab.patch({"p.py": '''
        from importpatch import Patch
        Patch("bad-resolve").replace("tpkg.kv:resolv", lambda x: x)  # no such symbol
        Patch("dflt", default=True).wrap("tpkg.gone:f", lambda w, i, a, k: 2)  # no such module
        '''})
    events = tmp_path / "events"
    proc = lab.run("try:\n    import tpkg.kv\nexcept ImportError:\n    pass\nimport tpkg.sched\n",
                   enable="bad-resolve", env={"IMPORTPATCH_EVENTS_DIR": str(events)})
    assert proc.returncode == 0, proc.stderr
    # one failure: one line on stderr and one event (the loader and the finder both recorded it)
    failed = [x for x in proc.stderr.splitlines() if x.startswith("importpatch: failed")]
    assert len(failed) == 1, proc.stderr
    lines = [json.loads(x) for f in events.iterdir() for x in f.read_text().splitlines()]
    assert [e["patch"] for e in lines if e["outcome"] == "failed"] == ["bad-resolve"]
    rc, out, _ = ip(lab, "status", "--json", "--events-dir", str(events))
    assert rc == 0
    data = json.loads(out)
    assert data["patches"]["bad-resolve"]["failed"] == 1
    assert data["patches"]["bad-resolve"]["verdict"] == "fail"
    assert list(data["requested"]) == ["bad-resolve"] and data["never_applied"] == ["bad-resolve"]
    assert list(data["defaults_not_applied"]) == ["dflt"]
    assert data["defaults_not_applied"]["dflt"]["fates"] == {"missing": 1}
    rc, text, _ = ip(lab, "status", "--events-dir", str(events))
    requested = text.split("requested but never applied anywhere:")[1]
    before, defaults = requested.split("on by default (not requested), never applied:")
    assert "bad-resolve: failed in 1" in before and "dflt" not in before
    assert "dflt: target module missing in 1" in defaults
    assert "1 failed (fail)" in text


def test_status_counts_a_failure_written_twice_once(lab: Lab, tmp_path: Path) -> None:
    # Event files of an older version held each failure twice: status counts it once.
    events = tmp_path / "events"
    events.mkdir()
    base = {"host": "h", "pid": 7, "ppid": 1, "argv": ["python"], "process": "MainProcess",
            "target": "tpkg.kv", "how": "import", "detail": "symbol 'resolv' not found"}
    rows = [{**base, "time": 1.0, "outcome": "started", "patch": "", "target": "",
             "detail": "1 patch(es) on: bad", "requested": ["bad"], "on": ["bad"]},
            {**base, "time": 2.0, "outcome": "failed", "patch": "bad"},
            {**base, "time": 2.1, "outcome": "failed", "patch": "bad"},
            {**base, "time": 3.0, "outcome": "failed", "patch": "bad", "detail": "another"}]
    (events / "h-7.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    rc, out, _ = ip(lab, "status", "--json", "--events-dir", str(events))
    assert rc == 0
    assert json.loads(out)["patches"]["bad"]["failed"] == 2  # two reasons, two failures
    _, text, _ = ip(lab, "status", "--events-dir", str(events))
    assert text.count("failed bad -> tpkg.kv (import): symbol 'resolv' not found") == 1
    assert "1 process(es), 2 event(s)" in text


def test_a_hidden_binders_warning_says_its_risk_and_what_makes_it_go(lab: Lab) -> None:
    lab.target({"tpkg/worker.py": '''
        class Worker:
            def __init__(self, **kw):
                for k, v in kw.items():
                    setattr(self, k, v)
        '''})
    lab.patch({"w.py": "from importpatch import Patch\n"
                       "Patch('w-add').add('tpkg.worker:Worker.extra', lambda self: 2)\n"})
    rc, out, _ = ip(lab, "check", "--json", "w-add", enable=None)
    assert rc == 0
    (op,) = json.loads(out)["patches"][0]["ops"]
    assert op["status"] == "warn"
    detail = op["detail"]
    assert detail.startswith("setattr() at line 5 may bind names the source does not show: ")
    assert "if it sets 'extra' at run time, the import fails ('extra already exists: use " \
           "replace')" in detail
    assert "an instance attribute" in detail
    assert "it stays a warning (exit status 0) that no option hides" in detail
    assert "if the call never sets 'extra', ignore it" in detail


def test_list_and_check_give_an_in_place_patch_package_one_verdict(lab: Lab) -> None:
    # Issue 36, item 2: list said "error ... so it is not applied" of the blog post's migrated
    # package; check said ok with the in-place warning, and every process applied it.
    install_published(lab)
    env = custom("PriorityScheduler")
    rc, out, _ = ip(lab, "check", "--json", "PriorityScheduler", enable=None, env=env)
    assert rc == 0
    (checked,) = json.loads(out)["patches"]
    rc, out, _ = ip(lab, "list", "--json", enable=None, env=env)
    assert rc == 0
    (listed,) = [p for p in json.loads(out)["patches"] if p["name"] == "PriorityScheduler"]
    assert checked["status"] == listed["verdict"] == "ok"
    assert listed["warnings"] == checked["warnings"]
    assert listed["warnings"][0].startswith("applied in place, not at the definition site")
    _, text, _ = ip(lab, "list", enable=None, env=env)
    block = text.split("PriorityScheduler  on")[1].split("\n\n")[0]
    assert "    warning   applied in place, not at the definition site" in block
    assert "it is not applied" not in block and "error" not in block
    # strict mode refuses in place: fail in both
    strict = {**env, "IMPORTPATCH_STRICT": "1"}
    rc, out, _ = ip(lab, "check", "--json", "PriorityScheduler", enable=None, env=strict)
    assert rc == 1 and json.loads(out)["patches"][0]["status"] == "fail"
    _, out, _ = ip(lab, "list", "--json", enable=None, env=strict)
    (listed,) = [p for p in json.loads(out)["patches"] if p["name"] == "PriorityScheduler"]
    assert listed["verdict"] == "fail" and listed["warnings"] == []


def test_check_does_not_warn_of_dynamo_for_a_custom_op_body(lab: Lab) -> None:
    # Issue 36, item 5: a function vLLM registers as a torch custom op
    # (direct_register_custom_op(op_func=...)) is called by Dynamo as one opaque op, never traced.
    lab.target({
        "vllm/__init__.py": "", "vllm/model_executor/__init__.py": "",
        "vllm/model_executor/layers/__init__.py": "",
        "vllm/model_executor/layers/mixer.py": '''
            from vllm.utils import direct_register_custom_op

            def mixer(x):
                return x

            direct_register_custom_op(op_name="mixer", op_func=mixer)

            def forward_native(x):
                return x
            ''',
    })
    lab.patch({"mix.py": '''
        from importpatch import Patch
        p = Patch("mix")

        @p.replace("vllm.model_executor.layers.mixer:mixer")
        def mixer(x):
            print("custom op body")
            return x

        @p.replace("vllm.model_executor.layers.mixer:forward_native")
        def forward_native(x):
            print("traced")
            return x
        '''})
    rc, out, _ = ip(lab, "check", "--json", "mix", enable=None)
    assert rc == 0
    compiled = [w for w in json.loads(out)["patches"][0]["warnings"] if "Dynamo" in w]
    assert len(compiled) == 1, compiled
    assert compiled[0].startswith("vllm.model_executor.layers.mixer:forward_native runs inside")


def test_the_in_place_warning_names_every_module_that_keeps_the_import(lab: Lab) -> None:
    # Issue 36, item 5: the warning named one of the two modules that import the target.
    install_published(lab)
    init = lab.targets / "vllm_custom_patches" / "__init__.py"
    init.write_text(init.read_text() + "from tpkg.sched import Scheduler as _kept  # another\n")
    env = custom("PriorityScheduler")
    rc, out, _ = ip(lab, "check", "--json", "PriorityScheduler", enable=None, env=env)
    assert rc == 0
    (warning,) = [w for w in json.loads(out)["patches"][0]["warnings"]
                  if w.startswith("applied in place")]
    line = len(init.read_text().splitlines())
    assert "(2 module-level import(s) of it: vllm_custom_patches/__init__.py line " \
           f"{line}, vllm_custom_patches/patches/priority_scheduler.py line " in warning
    assert "; delete every one)" in warning
