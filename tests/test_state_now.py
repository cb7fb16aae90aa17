"""The state now, not only the event at import (issue 36, items 3 and 4).

Item 3: a target attribute that something re-assigned after the patch applied (a
``vllm.general_plugins`` plugin's ``Scheduler.schedule = other``) is "shadowed by <module:qualname
of what is there>": ``importpatch.applied()`` leaves it out and records a ``shadowed`` event, the
exit of the process writes that event to the events folder, ``status`` and ``doctor`` say it.

Item 4: a late activation names what received the original at import and keeps it (a registering
call such as ``direct_register_custom_op(op_func=...)``, a decorator's table, a dict, a list, a
``functools.partial``, a default argument), in a warning event with the fix; strict mode refuses
the patch; enabled at interpreter start the same patch reaches every one of them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from coreutil import Lab

TARGET = {
    "spk/__init__.py": "",
    "spk/sched.py": '''
        class Scheduler:
            def schedule(self):
                return "fcfs"
        ''',
    # What a team keeps while migrating: a vLLM-style general plugin that assigns the method.
    "spk/plugin.py": '''
        def other_schedule(self):
            return "plugin"

        def register():
            from spk.sched import Scheduler
            Scheduler.schedule = other_schedule

        def register_wrapping():  # keeps the patched method and calls it: not shadowed
            from spk.sched import Scheduler
            inner = Scheduler.schedule
            def schedule(self):
                return "around-" + inner(self)
            Scheduler.schedule = schedule
        ''',
    "spk/ops.py": '''
        import functools

        REGISTRY = {}

        def direct_register_custom_op(op_name, op_func, mutates_args=()):
            REGISTRY[op_name] = op_func  # as torch.library keeps the callable it was given

        def register(fn):
            REGISTRY["deco:" + fn.__name__] = fn
            return fn

        def kernel(x):
            return "orig"

        direct_register_custom_op(op_name="kernel", op_func=kernel)
        TABLE = {"k": kernel}
        CHAIN = [kernel]
        BOUND = functools.partial(kernel)

        def call(x, impl=kernel):
            return impl(x)

        @register
        def decorated(x):
            return "orig"

        def unrelated(x):  # nothing copies it: its late patch says nothing
            return "orig"
        ''',
}
PATCHES = {
    "sched.py": '''
        from importpatch import Patch
        Patch("prio").wrap("spk.sched:Scheduler.schedule",
                           lambda w, i, a, k: "prio-" + w(*a, **k))
        ''',
    "ops.py": '''
        from importpatch import Patch
        Patch("kern").replace("spk.ops:kernel", lambda x: "new")
        Patch("deco").replace("spk.ops:decorated", lambda x: "new", decorated=True)
        Patch("plain").replace("spk.ops:unrelated", lambda x: "new")
        ''',
}

pytestmark = pytest.mark.lab(target=TARGET, patch=PATCHES)


def test_applied_tells_a_target_reassigned_after_the_patch_as_shadowed(lab: Lab) -> None:
    out = lab.json('''
        import json
        import importpatch, importpatch.events
        from spk.sched import Scheduler
        import spk.plugin
        before = [Scheduler().schedule(), [e["patch"] for e in importpatch.applied()]]
        spk.plugin.register()  # vLLM's load_general_plugins() runs it after the import
        after = [Scheduler().schedule(), [e["patch"] for e in importpatch.applied()]]
        shadowed = [e for e in importpatch.events.events() if e["outcome"] == "shadowed"]
        importpatch.applied()  # asked again: the same shadowing is one event
        again = [e for e in importpatch.events.events() if e["outcome"] == "shadowed"]
        print(json.dumps([before, after, shadowed, len(again)]))
        ''', enable="prio")
    before, after, shadowed, count = out
    assert before == ["prio-fcfs", ["prio"]]
    assert after == ["plugin", []]
    (event,) = shadowed
    assert count == 1
    assert (event["patch"], event["target"], event["how"]) == (
        "prio", "spk.sched:Scheduler.schedule", "check")
    assert event["detail"].startswith("shadowed by spk.plugin:other_schedule: ")


def test_a_plugin_that_wraps_the_patched_method_does_not_shadow_it(lab: Lab) -> None:
    out = lab.json('''
        import json
        import importpatch, importpatch.events
        from spk.sched import Scheduler
        import spk.plugin
        spk.plugin.register_wrapping()
        print(json.dumps([Scheduler().schedule(), [e["patch"] for e in importpatch.applied()],
                          [e for e in importpatch.events.events()
                           if e["outcome"] == "shadowed"]]))
        ''', enable="prio")
    assert out == ["around-prio-fcfs", ["prio"], []]


def test_exit_writes_the_shadowed_event_and_status_and_doctor_say_it(
    lab: Lab, tmp_path: Path
) -> None:
    events = tmp_path / "events"
    env = {"IMPORTPATCH_EVENTS_DIR": str(events)}
    lab.ok("from spk.sched import Scheduler\nimport spk.plugin\nspk.plugin.register()\n",
           enable="prio", env=env)
    lines = [json.loads(x) for f in events.iterdir() for x in f.read_text().splitlines()]
    (event,) = [e for e in lines if e["outcome"] == "shadowed"]
    assert (event["patch"], event["how"]) == ("prio", "exit")
    assert event["detail"].startswith("shadowed by spk.plugin:other_schedule: ")
    proc = lab.run(["-m", "importpatch", "status", "--json", "--events-dir", str(events)])
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["patches"]["prio"]["shadowed"] == 1
    assert data["patches"]["prio"]["verdict"] == "shadowed"
    assert data["requested"]["prio"]["fates"] == {"shadowed": 1}
    assert data["never_applied"] == ["prio"]
    text = lab.run(["-m", "importpatch", "status", "--events-dir", str(events)]).stdout
    assert "shadowed prio -> spk.sched:Scheduler.schedule (exit): shadowed by " \
           "spk.plugin:other_schedule" in text
    assert "prio: applied, then shadowed in 1" in text
    proc = lab.run(["-m", "importpatch", "doctor", "--json"], enable="prio", env=env)
    warnings = json.loads(proc.stdout)["warnings"]
    assert any(w.startswith("prio -> spk.sched:Scheduler.schedule: shadowed by "
                            "spk.plugin:other_schedule in 1 process(es)") for w in warnings), \
        warnings
    # a process whose target keeps the patch writes no such event
    quiet = tmp_path / "quiet"
    lab.ok("from spk.sched import Scheduler\n", enable="prio",
           env={"IMPORTPATCH_EVENTS_DIR": str(quiet)})
    assert "shadowed" not in "".join(f.read_text() for f in quiet.iterdir())


LATE = '''
    import json, os
    import spk.ops as ops
    os.environ["IMPORTPATCH_PATH"] = {folder!r}
    import importpatch, importpatch.events
    importpatch.enable("kern", "deco", "plain")
    print(json.dumps([[ops.kernel(1), ops.REGISTRY["kernel"](1), ops.TABLE["k"](1),
                       ops.CHAIN[0](1), ops.BOUND(1), ops.call(1),
                       ops.REGISTRY["deco:decorated"](1), ops.unrelated(1)],
                      [[e["outcome"], e["patch"], e["target"], e["how"], e["detail"]]
                       for e in importpatch.events.events()]]))
    '''
AT_START = '''
    import json
    import spk.ops as ops
    print(json.dumps([[ops.kernel(1), ops.REGISTRY["kernel"](1), ops.TABLE["k"](1),
                       ops.CHAIN[0](1), ops.BOUND(1), ops.call(1),
                       ops.REGISTRY["deco:decorated"](1), ops.unrelated(1)], []]))
    '''


def test_late_activation_names_what_it_could_not_reach_and_the_start_reaches_it(lab: Lab) -> None:
    # enabled late: the attribute is patched, the registry, table, list, partial, default
    # argument and the decorator's table keep the original, and each is named
    values, events = lab.json(LATE.format(folder=str(lab.patches)), enable=None,
                              env={"IMPORTPATCH_PATH": None})
    assert values == ["new", "orig", "orig", "orig", "orig", "orig", "orig", "new"]
    warned = {e[1]: e[4] for e in events if e[3] == "unreached"}
    assert set(warned) == {"kern", "deco"}  # nothing copied `unrelated`: no word about it
    kern = warned["kern"]
    assert "spk.ops line 16: the call direct_register_custom_op(...), which registered it as " \
           "the torch custom op torch.ops.vllm.kernel" in kern
    for place in ("spk.ops:REGISTRY['kernel'] (a dict entry)",
                  "spk.ops:TABLE['k'] (a dict entry)", "spk.ops:CHAIN[0] (a list item)",
                  "spk.ops:BOUND (a functools.partial of it)", "spk.ops:call (a default argument)"):
        assert place in kern
    assert kern.endswith("enable the patch at interpreter start (IMPORTPATCH_ENABLE in the "
                         "environment), where it lands before the module runs and every one "
                         "of these gets the patched object")
    assert "spk.ops:REGISTRY['deco:decorated'] (a dict entry)" in warned["deco"]
    assert warned["deco"].endswith("with decorated=False: decorated=True puts the patch outside "
                                   "@register, which keeps what it was given at interpreter "
                                   "start too")
    assert [e[0] for e in events if e[1] == "kern" and e[3] == "in-place"] == ["applied"]
    # strict mode: refused, all of the patch; the patch nothing copied still applies
    values, events = lab.json(LATE.format(folder=str(lab.patches)), enable=None,
                              env={"IMPORTPATCH_PATH": None, "IMPORTPATCH_STRICT": "1"})
    assert values == ["orig"] * 7 + ["new"]
    failed = {e[1]: e[4] for e in events if e[0] == "failed"}
    assert set(failed) == {"kern", "deco"}
    assert failed["kern"].endswith("(IMPORTPATCH_STRICT=1 refuses such a patch late)")
    # at interpreter start the same patches reach every one of them, without a word (but the
    # table @register filled: decorated=True is outside it, as the warning said)
    values, _ = lab.json(AT_START, enable="kern,deco,plain")
    assert values == ["new"] * 6 + ["orig", "new"]
    proc = lab.ok("import spk.ops", enable="kern,deco,plain")
    assert "unreached" not in proc.stderr and "warning" not in proc.stderr
