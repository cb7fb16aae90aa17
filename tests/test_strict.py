"""Strict mode (IMPORTPATCH_STRICT): a typo in IMPORTPATCH_ENABLE or a broken enabled patch stops
the program at the first import of a package that a known patch targets, with the warning's
message; never at interpreter start; at a late activation (enable(), vLLM's plugin hook) right
there. Without it: a warning, and the program runs unpatched (as before). Real child
interpreters of the wheel's venv."""

from __future__ import annotations

import json
import os

import pytest
from coreutil import Lab

TARGETS = {
    "tpkg/__init__.py": "LOADED = True\n",
    "tpkg/mod.py": 'def one():\n    return "orig"\n',
    "wpkg/__init__.py": "",
    "wpkg/mod.py": 'def f():\n    return "orig"\n',
}
PATCHES = {
    "ones.py": '''
        from importpatch import Patch
        Patch("p-one").replace("tpkg.mod:one", lambda: "patched")
        ''',
}

pytestmark = pytest.mark.lab(target=TARGETS, patch=PATCHES)

STRICT = {"IMPORTPATCH_STRICT": "1"}
# The process starts, says so, then imports the targeted package.
READ = "print('started', flush=True)\nimport tpkg.mod\nprint(tpkg.mod.one())"
CATCH = '''
import importlib.util, json, sys
print('started', flush=True)
probe = importlib.util.find_spec("tpkg") is not None  # a probe is not an import: answered
try:
    import tpkg.mod
except ImportError as exc:
    print(json.dumps([type(exc).__name__, str(exc), probe, "tpkg" in sys.modules]))
'''


def unknown_warning(name: str) -> str:
    return f"unknown patch name(s) {name} in IMPORTPATCH_ENABLE; known: "


def test_without_strict_a_typo_warns_and_the_program_runs_unpatched(lab: Lab) -> None:
    proc = lab.ok(READ, enable="p-onee")
    assert proc.stdout.split() == ["started", "orig"]
    assert f"importpatch: warning: {unknown_warning('p-onee')}" in proc.stderr


@pytest.mark.parametrize("spelling", ["IMPORTPATCH_STRICT", "VLLM_IMPORTPATCH_STRICT"])
def test_strict_typo_stops_the_import_of_a_targeted_package_with_the_warnings_message(
    lab: Lab, spelling: str
) -> None:
    proc = lab.run(READ, enable="p-onee", env={spelling: "1"})
    assert proc.returncode == 1
    assert proc.stdout.split() == ["started"]  # not at interpreter start
    warning = next(line for line in proc.stderr.splitlines() if "warning" in line)
    message = warning.removeprefix("importpatch: warning: ")
    assert message.startswith(unknown_warning("p-onee"))
    last = proc.stderr.strip().splitlines()[-1]
    assert last == ("importpatch.strict.StrictError: importpatch: "
                    f"{message} (IMPORTPATCH_STRICT is on: stopped at the import of tpkg)"), last

    name, text, probe, loaded = lab.json(CATCH, enable="p-onee", env={spelling: "1"})
    assert (name, probe, loaded) == ("StrictError", True, False)  # nothing of tpkg ran
    assert message in text and "PatchError" not in text


def test_strict_never_stops_a_process_that_imports_no_targeted_package(lab: Lab) -> None:
    # An unknown name's targets are unknown: any package outside the standard library may be
    # one (tests/test_accounting.py); the standard library, pip and importpatch still run.
    for args in ("import json, csv; print('ok')", ["-m", "pip", "--version"],
                 ["-m", "importpatch", "list"]):
        proc = lab.ok(args, enable="p-onee", env=STRICT)
        assert "p-onee" in proc.stderr  # the warning still says what is wrong
    # A broken patch whose targets are known stops only those (tpkg), not wpkg.
    lab.patch({"raising.py": '''
        from importpatch import Patch
        Patch("raising").replace("tpkg.mod:one", lambda: "patched")
        raise RuntimeError("boom at declaration time")
        '''})
    assert lab.ok("import json, wpkg.mod; print('ok')", enable="raising",
                  env=STRICT).stdout == "ok\n"


def test_strict_with_good_names_changes_nothing(lab: Lab) -> None:
    proc = lab.ok(READ, enable="p-one", env=STRICT)
    assert proc.stdout.split() == ["started", "patched"]
    assert proc.stderr == ""


def test_strict_off_values_and_precedence(lab: Lab) -> None:
    # IMPORTPATCH_STRICT=0 wins over the VLLM_ spelling (one precedence rule for every variable)
    proc = lab.ok(READ, enable="p-onee",
                  env={"IMPORTPATCH_STRICT": "0", "VLLM_IMPORTPATCH_STRICT": "1"})
    assert proc.stdout.split() == ["started", "orig"]
    garbage = lab.ok(READ, enable="p-onee", env={"IMPORTPATCH_STRICT": "maybe"})
    assert garbage.stdout.split() == ["started", "orig"]
    assert "IMPORTPATCH_STRICT='maybe' is not a switch value" in garbage.stderr


def test_strict_broken_enabled_patch_stops_at_the_first_targeted_package(lab: Lab) -> None:
    lab.patch({"raising.py": '''
        from importpatch import Patch
        Patch("raising").replace("wpkg.mod:f", lambda: "patched")
        raise RuntimeError("boom at declaration time")
        '''})
    # Without strict: the good patch applies, the broken one fails only its own target's import.
    assert lab.ok(READ, enable="p-one,raising").stdout.split() == ["started", "patched"]
    proc = lab.run(READ, enable="p-one,raising", env=STRICT)
    assert proc.returncode == 1 and proc.stdout.split() == ["started"]
    warning = next(line for line in proc.stderr.splitlines() if "is broken" in line)
    message = warning.removeprefix("importpatch: warning: ")
    assert message.startswith("patch raising (") and "boom at declaration time" in message
    assert proc.stderr.strip().splitlines()[-1].endswith(
        f"importpatch: {message} (IMPORTPATCH_STRICT is on: stopped at the import of tpkg)")


@pytest.mark.parametrize("problem", ["malformed", "folder"])
def test_strict_stops_on_a_malformed_name_or_a_missing_patch_folder(
    lab: Lab, problem: str
) -> None:
    if problem == "malformed":
        enable, env, said = "p-one,p/one", STRICT, "IMPORTPATCH_ENABLE: ignored 'p/one'"
    else:
        missing = str(lab.root / "no-such-folder")
        path = os.pathsep.join([str(lab.patches), missing])
        enable, env = "p-one", {**STRICT, "IMPORTPATCH_PATH": path}
        said = f"IMPORTPATCH_PATH: {missing!r} is not a folder"
    proc = lab.run(READ, enable=enable, env=env)
    assert proc.returncode == 1 and proc.stdout.split() == ["started"], proc.stderr
    assert f"importpatch: warning: {said}" in proc.stderr
    assert said in proc.stderr.strip().splitlines()[-1]


def test_strict_stops_python_dash_m_of_a_targeted_module(lab: Lab) -> None:
    lab.target({"solo.py": "print('solo ran')\n"}).patch({"solo_patch.py": '''
        from importpatch import Patch
        Patch("solo-p").add("solo:EXTRA", 1)
        '''})
    proc = lab.run(["-m", "solo"], enable="solo-p,typo", env=STRICT)
    assert proc.returncode == 1 and "solo ran" not in proc.stdout
    assert "unknown patch name(s) typo" in proc.stderr.strip().splitlines()[-1]


def test_strict_late_activation_raises_at_enable(lab: Lab) -> None:
    out = lab.json('''
        import json, importpatch
        try:
            importpatch.enable("p-onee")
        except ImportError as exc:
            print(json.dumps([type(exc).__name__, str(exc)]))
        ''', enable=None, env=STRICT)
    assert out[0] == "StrictError"
    # The name was passed to the call (IMPORTPATCH_ENABLE is unset): said so (issue 30, item 4).
    assert out[1].startswith(
        "importpatch: unknown patch name(s) p-onee passed to importpatch.enable(); known: ")
    assert out[1].endswith("(IMPORTPATCH_STRICT is on: stopped at importpatch's late activation "
                           "(importpatch.enable() or vLLM's general-plugin hook))")


def test_strict_vllm_plugin_hook_raises_where_the_pth_did_not_run(lab: Lab) -> None:
    # python -S: no .pth; vLLM calls the general plugin (this entry point's function) in every
    # process it starts and does not catch what it raises. Here the call is made as vLLM makes
    # it: the entry point of the group vllm.general_plugins, loaded and called.
    code = f'''
        import json, sys
        sys.path.append({str(lab.venv.site_packages)!r})
        from importlib.metadata import entry_points
        (ep,) = [e for e in entry_points(group="vllm.general_plugins") if e.name == "importpatch"]
        try:
            ep.load()()
        except ImportError as exc:
            print(json.dumps([type(exc).__name__, str(exc)]))
        else:
            print(json.dumps(["ran", ""]))
        '''
    name, text = lab.json(code, flags=["-S"], enable="p-onee", env=STRICT)
    assert name == "StrictError" and unknown_warning("p-onee") in text
    assert lab.json(code, flags=["-S"], enable="p-onee") == ["ran", ""]  # without strict: a warning


def test_doctor_lists_the_strict_variable(lab: Lab) -> None:
    out = json.loads(lab.ok(["-m", "importpatch", "doctor", "--json"], enable="p-one",
                            env=STRICT).stdout)
    assert out["env"].get("IMPORTPATCH_STRICT") == "1"
