"""Patch folders as code: helpers shared by patch files (imported relatively, loaded from source,
part of the index signature and of an AST transform's cache key, picklable across spawn), and
``importpatch check`` warning about module-level code that does more than declare. Real child
interpreters of the wheel's venv."""

from __future__ import annotations

import json
import os
import time

import pytest
from coreutil import Lab

TARGET = {
    "tpkg/__init__.py": "",
    "tpkg/mod.py": 'def one():\n    return "orig"\n\ndef two():\n    return "orig"\n\nK = 1\n',
    "tpkg/util.py": "def value_of(obj):\n    return obj.value\n",
}

pytestmark = pytest.mark.lab(target=TARGET)

SHARED = {
    "_common.py": '''
        import builtins
        builtins.__dict__.setdefault("_common_runs", []).append(1)  # how often it executes

        class Marker:
            def __init__(self, value):
                self.value = value

        def make(text):
            return lambda: text + " via helper"
        ''',
    "_lib/__init__.py": "from ._names import TWO\n",
    "_lib/_names.py": 'TWO = "tpkg.mod:two"\n',
    "a.py": '''
        from importpatch import Patch
        from ._common import make
        Patch("pa").replace("tpkg.mod:one", make("a"))
        ''',
    "b.py": '''
        from importpatch import Patch
        from . import _common
        from ._lib import TWO
        Patch("pb").replace(TWO, _common.make("b"))
        ''',
}
READ = '''
import builtins, json, os, tpkg.mod
print(json.dumps([tpkg.mod.one(), tpkg.mod.two(), len(builtins.__dict__.get("_common_runs", []))]))
'''


def test_patch_files_share_helpers_of_their_folder(lab: Lab) -> None:
    lab.patch(SHARED)
    for _ in range(2):  # discovery in the first process, the index in the second
        assert lab.json(READ, enable="pa,pb") == ["a via helper", "b via helper", 1]
    listing = json.loads(lab.ok(["-m", "importpatch", "list", "--json"]).stdout)
    assert sorted(p["name"] for p in listing["patches"] if p["origin"] == "folder") == ["pa", "pb"]
    assert not any(p["error"] for p in listing["patches"])
    check = json.loads(lab.ok(["-m", "importpatch", "check", "pa", "pb", "--json"]).stdout)
    assert [p["status"] for p in check["patches"]] == ["ok", "ok"]
    # helpers run from their source: no .pyc is written into the patch folder
    assert not list(lab.patches.rglob("*.pyc"))


def test_editing_a_helper_in_place_refreshes_the_index(lab: Lab) -> None:
    lab.target({"tpkg/alt.py": 'def two():\n    return "orig"\n'}).patch(SHARED)
    time.sleep(0.1)  # an index is not written within 20 ms of a change it covers ("racy")
    assert lab.json(READ, enable="pb")[:2] == ["orig", "b via helper"]
    assert list((lab.cache / "catalog").glob("*.marshal"))  # the index the next run reads
    # The helper moves pb to another module: the index (which modules a patch targets) must see
    # it, or tpkg.alt would be imported without its patch file ever running.
    names = lab.patches / "_lib" / "_names.py"
    before = names.stat()
    names.write_text('TWO = "tpkg.alt:two"\n')  # same size; the mtime is put back below
    os.utime(names, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert lab.ok("import tpkg.alt; print(tpkg.alt.two())", enable="pb").stdout.split() == [
        "b", "via", "helper"]


TRANSFORM = {
    "_rewrite.py": '''
        import ast

        def set_k(tree):
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and node.value == 1:
                    node.value = 7
            return tree
        ''',
    "t.py": '''
        from importpatch import Patch
        from ._rewrite import set_k
        Patch("pt").transform("tpkg.mod")(set_k)
        ''',
}
READ_K = "import tpkg.mod; print(tpkg.mod.K)"


def test_a_transform_is_compiled_afresh_when_its_folders_helper_changes(lab: Lab) -> None:
    helper = {**TRANSFORM, "t.py": TRANSFORM["t.py"].replace(
        "from ._rewrite import set_k\n", "from . import _rewrite\n").replace(
        "(set_k)", "(lambda tree: _rewrite.set_k(tree))")}
    lab.patch(helper)
    assert lab.ok(READ_K, enable="pt").stdout.split() == ["7"]
    assert lab.ok(READ_K, enable="pt").stdout.split() == ["7"]  # from the bytecode cache
    cached = list((lab.cache / "code").rglob("*"))
    rewrite = lab.patches / "_rewrite.py"
    rewrite.write_text(rewrite.read_text().replace("node.value = 7", "node.value = 8"))
    assert lab.ok(READ_K, enable="pt").stdout.split() == ["8"]
    assert len(list((lab.cache / "code").rglob("*"))) > len(cached)  # a new entry


SPAWN = '''
import json, multiprocessing, tpkg.mod, tpkg.util
if __name__ == "__main__":
    marker = tpkg.mod.one()
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        print(json.dumps([type(marker).__module__, pool.apply(tpkg.util.value_of, (marker,))]))
'''


def test_an_object_of_a_helper_pickles_across_spawn(lab: Lab) -> None:
    lab.patch({**SHARED, "a.py": '''
        from importpatch import Patch
        from ._common import Marker
        Patch("pa").replace("tpkg.mod:one", lambda: Marker(42))
        '''})
    (lab.root / "spawner.py").write_text(SPAWN)
    proc = lab.ok([lab.root / "spawner.py"], enable="pa")
    module, value = json.loads(proc.stdout.splitlines()[-1])
    assert module.startswith("importpatch._declared.patches_") and module.endswith("._common")
    assert value == 42


def test_a_patch_file_is_not_a_helper(lab: Lab) -> None:
    lab.patch({**SHARED, "c.py": '''
        from importpatch import Patch
        Patch("pc").replace("tpkg.mod:K", 2)
        from . import a
        '''})
    proc = lab.run("import tpkg.mod", enable="pc")
    assert proc.returncode == 1
    assert "patch files cannot import each other" in proc.stderr.strip().splitlines()[-1]


# -- check: module-level code that does more than declare -------------------------------------

DOERS = {
    "heavy.py": '''
        import heavy_dep
        from importpatch import Patch
        Patch("heavy").replace("tpkg.mod:one", lambda: heavy_dep.VALUE)
        ''',
    "heavy_again.py": '''
        import heavy_dep.sub  # imported by heavy.py first: seen in the text
        from importpatch import Patch
        Patch("heavy-again").replace("tpkg.mod:two", lambda: "x")
        ''',
    "writer.py": '''
        import os
        from importpatch import Patch
        with open(os.path.join(os.environ["WRITE_TO"], "out.txt"), "w") as f:
            f.write("side effect")
        Patch("writer").replace("tpkg.mod:K", 2)
        ''',
    "runner.py": '''
        import socket, subprocess, sys
        from importpatch import Patch
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        socket.getaddrinfo("localhost", 80)
        Patch("runner").add("tpkg.mod:EXTRA", 1)
        ''',
    "clean.py": '''
        import json, os
        from importpatch import Patch
        TYPE_CHECKING = False
        if TYPE_CHECKING:
            import heavy_dep
        p = Patch("clean")

        @p.replace("tpkg.mod:one")
        def one():
            import heavy_dep  # inside the replacement: runs when called, not when declared
            return heavy_dep.VALUE
        ''',
}
OWN_TARGET = {"own_target.py": '''
    import tpkg.mod
    from importpatch import Patch
    Patch("own-target").replace("tpkg.mod:one", lambda: "x")
    '''}


def test_check_warns_about_module_level_code_that_does_more_than_declare(lab: Lab) -> None:
    lab.target({"heavy_dep/__init__.py": "VALUE = 1\n", "heavy_dep/sub.py": ""}).patch(DOERS)
    out = lab.root / "written"
    out.mkdir()
    env = {"WRITE_TO": str(out)}
    report = json.loads(lab.ok(["-m", "importpatch", "check", "--all", "--json"], enable=None,
                               env=env).stdout)
    warnings = {p["name"]: p["warnings"] for p in report["patches"] if p["origin"] == "folder"}
    assert warnings["clean"] == []
    for name in ("heavy", "heavy-again"):
        (warning,) = warnings[name]
        assert warning.startswith("its module-level code imports heavy_dep: a declaration runs")
    (writes,) = warnings["writer"]
    assert f"writes {out / 'out.txt'}" in writes
    (does,) = warnings["runner"]
    assert "runs " in does and "looks up 'localhost'" in does
    assert report["exit_status"] == 0  # warnings do not fail check
    human = lab.ok(["-m", "importpatch", "check", "--all"], enable=None, env=env).stdout
    assert "    warning   its module-level code imports heavy_dep" in human


@pytest.mark.parametrize("index", ["written", "too-new-to-write"])
def test_check_explains_a_declaration_that_imports_its_target(lab: Lab, index: str) -> None:
    lab.patch(OWN_TARGET)
    if index == "too-new-to-write":
        # An mtime in the future: the index is never written (its files cannot be told apart from
        # a change made during the scan), so every load in the check process scans.
        future = time.time() + 3600
        os.utime(lab.patches / "own_target.py", (future, future))
    report = json.loads(lab.run(["-m", "importpatch", "check", "own-target", "--json"]).stdout)
    (own,) = report["patches"]
    assert own["status"] == "fail" and report["exit_status"] == 1
    assert "patch code imports tpkg.mod, which own-target patches" in own["problems"][0]
    assert "Move the import into the function that uses it" in own["problems"][0]
    assert own["warnings"][0].startswith("its module-level code imports tpkg: ")


def test_a_declaration_that_starts_python_does_not_start_discovery_again(lab: Lab) -> None:
    # Each Python process runs the declarations when the index is cold; one that starts Python
    # would otherwise start a process that starts a process ... without end.
    lab.patch({"runner.py": DOERS["runner.py"]})
    proc = lab.ok("print('done')", enable="runner", timeout=60)
    assert proc.stdout.split() == ["done"]
    assert proc.stderr.count("not activated: RuntimeError: started by patch code while process"
                             ) == 1, proc.stderr


ONE = {"one.py": '''
    from importpatch import Patch
    Patch("toy-basic").replace("tpkg.mod:one", lambda: "patched")
    '''}


@pytest.mark.parametrize("how", ["symlink", "hardlink"])
def test_the_same_patch_file_reached_twice_is_one_patch(lab: Lab, how: str) -> None:
    # A folder and a link to it in IMPORTPATCH_PATH, or a hard-linked copy (cp -al): the same
    # file, one patch; not "patches 'toy-basic' and 'toy-basic' both replace one".
    lab.patch(ONE)
    twin = lab.root / "twin"
    if how == "symlink":
        twin.symlink_to(lab.patches, target_is_directory=True)
    else:
        twin.mkdir()
        os.link(lab.patches / "one.py", twin / "one.py")
    env = {"IMPORTPATCH_PATH": os.pathsep.join([str(lab.patches), str(twin)])}
    for _ in range(2):  # cold, then from the index
        proc = lab.ok("import tpkg.mod; print(tpkg.mod.one())", enable="toy-basic", env=env)
        assert proc.stdout.strip() == "patched"
        assert "importpatch: warning" not in proc.stderr, proc.stderr
    listed = json.loads(lab.ok(["-m", "importpatch", "list", "--json"], enable="toy-basic",
                               env=env).stdout)
    mine = [r for r in listed["patches"] if r["origin"] == "folder"]
    assert [(r["name"], r["error"]) for r in mine] == [("toy-basic", None)]
    assert listed["problems"] == []


def test_two_files_declaring_one_name_is_an_error_naming_both(lab: Lab) -> None:
    lab.patch(ONE)
    other = lab.root / "other"
    other.mkdir()
    (other / "copy.py").write_text((lab.patches / "one.py").read_text() + "# edited\n")
    env = {"IMPORTPATCH_PATH": os.pathsep.join([str(lab.patches), str(other)])}
    files = [str(lab.patches / "one.py"), str(other / "copy.py")]
    proc = lab.run("import tpkg.mod; print(tpkg.mod.one())", enable="toy-basic", env=env)
    assert proc.returncode != 0 and "patched" not in proc.stdout  # fails closed
    assert "both replace" not in proc.stderr
    assert all(f in proc.stderr for f in files), proc.stderr
    listed = json.loads(lab.ok(["-m", "importpatch", "list", "--json"], enable="toy-basic",
                               env=env).stdout)
    errors = [r["error"] or "" for r in listed["patches"] if r["origin"] == "folder"]
    assert len(errors) == 2 and all(f in e for e in errors for f in files), errors
