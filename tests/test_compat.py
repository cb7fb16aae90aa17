"""importpatch.integrations.compat: the VLLMPatch API of vLLM's plugin-system blog post, on
throwaway targets (tests/test_vllm_compat.py does the same on real vLLM).

The patch package is laid out as in the post (tests/blogpkg.py: PatchManager, register_patches,
one module per patch class) and installed as a real distribution with its entry points; every
check runs in a fresh interpreter of the project's wheel venv."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from blogpkg import PACKAGE, entry_points, files
from coreutil import EVENTS, Lab, install_dist

TARGET = {
    "tpkg/__init__.py": "",
    "tpkg/sched.py": '''
        class Scheduler:
            def schedule(self):
                return "fcfs"

        class AsyncScheduler(Scheduler):  # made at import: must inherit the patched method
            pass
        ''',
    "tpkg/kv.py": '''
        def resolve(x):
            return ["orig", x]
        ''',
    "tpkg/core.py": '''
        from tpkg.kv import resolve  # the by-name copy a late monkeypatch misses

        def run(x):
            return resolve(x)
        ''',
}

pytestmark = pytest.mark.lab(target=TARGET)

STRING_TARGETS = {
    "priority_scheduler": ("PriorityScheduler", "PrioritySchedulerPatch", '''
        {IMPORT}


        class PrioritySchedulerPatch(VLLMPatch["tpkg.sched:Scheduler"]):
            """Priority first."""

            def schedule_with_priority(self):
                return "priority"

            def schedule(self):
                return "patched:" + self.schedule_with_priority()
        '''),
    "kv_block_sizes": ("KVBlockSizes", "KVBlockSizesPatch", '''
        {IMPORT}


        class KVBlockSizesPatch(VLLMPatch["tpkg.kv"]):
            def resolve(x):
                return ["patched", x]
        '''),
}

OBJECT_TARGETS = {
    "priority_scheduler": ("PriorityScheduler", "PrioritySchedulerPatch", '''
        {IMPORT}
        from tpkg.sched import Scheduler


        class PrioritySchedulerPatch(VLLMPatch[Scheduler]):
            def schedule(self):
                return "patched:priority"
        '''),
    "kv_block_sizes": ("KVBlockSizes", "KVBlockSizesPatch", '''
        {IMPORT}
        from tpkg import kv

        _vanilla_resolve = kv.resolve  # the post's way to keep the original at hand


        class KVBlockSizesPatch(VLLMPatch[kv]):
            def resolve(x):
                return ["patched", _vanilla_resolve(x)]
        '''),
}

# What a child reports: results of the targets, and importpatch's events of that process.
READ = f'''
import json, sys, importpatch.events
import tpkg.core, tpkg.sched
def report(tag):
    return [tag, tpkg.core.run(1), tpkg.sched.AsyncScheduler().schedule(), {EVENTS}]
'''


def install(lab: Lab, patches: dict, *, entry_point: bool) -> None:
    pkg = {k: v for k, v in files(patches, compat=True, entry_point=entry_point,
                                  vllm_core=False).items() if k != "setup.py"}
    install_dist(lab.venv, lab.targets, "vllm-custom-patches", "0.1.0", pkg,
                 entry_points=entry_points(entry_point=entry_point), top_level=[PACKAGE])


def custom(names: str, **extra: str | None) -> dict[str, str | None]:
    """Only the post's variable switches patches on (IMPORTPATCH_ENABLE unset)."""
    return {"VLLM_CUSTOM_PATCHES": names, **extra}


def test_api_is_the_posts_and_a_string_target_imports_nothing(lab: Lab) -> None:
    out = lab.json('''
        import json, sys
        from importpatch.compat import VLLMPatch, min_vllm_version, PatchManager
        errors = []
        for make in (lambda: type("Loose", (VLLMPatch,), {}), lambda: VLLMPatch[42],
                     VLLMPatch.apply, lambda: VLLMPatch["not a target!"],
                     lambda: min_vllm_version("zero point nine")):
            try:
                make()
            except (TypeError, ValueError) as exc:
                errors.append(f"{type(exc).__name__}: {exc}")

        class P(VLLMPatch["tpkg.sched:Scheduler"]):
            def added(self):
                return 1

        class M(VLLMPatch["tpkg.kv|tpkg.old_kv"]):
            pass

        print(json.dumps([errors, P.__mro__[1].__name__, M.__mro__[1].__name__,
                          "tpkg.sched" in sys.modules, "tpkg" in sys.modules]))
        ''', enable=None)
    assert out[0][:3] == [
        "TypeError: Loose must be defined as VLLMPatch[Target]",
        "TypeError: Can only patch classes or modules, not <class 'int'>",
        "TypeError: Cannot apply base VLLMPatch class directly",
    ]
    assert out[0][3].startswith("DeclarationError: target 'not a target!'")
    assert out[0][4] == "InvalidVersion: Invalid version: 'zero point nine'"  # at declaration
    assert out[1:] == ["VLLMPatch[Scheduler]", "VLLMPatch[tpkg.kv]", False, False]


def test_entry_point_names_patches_as_registered_and_vllm_custom_patches_lands_them_at_start(
    lab: Lab,
) -> None:
    install(lab, STRING_TARGETS, entry_point=True)
    out = lab.json(READ + f'''
first = report("start")
import {PACKAGE}
{PACKAGE}.register_patches()  # what vLLM's load_general_plugins() does later
print(json.dumps([first, report("plugin"), {PACKAGE}.manager.applied_patches]))
''', enable=None, env=custom("PriorityScheduler,KVBlockSizes"))
    first, after_plugin, applied = out
    assert first[1:3] == [["patched", 1], "patched:priority"]
    assert sorted(first[3]) == [
        ["applied", "KVBlockSizes", "tpkg.kv:resolve", "definition-site"],
        ["applied", "PriorityScheduler", "tpkg.sched:Scheduler.schedule", "definition-site"],
        ["applied", "PriorityScheduler", "tpkg.sched:Scheduler.schedule_with_priority",
         "definition-site"],
    ]
    assert after_plugin[3] == first[3]  # apply() from the plugin applied nothing twice
    assert applied[-2:] == ["PriorityScheduler", "KVBlockSizes"]
    listed = json.loads(lab.ok(["-m", "importpatch", "list", "--json"], enable=None,
                               env=custom("KVBlockSizes")).stdout)["patches"]
    by_name = {p["name"]: p for p in listed if p["origin"] == "entry-point"}
    assert set(by_name) == {"PriorityScheduler", "KVBlockSizes"}
    assert by_name["KVBlockSizes"]["enabled"] and not by_name["PriorityScheduler"]["enabled"]
    assert by_name["KVBlockSizes"]["why"] == "named in VLLM_CUSTOM_PATCHES"
    assert by_name["PriorityScheduler"]["kinds"] == ["set"]
    assert by_name["PriorityScheduler"]["doc"] == "Priority first."


def test_register_patches_runs_once_per_process_with_string_targets(
    lab: Lab, tmp_path: Path,
) -> None:
    # importpatch called the entry point's register_patches to find the classes when a target
    # was imported, and vLLM's load_general_plugins called it again: the user's code ran twice
    # and their own PatchManager listed every patch twice. It runs once, vLLM's call.
    pkg = {k: v for k, v in files(STRING_TARGETS, compat=True, entry_point=True,
                                  vllm_core=False).items() if k != "setup.py"}
    init = f"{PACKAGE}/__init__.py"
    pkg[init] = pkg[init].replace("    manager.apply_from_env()", (
        '    open(os.environ["REGISTER_LOG"], "a").write(f"{os.getpid()}\\n")\n'
        "    manager.apply_from_env()"))
    install_dist(lab.venv, lab.targets, "vllm-custom-patches", "0.1.0", pkg,
                 entry_points=entry_points(entry_point=True), top_level=[PACKAGE])
    log = tmp_path / "register.log"
    env = custom("PriorityScheduler,KVBlockSizes", REGISTER_LOG=str(log))
    for start in ("cold", "warm"):  # the first process builds the index
        out = lab.json(READ + f'''
import os
first = report("start")
import {PACKAGE}
{PACKAGE}.register_patches()  # what vLLM's load_general_plugins() does
print(json.dumps([first, report("plugin"), {PACKAGE}.manager.applied_patches, os.getpid()]))
''', enable=None, env=env)
        first, after_plugin, applied, pid = out
        assert first[1:3] == [["patched", 1], "patched:priority"], start
        assert after_plugin[3] == first[3]
        assert log.read_text().split().count(str(pid)) == 1, (start, log.read_text())
        assert applied == ["PriorityScheduler", "KVBlockSizes"], start


def test_a_string_target_the_package_also_imports_lands_in_place_with_the_exact_fix(
    lab: Lab,
) -> None:
    # The post's modules after the migration, their imports of the targets kept: those patches
    # failed closed (the import of tpkg.sched raised). They land in place right after their
    # module ran, before its import returns (tpkg.core's later `from tpkg.kv import resolve`
    # copy sees the patch; AsyncScheduler inherits it), with one warning naming the package and
    # the fix; `list` still shows the fix. Other patches on the module land at the definition site.
    name, cls, text = STRING_TARGETS["priority_scheduler"]
    kv_name, kv_cls, kv_text = STRING_TARGETS["kv_block_sizes"]
    patches = dict(STRING_TARGETS, priority_scheduler=(name, cls, text.replace(
        "{IMPORT}", "{IMPORT}\n        from tpkg.sched import Scheduler")),
        kv_block_sizes=(kv_name, kv_cls, kv_text.replace(
            "{IMPORT}", "{IMPORT}\n        from tpkg.kv import resolve")))
    install(lab, patches, entry_point=True)
    lab.patch({"other.py": "from importpatch import Patch\n"
                           "Patch('other').add('tpkg.sched:Scheduler.other', 1)\n"})
    listed = json.loads(lab.ok(["-m", "importpatch", "list", "--json"], enable=None).stdout)
    errors = {p["name"]: p["error"] for p in listed["patches"] if p["origin"] == "entry-point"}
    assert "from tpkg.sched import ...`" in errors["PriorityScheduler"]
    assert "VLLMPatch['tpkg.sched:Scheduler']" in errors["PriorityScheduler"]
    for start in ("cold", "warm"):
        proc = lab.ok(READ + 'print(json.dumps(report("x")))', enable="other",
                      env=custom("PriorityScheduler,KVBlockSizes"))
        out = json.loads(proc.stdout.splitlines()[-1])
        assert out[1:3] == [["patched", 1], "patched:priority"], (start, proc.stderr)
        assert sorted(e for e in out[3] if e[0] != "info") == [
            ["applied", "KVBlockSizes", "tpkg.kv:resolve", "in-place"],
            ["applied", "PriorityScheduler", "tpkg.sched:Scheduler.schedule", "in-place"],
            ["applied", "PriorityScheduler", "tpkg.sched:Scheduler.schedule_with_priority",
             "in-place"],
            ["applied", "other", "tpkg.sched:Scheduler.other", "definition-site"],
        ], start
        (warning,) = [w for w in proc.stderr.splitlines() if "applied in place" in w]
        assert (f"patch package entry point custom_patches = {PACKAGE}:register_patches "
                "imports tpkg.") in warning
        assert "'pkg.mod:Name.attr'" in warning and "registries, subclasses" in warning
    # A patch refused in place (here: it would drop another patch's wrap landed at the
    # definition site) fails the import closed, naming the package.
    lab.patch({"other.py": "from importpatch import Patch\n"
                           "Patch('other').wrap('tpkg.sched:Scheduler.schedule',\n"
                           "    lambda w, i, a, k: 'other:' + w(*a, **k))\n"})
    proc = lab.run("import tpkg.sched", enable="other", env=custom("PriorityScheduler"))
    assert proc.returncode != 0, proc.stderr
    assert f"applied in place because entry point custom_patches = {PACKAGE}:" in proc.stderr


def test_importpatch_enable_works_the_same_and_unknown_custom_names_are_not_warned(
    lab: Lab,
) -> None:
    install(lab, STRING_TARGETS, entry_point=True)
    proc = lab.ok(READ + 'print(json.dumps(report("x")))', enable="KVBlockSizes",
                  env={"VLLM_CUSTOM_PATCHES": "SomethingElse"})
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out[1:3] == [["patched", 1], "fcfs"]
    # The post's own manager logs "Unknown patch: SomethingElse" (its business); importpatch
    # does not warn about a name it was never meant to know.
    assert not [line for line in proc.stderr.splitlines() if line.startswith("importpatch:")]


def test_vllm_custom_patches_alone_lands_them_at_start_in_every_process(lab: Lab) -> None:
    install(lab, STRING_TARGETS, entry_point=True)
    bare = custom("KVBlockSizes", IMPORTPATCH_PATH=None, IMPORTPATCH_CACHE_DIR=None)
    for _ in range(2):  # the first process builds the index, the second starts from it
        out = lab.json(READ + 'print(json.dumps(report("x")))', enable=None, env=bare)
        assert out[1] == ["patched", 1]
        assert out[3] == [["applied", "KVBlockSizes", "tpkg.kv:resolve", "definition-site"]]


def test_object_targets_are_patched_in_place_by_apply_with_copies_rebound(lab: Lab) -> None:
    install(lab, OBJECT_TARGETS, entry_point=True)
    out = lab.json(READ + f'''
first = report("start")
import {PACKAGE}
{PACKAGE}.register_patches()
second = report("plugin")
{PACKAGE}.register_patches()  # loaded twice (vLLM warns plugins may be): still applied once
import tpkg.kv
print(json.dumps([first, second, report("again"), tpkg.kv._applied_patches]))
''', enable=None, env=custom("PriorityScheduler,KVBlockSizes"))
    first, second, again, record = out
    # Enabled at start, but an object target is never landed at import (its declaration
    # imports it): the import did not fail and nothing was patched before apply().
    assert first[1:] == [["orig", 1], "fcfs", []]
    # The copy in tpkg.core is re-bound; the original the patch module saved is not (re-binding
    # it too would make the replacement call itself).
    assert second[1:3] == [["patched", ["orig", 1]], "patched:priority"]
    # Re-binding: the copy of the function; a class patched in place is the same object.
    assert {(e[1], e[3]) for e in second[3]} == {
        ("KVBlockSizes", "in-place"), ("PriorityScheduler", "in-place"),
        ("KVBlockSizes", "rebind"),
    }
    assert again[3] == second[3]
    assert record == {"resolve": "KVBlockSizesPatch"}


def test_check_and_doctor_suggest_the_string_form_for_object_targets(lab: Lab) -> None:
    install(lab, OBJECT_TARGETS, entry_point=True)
    env = custom("KVBlockSizes")
    report = json.loads(lab.run(["-m", "importpatch", "check", "--json", "KVBlockSizes"],
                                enable=None, env=env).stdout)
    (patch,) = report["patches"]
    assert patch["status"] == "ok" and report["exit_status"] == 0
    (op,) = patch["ops"]
    assert op["status"] == "warn" and op["target"] == "tpkg.kv:resolve"
    assert "write VLLMPatch['tpkg.kv'] to land it there" in op["detail"]
    doctor = json.loads(lab.run(["-m", "importpatch", "doctor", "--json"], enable=None,
                                env=env).stdout)
    assert any("KVBlockSizes" in w and "VLLMPatch['tpkg.kv']" in w for w in doctor["warnings"])
    assert doctor["env"]["VLLM_CUSTOM_PATCHES"] == "KVBlockSizes"


def test_without_the_entry_point_apply_still_patches_copies_and_later_imports(lab: Lab) -> None:
    install(lab, STRING_TARGETS, entry_point=False)
    out = lab.json(f'''
import json, sys, importpatch.events
import tpkg.core  # imported before the plugin ran: patched in place, its copy re-bound
import {PACKAGE}
{PACKAGE}.register_patches()
import tpkg.sched  # imported after: lands at the definition site, subclasses inherit
print(json.dumps([tpkg.core.run(1), tpkg.sched.AsyncScheduler().schedule(),
                  sorted({{(e[1], e[3]) for e in {EVENTS}}})]))
''', enable=None, env=custom("PriorityScheduler,KVBlockSizes"))
    assert out[:2] == [["patched", 1], "patched:priority"]
    assert out[2] == [["KVBlockSizes", "in-place"], ["KVBlockSizes", "rebind"],
                      ["PriorityScheduler", "definition-site"]]


CONFLICTING = {
    "a": ("A", "APatch", '''
        {IMPORT}


        class APatch(VLLMPatch["tpkg.sched:Scheduler"]):
            def schedule(self):
                return "a"
        '''),
    "b": ("B", "BPatch", '''
        {IMPORT}


        class BPatch(VLLMPatch["tpkg.sched:Scheduler"]):
            def schedule(self):
                return "b"

            def only_b(self):
                return "b"
        '''),
}


def test_two_patches_setting_one_attribute_raise_the_posts_error_and_apply_nothing(
    lab: Lab,
) -> None:
    install(lab, CONFLICTING, entry_point=False)
    out = lab.json(f'''
import json, logging, io
stream = io.StringIO()
logging.basicConfig(stream=stream, level=logging.ERROR)
import {PACKAGE}, tpkg.sched
{PACKAGE}.register_patches()
print(json.dumps([{PACKAGE}.manager.applied_patches, tpkg.sched.Scheduler().schedule(),
                  hasattr(tpkg.sched.Scheduler, "only_b"), stream.getvalue()]))
''', enable=None, env=custom("A,B"))
    assert out[:3] == [["A"], "a", False]
    assert "Failed to apply B: Scheduler.schedule already patched by APatch" in out[3]


def test_two_patches_setting_one_attribute_at_the_definition_site_fail_the_import(
    lab: Lab,
) -> None:
    install(lab, CONFLICTING, entry_point=True)
    proc = lab.run("import tpkg.sched", enable=None, env=custom("A,B"))
    assert proc.returncode == 1
    assert "conflict: patches 'A' and 'B' both set Scheduler.schedule" in proc.stderr


def test_min_vllm_version_skips_with_the_posts_warning_at_start_and_in_apply(lab: Lab) -> None:
    install_dist(lab.venv, lab.targets, "vllm", "0.32.0",
                 {"vllm/__init__.py": '__version__ = "0.32.0"\n'}, top_level=["vllm"])
    patches = {
        "old": ("Old", "OldPatch", '''
            {IMPORT}


            @min_vllm_version("0.9.1")
            class OldPatch(VLLMPatch["tpkg.kv"]):
                def resolve(x):
                    return ["old", x]
            '''),
        "future": ("Future", "FuturePatch", '''
            {IMPORT}


            @min_vllm_version("0.40")
            class FuturePatch(VLLMPatch["tpkg.sched:Scheduler"]):
                def schedule(self):
                    return "future"
            '''),
    }
    install(lab, patches, entry_point=True)
    out = lab.json(READ + f'''
import logging, io
stream = io.StringIO()
logging.basicConfig(stream=stream, level=logging.WARNING)
import vllm, {PACKAGE}
{PACKAGE}.register_patches()
r = report("x")
# (vllm-compile-cache-key is on by default where a vllm package is: this stub has no vllm.envs)
print(json.dumps([r[1], r[2], sorted({{(e[0], e[1]) for e in r[3]
                                       if e[1] != "vllm-compile-cache-key"}}), stream.getvalue(),
                  [e["detail"] for e in importpatch.events.events() if e["outcome"] == "skipped"]]))
''', enable=None, env=custom("Old,Future"))
    assert out[:3] == [["old", 1], "fcfs", [["applied", "Old"], ["skipped", "Future"]]]
    assert "Skipping FuturePatch: requires vLLM >= 0.40, but found 0.32.0" in out[3]
    assert out[4] == ["requires vllm>=0.40, installed vllm 0.32.0"]


def test_set_adds_names_the_module_does_not_define_and_members_a_class_only_inherits(
    lab: Lab,
) -> None:
    patches = {
        "adds": ("Adds", "AddsPatch", '''
            {IMPORT}


            class AddsPatch(VLLMPatch["tpkg.kv"]):
                LIMIT = 7

            class SubPatch(VLLMPatch["tpkg.sched:AsyncScheduler"]):
                def schedule(self):
                    return "async only"
            '''),
    }
    install(lab, patches, entry_point=True)
    check = json.loads(lab.run(["-m", "importpatch", "check", "--json"], enable=None,
                               env=custom("Adds")).stdout)
    ops = {op["target"]: op for p in check["patches"] for op in p["ops"]}
    assert ops["tpkg.kv:LIMIT"]["status"] == "ok"
    assert ops["tpkg.kv:LIMIT"]["detail"] == "LIMIT is not there yet: set adds it"
    out = lab.json('''
        import json, tpkg.kv, tpkg.sched
        print(json.dumps([tpkg.kv.LIMIT, tpkg.sched.AsyncScheduler().schedule(),
                          tpkg.sched.Scheduler().schedule()]))
        ''', enable="Adds,SubPatch")
    assert out == [7, "async only", "fcfs"]


def test_compat_patch_manager_names_and_applies_like_the_posts(lab: Lab) -> None:
    out = lab.json(f'''
import json, logging, io, sys, importpatch.events
stream = io.StringIO()
logging.basicConfig(stream=stream, level=logging.INFO)
from importpatch.compat import PatchManager, VLLMPatch

class KV(VLLMPatch["tpkg.kv"]):
    def resolve(x):
        return ["managed", x]

manager = PatchManager()
manager.register("Managed", KV)
manager.apply_from_env()  # VLLM_CUSTOM_PATCHES="Managed,Nope"
import tpkg.core  # imported after apply(): lands at the definition site
print(json.dumps([tpkg.core.run(1), manager.applied_patches, manager.apply_patch("Nope"),
                  {EVENTS}, stream.getvalue().splitlines()]))
''', enable=None, env=custom("Managed,Nope"))
    assert out[0] == ["managed", 1]
    assert out[1:3] == [["Managed"], False]
    assert out[3] == [["applied", "Managed", "tpkg.kv:resolve", "definition-site"]]
    logged = [line.split(":", 2)[-1] for line in out[4]]
    assert "Registered patch: Managed" in logged and "Unknown patch: Nope" in logged
    assert "Successfully applied: ['Managed']" in logged


def test_a_name_registered_again_names_only_the_class_registered_last(lab: Lab) -> None:
    # The post's PatchManager keeps a dict: registering a name again replaces the class, and
    # apply_from_env() applies only the last one. importpatch named both classes after it, so at
    # interpreter start both were on under one name ("declared 2 times", no warning at run time).
    pkg = {"dupes/__init__.py": '''
        from importpatch.compat import PatchManager, VLLMPatch

        class First(VLLMPatch["tpkg.sched:Scheduler"]):
            def schedule(self):
                return "first"

        class Second(VLLMPatch["tpkg.sched:Scheduler"]):
            def extra(self):
                return "second"

        manager = PatchManager()

        def register_patches():
            manager.register("Prio", First)
            manager.register("Prio", Second)
        '''}
    install_dist(lab.venv, lab.targets, "dupes", "0.1.0", pkg, top_level=["dupes"],
                 entry_points="[importpatch.patches]\ndupes = dupes:register_patches\n")
    proc = lab.ok('''
        import json, tpkg.sched
        from importpatch.compat import name_of
        import dupes
        s = tpkg.sched.Scheduler()
        print(json.dumps([s.schedule(), getattr(s, "extra", lambda: None)(),
                          name_of(dupes.First), name_of(dupes.Second)]))
        ''', enable=None, env=custom("Prio"))
    assert json.loads(proc.stdout.splitlines()[-1]) == ["fcfs", "second", "First", "Prio"]
    assert "declared 2 times" not in proc.stderr


def test_apply_that_importpatch_refuses_in_place_fails_as_the_post_reports_failures(
    lab: Lab,
) -> None:
    # A wrap landed at import (IMPORTPATCH_ENABLE); the post's object-target patch then sets the
    # same method late. importpatch refuses that (it would drop the wrap): apply() must say so
    # as the post's apply() does, not log "✓" with nothing applied.
    install(lab, OBJECT_TARGETS, entry_point=False)  # with it, "trace" is refused (Limits)
    lab.patch({"trace.py": '''
        from importpatch import Patch

        @Patch("trace").wrap("tpkg.sched:Scheduler.schedule")
        def trace(wrapped, instance, args, kwargs):
            return "trace(" + wrapped(*args, **kwargs) + ")"
        '''})
    out = lab.json(f'''
import json, logging, io
stream = io.StringIO()
logging.basicConfig(stream=stream, level=logging.INFO)
import tpkg.sched, {PACKAGE}
{PACKAGE}.register_patches()
print(json.dumps([{PACKAGE}.manager.applied_patches, tpkg.sched.Scheduler().schedule(),
                  stream.getvalue()]))
''', enable="trace", env=custom("PriorityScheduler"))
    applied, schedule, logged = out
    assert "PriorityScheduler" not in applied and schedule == "trace(fcfs)"
    assert "✓ PrioritySchedulerPatch" not in logged
    assert "Failed to apply PriorityScheduler: " in logged
    assert "already wrapped by 'trace'" in logged


# -- The post's package as published, migrated as docs/migration.md says ---------------------------


def install_published(lab: Lab, *, local_manager: bool = False) -> None:
    from blogpkg import changed_lines, migrate, published

    before = published("tpkg.sched", "Scheduler", vllm_core=False, local_manager=local_manager,
                       log='        output = "priority:" + output\n')
    after = migrate(before, "tpkg.sched", "Scheduler")
    install_dist(lab.venv, lab.targets, "vllm", "0.32.0",  # for the post's @min_vllm_version
                 {"vllm/__init__.py": '__version__ = "0.32.0"\n'}, top_level=["vllm"])
    assert changed_lines(before, after) == (2, 3)  # two lines changed, one added (setup.py)
    install_dist(lab.venv, lab.targets, "vllm-custom-patches", "0.1.0",
                 {k: v for k, v in after.items() if k != "setup.py"},
                 entry_points=entry_points(entry_point=True), top_level=[PACKAGE])


PLUGIN_FIRST = f'''
import json, logging, io, importpatch.events
stream = io.StringIO()
logging.basicConfig(stream=stream, level=logging.INFO)
import {PACKAGE}
{PACKAGE}.register_patches()  # vLLM's load_general_plugins(): its module imports tpkg.sched
import tpkg.sched
from {PACKAGE}.patches import priority_scheduler as mod
print(json.dumps([[tpkg.sched.Scheduler().schedule(), tpkg.sched.AsyncScheduler().schedule(),
                   mod._original_schedule(tpkg.sched.Scheduler())], {EVENTS},
                  stream.getvalue().splitlines()]))
'''

TARGET_FIRST = f'''
import json, logging, io, importpatch.events
stream = io.StringIO()
logging.basicConfig(stream=stream, level=logging.INFO)
import tpkg.sched  # EngineCore: vLLM imports the scheduler, then loads its plugins
at_import = [tpkg.sched.Scheduler().schedule(), {EVENTS}]
import {PACKAGE}
{PACKAGE}.register_patches()
from {PACKAGE}.patches import priority_scheduler as mod
print(json.dumps([[at_import[0], tpkg.sched.AsyncScheduler().schedule(),
                   mod._original_schedule(tpkg.sched.Scheduler())], at_import[1], {EVENTS},
                  stream.getvalue().splitlines()]))
'''

IN_PLACE = [
    ["applied", "PriorityScheduler", "tpkg.sched:Scheduler.schedule", "in-place"],
    ["applied", "PriorityScheduler", "tpkg.sched:Scheduler.schedule_with_priority", "in-place"],
]


@pytest.mark.parametrize("manager", ["module-level", "function-local"])
def test_the_posts_package_as_published_migrates_in_three_lines_and_lands_in_place(
    lab: Lab, manager: str,
) -> None:
    # The post's layout kept: `from tpkg.sched import Scheduler` and `_original_schedule =
    # Scheduler.schedule` at module level, a class patch calling it, its PatchManager. Before:
    # when the plugin's own import of the patch module was the first import of the target, the
    # in-place landing imported that half-run module again and the target's import failed
    # ("partially initialized module ... most likely due to a circular import"); with the
    # manager made inside register_patches() the names were lost and the patch applied late.
    install_published(lab, local_manager=manager == "function-local")
    env = custom("PriorityScheduler")
    patched = ["priority:fcfs", "priority:fcfs", "fcfs"]  # the saved original stays the original
    for start in ("cold", "warm"):  # the first process builds the index
        proc = lab.ok(PLUGIN_FIRST, enable=None, env=env)
        results, events, logged = json.loads(proc.stdout.splitlines()[-1])
        assert results == patched, (start, proc.stderr)
        assert sorted(e for e in events if e[0] == "applied") == IN_PLACE, start
        assert not [x for x in logged if "Unknown patch" in x or "Failed to apply" in x], logged
        assert "INFO:vllm_custom_patches:Successfully applied: ['PriorityScheduler']" in logged
        warnings = [x for x in proc.stderr.splitlines() if x.startswith("importpatch:")]
        assert len(warnings) <= 1, warnings
        # The target imported first (vLLM's EngineCore): applied at its import, before the
        # plugin ran, so before any later import copies or subclasses it.
        proc = lab.ok(TARGET_FIRST, enable=None, env=env)
        results, at_import, events, logged = json.loads(proc.stdout.splitlines()[-1])
        assert results == patched, (start, proc.stderr)
        assert sorted(e for e in at_import if e[0] == "applied") == IN_PLACE, start
        assert sorted(e for e in events if e[0] == "applied") == IN_PLACE, start
        assert not [x for x in logged if "Unknown patch" in x or "Failed to apply" in x], logged
        warnings = [x for x in proc.stderr.splitlines() if x.startswith("importpatch:")]
        assert len(warnings) <= 1, warnings


def test_check_and_doctor_say_the_posts_migrated_package_applies_in_place_and_which_line(
    lab: Lab,
) -> None:
    # Before: check said FAIL ("the declaration does not load: ... it is not applied. Move the
    # import ...") and doctor "cannot apply here", while every process applied it in place.
    install_published(lab)
    env = custom("PriorityScheduler")
    proc = lab.run(["-m", "importpatch", "check", "--json", "PriorityScheduler"], enable=None,
                   env=env)
    report = json.loads(proc.stdout)
    assert proc.returncode == 0 and report["exit_status"] == 0, proc.stdout
    (patch,) = report["patches"]
    assert patch["status"] == "ok"
    (note,) = patch["warnings"]
    assert note.startswith("applied in place, not at the definition site: entry point "
                           f"custom_patches = {PACKAGE}:register_patches imports tpkg.sched")
    assert "delete the module-level `from tpkg.sched import ...`" in note
    assert "VLLMPatch['tpkg.sched:Scheduler']" in note
    doctor = json.loads(lab.run(["-m", "importpatch", "doctor", "--json"], enable=None,
                                env=env).stdout)
    assert f"patch PriorityScheduler: {note}" in doctor["warnings"]
    assert not [p for p in doctor["problems"] if "PriorityScheduler" in p], doctor["problems"]
    strict = lab.run(["-m", "importpatch", "check", "PriorityScheduler"], enable=None,
                     env={**env, "IMPORTPATCH_STRICT": "1"})
    assert strict.returncode == 1  # strict mode refuses in place: the import fails closed
