"""The factor that keys vLLM's compile caches on the patches that are on
(importpatch/integrations/vllm_compile.py, added to ``vllm.envs.compile_factors`` by the built-in
``vllm-compile-cache-key`` patch; the real vLLM runs are tests/test_vllm_compile_cache.py).

Every kind of operation, each in a real child of the wheel venv whose patches the real hook chose
from IMPORTPATCH_PATH / IMPORTPATCH_ENABLE: turning a patch on or off, editing it, or adding a
second one gives another factor; the same set gives the same factor in another process (another
hash seed); with nothing on there is no factor (vLLM's own key, unchanged).
"""

from __future__ import annotations

from typing import Any

import pytest
from coreutil import Lab

TARGET = {
    "tpkg/__init__.py": "",
    "tpkg/mod.py": '''
        import dataclasses

        def f(x):
            return x + 1
        G = 1  # the diffs' context after their change

        class C:
            def meth(self, x):
                return x * 2

        @dataclasses.dataclass
        class Conf:
            size: int = 1
    ''',
}

# name -> (file, text of version 1, text of version 2): the edit changes only the patch's code.
KINDS = {
    "k-wrap": ("k_wrap.py", '''
        from importpatch import Patch
        patch = Patch("k-wrap")

        @patch.wrap("tpkg.mod:f")
        def f(wrapped, instance, args, kwargs):
            return wrapped(*args, **kwargs) * {n}
    '''),
    "k-replace-original": ("k_replace_original.py", '''
        from importpatch import Patch
        patch = Patch("k-replace-original")

        @patch.replace("tpkg.mod:C.meth", original=True)
        def meth(original, self, x):
            return original(self, x) + {n}
    '''),
    "k-replace": ("k_replace.py", '''
        from importpatch import Patch
        patch = Patch("k-replace")

        @patch.replace("tpkg.mod:f")
        def f(x):
            return x - {n}
    '''),
    "k-add": ("k_add.py", '''
        from importpatch import Patch
        patch = Patch("k-add")

        @patch.add("tpkg.mod:C.extra")
        def extra(self):
            return {n}
    '''),
    "k-subclass": ("k_subclass.py", '''
        from importpatch import Patch
        patch = Patch("k-subclass")

        @patch.subclass("tpkg.mod:C")
        def c(Original):
            class Sub(Original):
                def meth(self, x):
                    return super().meth(x) + {n}
            return Sub
    '''),
    "k-field": ("k_field.py", '''
        from importpatch import Patch
        patch = Patch("k-field")
        patch.field("tpkg.mod:Conf.extra", "int", {n})
    '''),
    "k-transform": ("k_transform.py", '''
        import ast
        from importpatch import Patch
        patch = Patch("k-transform")

        @patch.transform("tpkg.mod")
        def edit(tree):
            tree.body.append(ast.parse("TRANSFORMED = {n}").body[0])
            return tree
    '''),
    "k-after-import": ("k_after_import.py", '''
        from importpatch import Patch
        patch = Patch("k-after-import")

        @patch.after_import("tpkg.mod")
        def hook(mod):
            mod.HOOKED = {n}
    '''),
    "k-diff": ("k-diff.diff", '''
        Name: k-diff

        --- a/tpkg/mod.py
        +++ b/tpkg/mod.py
        @@ -3,3 +3,3 @@
         def f(x):
        -    return x + 1
        +    return x + {n}
         G = 1  # the diffs' context after their change

    '''),
}
FACTOR = """
import json, tpkg.mod
from importpatch.integrations.vllm_compile import factor
print(json.dumps(factor()))
"""

pytestmark = pytest.mark.lab(target=TARGET)


def write(lab: Lab, name: str, n: int) -> None:
    file, text = KINDS[name]
    lab.patch({file: text.replace("{n}", str(n))})


def factor(lab: Lab, enable: str, seed: str = "0") -> dict[str, str] | None:
    """The factor of a child with ``enable`` on, as {patch name: digest}; None: no factor."""
    value = lab.json(FACTOR, enable=enable, env={"PYTHONHASHSEED": seed})
    if value is None:
        return None
    parts = [p.partition("=") for p in value.split(";")]
    assert [name for name, _, _ in parts] == sorted(name for name, _, _ in parts), value
    return {name: digest for name, _, digest in parts}


@pytest.fixture(scope="module")
def matrix(wheel_venv: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Factors of children: nothing on; every kind on (twice, two hash seeds); every kind on but
    one (for each); every kind on with one edited (for each)."""
    lab = Lab(wheel_venv, tmp_path_factory.mktemp("key")).target(TARGET)
    every = ",".join(KINDS)
    for name in KINDS:
        write(lab, name, 7)
    out: dict[str, Any] = {"off": factor(lab, ""), "all": factor(lab, every),
                           "again": factor(lab, every, seed="12345"), "without": {}, "edited": {}}
    for name in KINDS:
        out["without"][name] = factor(lab, ",".join(k for k in KINDS if k != name))
        write(lab, name, 8)
        out["edited"][name] = factor(lab, every)
        write(lab, name, 7)
    return out


def test_nothing_on_adds_no_factor_and_the_same_set_gives_the_same_one_in_another_process(
    matrix: dict[str, Any]
) -> None:
    assert matrix["off"] is None  # vLLM's own key: artifacts made without importpatch stay valid
    assert matrix["all"] is not None and sorted(matrix["all"]) == sorted(KINDS)
    assert matrix["again"] == matrix["all"]


@pytest.mark.parametrize("name", sorted(KINDS))
def test_turning_one_patch_on_or_off_changes_the_factor_by_that_patch_only(
    matrix: dict[str, Any], name: str
) -> None:
    without = matrix["without"][name]  # on -> off; read backwards, off -> on (a second patch added)
    assert without is not None and name not in without
    assert without == {k: v for k, v in matrix["all"].items() if k != name}


@pytest.mark.parametrize("name", sorted(KINDS))
def test_editing_one_patch_changes_its_digest_only(matrix: dict[str, Any], name: str) -> None:
    edited = matrix["edited"][name]
    assert edited[name] != matrix["all"][name]
    assert {k: v for k, v in edited.items() if k != name} == {
        k: v for k, v in matrix["all"].items() if k != name}


def test_a_helper_of_the_patch_folder_is_part_of_a_py_patch_s_digest(lab: Lab) -> None:
    lab.patch({"_util.py": "SCALE = 2\n", "k_helped.py": '''
        from importpatch import Patch
        from ._util import SCALE
        patch = Patch("k-helped")

        @patch.wrap("tpkg.mod:f")
        def f(wrapped, instance, args, kwargs):
            return wrapped(*args, **kwargs) * SCALE
    '''})
    before = factor(lab, "k-helped")
    lab.patch({"_util.py": "SCALE = 3\n"})
    after = factor(lab, "k-helped")
    assert before is not None and after is not None and before != after


def test_a_patch_that_failed_here_counts_as_failed_not_as_its_code(lab: Lab) -> None:
    lab.patch({"k-stale.diff": '''
        Name: k-stale
        On-Error: warn

        --- a/tpkg/mod.py
        +++ b/tpkg/mod.py
        @@ -3,3 +3,3 @@
         def f(x):
        -    return x + 100
        +    return x + 200
         G = 1  # the diffs' context after their change

    '''})
    value = factor(lab, "k-stale")  # FACTOR imports tpkg.mod first: the diff does not apply
    assert value == {"k-stale": "!failed"}, value


def test_the_key_patch_itself_and_patches_that_are_off_are_not_counted(lab: Lab) -> None:
    for each in KINDS:
        write(lab, each, 7)
    value = factor(lab, "k-wrap,k-add,vllm-compile-cache-key")
    assert value is not None and sorted(value) == ["k-add", "k-wrap"]
