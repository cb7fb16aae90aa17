"""Which patches are on (environment toggles, defaults, version requirements, moved targets) and
what happens when a patch cannot apply (conflicts, on_error, broken declaration files)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import Venv
from coreutil import EVENTS, Lab, install_dist

TARGET = {
    "tpkg/__init__.py": "",
    "tpkg/mod.py": '''
        def one():
            return "orig"

        def two():
            return "orig"
        ''',
}
TWO_PATCHES = {
    "ones.py": '''
        from importpatch import Patch
        Patch("p-one").replace("tpkg.mod:one", lambda: "patched")
        ''',
    "twos.py": '''
        from importpatch import Patch
        Patch("p-two", default=True).replace("tpkg.mod:two", lambda: "patched")
        ''',
}
READ = "import tpkg.mod as m; print(m.one(), m.two())"


def test_enable_names_or_all_select_patches_and_default_on_applies_without_naming(lab: Lab) -> None:
    lab.target(TARGET).patch(TWO_PATCHES)
    assert lab.ok(READ, enable="p-one").stdout.split() == ["patched", "patched"]
    assert lab.ok(READ, enable="all").stdout.split() == ["patched", "patched"]
    # p-two is on by default: on with the folder given and nothing enabled by name
    assert lab.ok(READ, enable=None).stdout.split() == ["orig", "patched"]


def test_enable_all_means_the_users_patches_never_the_built_in_ones(lab: Lab) -> None:
    lab.target(TARGET).patch(TWO_PATCHES)
    listing = json.loads(lab.ok(["-m", "importpatch", "list", "--json"]).stdout)["patches"]
    builtin = [p for p in listing if p["origin"] == "builtin"]
    assert builtin and not any(p["enabled"] for p in builtin)
    assert {p["why"] for p in builtin} == {
        "built-in, off by default: on only by name (IMPORTPATCH_ENABLE=all means the patches of "
        "your folders and packages)"}
    assert {(p["name"], p["why"]) for p in listing if p["origin"] == "folder"} == {
        ("p-one", "IMPORTPATCH_ENABLE=all"), ("p-two", "IMPORTPATCH_ENABLE=all")}
    finder = ("import importpatch.load.finder as f; print(sorted(e.name for e in f.installed()"
              ".entries))")
    assert lab.ok(finder).stdout.split() == ["['p-one',", "'p-two']"]
    # a built-in one is on by name, beside all
    named = lab.ok(finder, enable="all,vllm-ban-token-ids").stdout
    assert named.split() == ["['p-one',", "'p-two',", "'vllm-ban-token-ids']"]


def test_enable_all_neither_adds_nor_removes_a_built_in_patch_on_by_default() -> None:
    from importpatch.config import read

    toggles = read({"IMPORTPATCH_ENABLE": "all"})
    assert toggles.decide("shipped-default", True, builtin=True) == (True, "on by default")
    assert toggles.decide("shipped-off", False, builtin=True)[0] is False
    assert toggles.decide("mine", False) == (True, "IMPORTPATCH_ENABLE=all")
    off = read({"IMPORTPATCH_ENABLE": "all", "IMPORTPATCH_DISABLE": "shipped-default"})
    assert off.decide("shipped-default", True, builtin=True) == (
        False, "named in IMPORTPATCH_DISABLE")


def test_disable_wins_over_enable_all_and_default(lab: Lab) -> None:
    lab.target(TARGET).patch(TWO_PATCHES)
    proc = lab.ok(READ, enable="all", env={"IMPORTPATCH_DISABLE": "p-one p-two"})
    assert proc.stdout.split() == ["orig", "orig"]
    proc = lab.ok(READ, enable="p-one,p-two", env={"IMPORTPATCH_DISABLE": "p-two"})
    assert proc.stdout.split() == ["patched", "orig"]


@pytest.mark.parametrize("var", ["IMPORTPATCH_OFF", "VLLM_IMPORTPATCH_OFF"])
def test_off_kill_switch_disables_everything_and_loads_nothing(lab: Lab, var: str) -> None:
    lab.target(TARGET).patch(TWO_PATCHES)
    proc = lab.ok(READ + "; import sys; print('importpatch' in sys.modules)", env={var: "1"})
    assert proc.stdout.split() == ["orig", "orig", "False"]
    assert proc.stderr == ""


def test_unknown_name_warns_once_listing_known_names(lab: Lab) -> None:
    lab.target(TARGET).patch(TWO_PATCHES)
    proc = lab.ok(READ, enable="p-one,no-such-patch")
    assert proc.stdout.split() == ["patched", "patched"]
    warnings = [line for line in proc.stderr.splitlines() if "no-such-patch" in line]
    assert len(warnings) == 1, proc.stderr
    prefix = (
        "importpatch: warning: unknown patch name(s) no-such-patch in IMPORTPATCH_ENABLE; known: "
    )
    assert warnings[0].startswith(prefix)
    known = warnings[0][len(prefix):].split(", ")
    assert {"p-one", "p-two"} <= set(known) and known == sorted(known)


def test_default_on_patch_of_an_installed_distribution_needs_no_variable(lab: Lab) -> None:
    lab.target(TARGET)
    install_dist(
        lab.venv, lab.targets, "acme-patches", "1.0",
        {"acme_patches/__init__.py": '''
            from importpatch import Patch
            Patch("acme-default", default=True).replace("tpkg.mod:one", lambda: "patched")
            '''},
        entry_points="[importpatch.patches]\nacme = acme_patches\n",
    )
    no_vars = {"IMPORTPATCH_PATH": None}
    for _ in range(2):  # the second process reads the catalog index the first one wrote
        proc = lab.ok(READ, enable=None, env=no_vars)
        assert proc.stdout.split() == ["patched", "orig"], proc.stderr
    assert lab.ok(READ, enable=None, env={**no_vars, "IMPORTPATCH_DISABLE": "acme-default"}
                  ).stdout.split() == ["orig", "orig"]


GARBAGE = ["!!!", " ", "/nonexistent/dir", "\x01\x7f", "all,,;;", "%s%n{}", "x" * 5000,
           "/etc/passwd", "/proc/self", "1"]
VARS = ["ENABLE", "DISABLE", "PATH", "LOG", "EVENTS_DIR", "CACHE_DIR", "NO_CACHE"]


@pytest.mark.parametrize("value", GARBAGE, ids=range(len(GARBAGE)))
def test_garbage_in_every_variable_never_breaks_python_or_pip(lab: Lab, value: str) -> None:
    env = {f"{prefix}IMPORTPATCH_{var}": value for var in VARS for prefix in ("", "VLLM_")}
    env["IMPORTPATCH_OFF"] = "no"  # a truthy OFF would skip everything; keep the hook running
    env["IMPORTPATCH_PATH"] = f"{value}:{lab.patches}"
    lab.target(TARGET).patch(TWO_PATCHES)
    assert lab.ok("pass", enable=value, env=env)
    assert lab.ok(READ, enable=value, env=env).stdout.split()[1] == "patched"  # p-two: default
    assert "pip" in lab.ok(["-m", "pip", "--version"], enable=value, env=env).stdout


def test_version_requirement_on_import_package_of_differently_named_distribution(
    lab: Lab,
) -> None:
    info = install_dist(
        lab.venv, lab.targets, "fakevllm-cpu", "0.32.0",
        {"fakevllm/__init__.py": '__version__ = "0.32.0"\nTOP = "orig"\n',
         "fakevllm/core.py": 'def f():\n    return "orig"\n'},
        top_level=["fakevllm"],
    )
    assert info.name == "fakevllm_cpu-0.32.0.dist-info"
    lab.patch({
        "holds.py": '''
            from importpatch import Patch
            p = Patch("holds", requires="fakevllm>=0.30")
            p.replace("fakevllm.core:f", lambda: "patched")
            p.replace("fakevllm:TOP", "patched")  # judged while fakevllm has no __version__ yet
            ''',
        "too_new.py": '''
            from importpatch import Patch
            Patch("too-new", requires="fakevllm>=0.40").replace("fakevllm.core:f", lambda: "new")
            ''',
    })
    out = lab.json(f'''
        import json, importpatch.events, fakevllm.core
        print(json.dumps([fakevllm.core.f(), fakevllm.TOP, {EVENTS},
                          [e["detail"] for e in importpatch.events.events()]]))
        ''', env={"IMPORTPATCH_LOG": "1"})
    assert out[:2] == ["patched", "patched"]
    skipped = [e for e in out[2] if e[0] == "skipped"]
    assert skipped == [["skipped", "too-new", "fakevllm.core", "version"]]
    assert "requires fakevllm>=0.40, installed fakevllm 0.32.0" in out[3]


@pytest.fixture(scope="module")
def oldest_packaging_venv(venv_factory: Callable[..., Venv], built_wheel: Path) -> Venv:
    """The wheel with the oldest ``packaging`` its metadata admits (``packaging>=23``)."""
    return venv_factory(str(built_wheel), "packaging==23.0", name="packaging23")


@pytest.mark.parametrize("packaging_version", ["newest", "23.0"])
def test_version_requirement_on_a_version_that_is_not_pep_440(
        lab: Lab, packaging_version: str, request: pytest.FixtureRequest) -> None:
    # A bare name asks only that it be installed, and '===' is PEP 440's arbitrary equality,
    # made for such versions: both hold. Any other specifier cannot be judged: skipped.
    # packaging 23 raises InvalidVersion where 26 answers: the verdict must not depend on it.
    if packaging_version != "newest":
        lab.venv = request.getfixturevalue("oldest_packaging_venv")
        assert lab.ok("import packaging; print(packaging.__version__)").stdout.strip() == "23.0"
    lab.target({
        "odd/__init__.py": 'def f():\n    return "orig"\n',
        "odd-0.dist-info/METADATA": "Metadata-Version: 2.1\nName: odd\nVersion: build.7-x\n",
    }).patch({
        f"{name.replace('-', '_')}.py": f'''
            from importpatch import Patch
            Patch("{name}", requires={req!r}).wrap("odd:f", lambda w, i, a, k: w() + "+{name}")
            '''
        for name, req in (("bare", "odd"), ("arbitrary", "odd===build.7-x"), ("min", "odd>=1"))
    })
    out = lab.json('''
        import json, importpatch.events, odd
        print(json.dumps([odd.f(), [e["detail"] for e in importpatch.events.events()]]))
        ''')
    assert out[0] == "orig+arbitrary+bare"
    assert "requires odd>=1, installed odd build.7-x is not PEP 440" in out[1]


def test_moved_target_candidates_pick_the_first_existing_module(lab: Lab) -> None:
    lab.target({
        "mpkg/__init__.py": "",
        "mpkg/old_place.py": 'def f():\n    return "orig"\n',
        "npkg/__init__.py": "",
        "npkg/new_place.py": 'def f():\n    return "orig"\n',
        "npkg/old_place.py": 'def f():\n    return "orig"\n',
    }).patch({"moved.py": '''
        from importpatch import Patch
        p = Patch("moved")
        p.replace("mpkg.new_place|mpkg.old_place:f", lambda: "patched")
        p.replace("npkg.new_place|npkg.old_place:f", lambda: "patched")
        '''})
    out = lab.json('''
        import json, mpkg.old_place, npkg.new_place, npkg.old_place
        print(json.dumps([mpkg.old_place.f(), npkg.new_place.f(), npkg.old_place.f()]))
        ''')
    # mpkg has only the old path: it is patched; npkg has both: only the first candidate is
    assert out == ["patched", "patched", "orig"]


def test_two_patches_replacing_one_symbol_fail_naming_both(lab: Lab) -> None:
    lab.target(TARGET).patch({
        "first.py": 'from importpatch import Patch\nPatch("first").replace("tpkg.mod:one", 1)\n',
        "second.py": 'from importpatch import Patch\nPatch("second").replace("tpkg.mod:one", 2)\n',
    })
    proc = lab.run("import tpkg.mod")
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("importpatch.errors.PatchError: ")
    assert "'first' and 'second' both replace one" in last, last


WARN_TARGET = {
    "wpkg/__init__.py": "",
    "wpkg/mod.py": 'def f():\n    return "orig"\n\nVALUE = 1\n',
}


@pytest.mark.parametrize("on_error", ["warn", "fail"])
def test_on_error_warn_skips_a_patch_that_cannot_apply(lab: Lab, on_error: str) -> None:
    lab.target(WARN_TARGET).patch({
        "gone.py": f'''
            from importpatch import Patch
            p = Patch("gone", on_error="{on_error}")
            p.replace("wpkg.mod:f", lambda: "patched")  # fits, but the patch is all or nothing
            p.replace("wpkg.mod:renamed_upstream", lambda: "patched")
            ''',
        "stale.diff": f'''\
            On-Error: {on_error}
            --- a/wpkg/mod.py
            +++ b/wpkg/mod.py
            @@ -3,2 +3,2 @@

            -VALUE = 0
            +VALUE = 2
            ''',
        "fine.py": '''
            from importpatch import Patch
            Patch("fine").add("wpkg.mod:EXTRA", "added")
            ''',
    })
    proc = lab.run(f'''
        import json, importpatch.events, wpkg.mod as m
        print(json.dumps([m.f(), m.VALUE, m.EXTRA, {EVENTS}]))
        ''')
    if on_error == "fail":
        assert proc.returncode == 1
        assert "importpatch.errors.PatchError" in proc.stderr
        return
    assert proc.returncode == 0, proc.stderr
    f, value, extra, events = json.loads(proc.stdout)
    assert (f, value, extra) == ("orig", 1, "added")  # neither warn patch applied, "fine" did
    failed = sorted((e[1], e[3]) for e in events if e[0] == "failed")
    assert failed == [("gone", "skipped (on_error=warn)"), ("stale", "skipped (on_error=warn)")]
    assert "importpatch: failed gone to wpkg.mod" in proc.stderr
    assert "renamed_upstream" in proc.stderr and "VALUE = 0" in proc.stderr
    assert "wpkg/mod.py: wpkg/mod.py" not in proc.stderr  # the path is named once


def test_broken_declarations_fail_only_the_targeted_import(lab: Lab) -> None:
    lab.target(WARN_TARGET).patch({
        "malformed.diff": "--- a/wpkg/mod.py\n+++ b/wpkg/mod.py\n@@ -1,3 +1,3 @@\n-x\n",
        "raising.py": '''
            raise RuntimeError("boom at declaration time")
            Patch("raising").replace("wpkg.mod:f", None)
            ''',
    })
    proc = lab.ok("print('started')")
    assert proc.stdout.strip() == "started"
    assert "malformed" in proc.stderr and "raising" in proc.stderr  # both reported as broken
    for enable in ("malformed", "raising"):
        proc = lab.run("import wpkg.mod", enable=enable)
        assert proc.returncode == 1
        last = proc.stderr.strip().splitlines()[-1]
        assert last.startswith("importpatch.errors.PatchError: importpatch: patch "
                               f"'{enable}' cannot apply to wpkg.mod"), last
        assert "the patch declaration failed to load" in last
