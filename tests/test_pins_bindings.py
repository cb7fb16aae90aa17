"""A pin covers every binding of its name that can run, and drift is named as the next release
would name it (issue 37 items 2 and 4).

- A name bound in both branches of an ``if``/``else`` (vLLM 0.33 has five), by a ``try``/``except
  ImportError`` fallback, or defined again later in the module: a change to any binding, above all
  the one that runs (usually not the first), is "changed" at ``check`` and at import.
- Normalisation drops comments by the tokenizer: a ``#``-line inside a string (embedded kernel
  source) is content; a comment outside strings is not.
- Labels: a removed function whose module still binds a close name that is another function is
  "gone" (not "moved" to that name); a function moved under another name with the same code is
  "moved"; a method that its class now inherits is "inherited" (never also "not bound anywhere").
- ``pin`` of a patch whose file fails to load fails: exit status 1, the error, ``"ok": false``.
- Pins written before (``sha256:``, the first binding only) are compared as they were made.

Real parts: the wheel venv, ``python -m importpatch`` in child interpreters, the import hook.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from coreutil import COMPILE_SPY, Lab

V1 = '__version__ = "1.0"\n'
MOD_V1 = '''\
import os

ON_CUDA = os.environ.get("TGT_CUDA") == "1"

if ON_CUDA:
    def pick(x):
        return x + 1
else:
    def pick(x):
        return x + 2

try:
    from tgt._fast import speed
except ImportError:
    def speed():
        return "slow"


def twice():
    return 1


def twice():
    return 2


def kernel_source():
    return """
#include <cuda.h>
#define BLOCK 128
__global__ void k() {}
"""


def commented(a):
    # what it does
    return a  # and why


class Base:
    def size(self):
        return 1


class Child(Base):
    def size(self):
        return 1

    def name(self):
        return "child"


def get_tokenizer_group(cfg):
    return [cfg]


def get_tokenizer(name, mode="auto", trust=False):
    if mode == "slow":
        raise ValueError(name)
    kind = "fast" if not trust else "remote"
    return {"name": name, "kind": kind}


def old_helper_name(a, b):
    total = a + b
    total *= 7
    return total - 1


def relocated(rows):
    out = []
    for row in rows:
        out.append(row * 2)
    out.sort()
    return out
'''
RELOCATED_V2 = """\
def relocated(rows):
    out = []
    for row in rows:
        out.append(row * 3)
    out.sort()
    return out
"""
# Release 2.0: only the branch that runs changed (the else), the ImportError fallback, the second
# definition, one #-line inside a string; the comments of `commented` only; Child.size is now
# inherited from Base; get_tokenizer_group removed (get_tokenizer, another function, stays);
# old_helper_name renamed, its code unchanged; relocated moved to tgt.elsewhere, one line changed.
MOD_V2 = (MOD_V1.replace("        return x + 2\n", "        return x + 3\n")
          .replace('        return "slow"\n', '        return "slower"\n')
          .replace("def twice():\n    return 2\n", "def twice():\n    return 3\n")
          .replace("#define BLOCK 128\n", "#define BLOCK 256\n")
          .replace("    # what it does\n    return a  # and why\n",
                   "    # what it does, said again\n\n    return a  # and why not\n")
          .replace("class Child(Base):\n    def size(self):\n        return 1\n\n",
                   "class Child(Base):\n")
          .replace("def get_tokenizer_group(cfg):\n    return [cfg]\n\n\n", "")
          .replace("def old_helper_name(", "def new_helper_name(")
          .replace("\n\n\n" + MOD_V1.split("\n\n\n")[-1], "\n"))

PATCH = '''\
from importpatch import Patch

patch = Patch("twice-bound")

@patch.replace("tgt.mod:pick")
def pick(x):
    return 0

@patch.replace("tgt.mod:speed")
def speed():
    return "patched"

@patch.replace("tgt.mod:twice")
def twice():
    return 0

@patch.replace("tgt.mod:kernel_source")
def kernel_source():
    return ""

@patch.wrap("tgt.mod:commented")
def commented(wrapped, instance, args, kwargs):
    return wrapped(*args, **kwargs)

labels = Patch("labels")

@labels.replace("tgt.mod:Child.size")
def size(self):
    return 2

@labels.replace("tgt.mod:get_tokenizer_group")
def get_tokenizer_group(cfg):
    return []

@labels.replace("tgt.mod:old_helper_name")
def old_helper_name(a, b):
    return 0

@labels.replace("tgt.mod:relocated")
def relocated(rows):
    return rows
'''
BROKEN = '''\
import no_such_module_of_importpatch_tests

from importpatch import Patch

patch = Patch("broken")

@patch.replace("tgt.mod:pick")
def pick(x):
    return 0
'''
TARGETS = {"twice-bound": ["tgt.mod:pick", "tgt.mod:speed", "tgt.mod:twice",
                           "tgt.mod:kernel_source", "tgt.mod:commented"]}

pytestmark = pytest.mark.lab(target={"tgt/__init__.py": V1, "tgt/mod.py": MOD_V1},
                             patch={"bound.py": PATCH})


def cli(lab: Lab, *args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    proc = lab.run(["-m", "importpatch", *args], env=env)
    return proc.returncode, proc.stdout, proc.stderr


def check_drifts(lab: Lab, *names: str) -> dict[str, dict[str, object]]:
    """``check --json``'s drift of each op of ``names``, by target."""
    status, out, err = cli(lab, "check", "--json", *names)
    assert out, err
    report = json.loads(out)
    return {op["target"]: op["drift"] for p in report["patches"] for op in p["ops"]}


def upgrade(lab: Lab) -> None:
    lab.target({"tgt/__init__.py": V1.replace("1.0", "2.0"), "tgt/mod.py": MOD_V2,
                "tgt/elsewhere.py": RELOCATED_V2})


def pin(lab: Lab, *names: str) -> None:
    status, out, err = cli(lab, "pin", *names)
    assert status == 0, out + err


def test_every_binding_of_a_name_is_pinned_and_a_change_to_any_is_changed_at_check(lab: Lab
                                                                                     ) -> None:
    pin(lab, "twice-bound")
    text = (lab.patches / "bound.pin.toml").read_text()
    # both branches of the if/else and the ImportError fallback are in the pin, for review
    assert "        return x + 1" not in text  # dedented, each binding on its own
    assert "def pick(x):\n    return x + 1\n" in text and "def pick(x):\n    return x + 2\n" \
        in text
    assert "from tgt._fast import speed\n" in text and 'return "slow"' in text
    # as pinned: unchanged, every one (no false positive from the bindings or the strings)
    d = check_drifts(lab, "twice-bound")
    assert {t: d[t]["verdict"] for t in TARGETS["twice-bound"]} == dict.fromkeys(
        TARGETS["twice-bound"], "unchanged")

    upgrade(lab)
    d = check_drifts(lab, "twice-bound")
    verdicts = {t: d[t]["verdict"] for t in TARGETS["twice-bound"]}
    assert verdicts == {"tgt.mod:pick": "changed", "tgt.mod:speed": "changed",
                        "tgt.mod:twice": "changed", "tgt.mod:kernel_source": "changed",
                        "tgt.mod:commented": "unchanged"}  # comments only: no drift
    # upstream's diff shows the binding that changed: the second, the one that runs here
    assert "-    return x + 2\n+    return x + 3\n" in str(d["tgt.mod:pick"]["diff"])
    assert '-    return "slow"\n+    return "slower"\n' in str(d["tgt.mod:speed"]["diff"])
    assert "-    return 2\n+    return 3\n" in str(d["tgt.mod:twice"]["diff"])
    # a #-line inside a string is content (embedded C: a #define)
    assert "-#define BLOCK 128\n+#define BLOCK 256\n" in str(d["tgt.mod:kernel_source"]["diff"])


RUN = COMPILE_SPY + """
import tgt.mod
import importpatch.events
print("compiles", compiles,
      "drift", sorted(e['target'] for e in importpatch.events.events() if e['how'] == 'drift'))
"""


def test_at_import_a_change_to_the_binding_that_runs_is_drift_and_strict_fails(lab: Lab
                                                                                ) -> None:
    pin(lab, "twice-bound")
    same = lab.ok(RUN, enable="twice-bound")
    assert "drift []" in same.stdout, same.stdout + same.stderr  # as pinned: no warning
    upgrade(lab)
    cold = lab.ok(RUN, enable="twice-bound")
    drifted = "drift ['tgt.mod:kernel_source', 'tgt.mod:pick', 'tgt.mod:speed', 'tgt.mod:twice']"
    assert drifted in cold.stdout, cold.stdout + cold.stderr
    warning = ("twice-bound: replace tgt.mod:pick: the original tgt.mod:pick changed since the "
               "patch was pinned (tgt 1.0)")
    assert cold.stderr.count(warning) == 1, cold.stderr
    warm = lab.ok(RUN, enable="twice-bound")  # from the bytecode cache: the same verdict
    assert "compiles []" in warm.stdout and drifted in warm.stdout
    strict = lab.run(RUN, enable="twice-bound", env={"IMPORTPATCH_STRICT": "1"})
    assert strict.returncode != 0 and "IMPORTPATCH_STRICT is on" in strict.stderr


def test_gone_moved_and_inherited_are_one_label_each(lab: Lab) -> None:
    pin(lab, "labels")
    upgrade(lab)
    d = check_drifts(lab, "labels")
    # removed; the module's close name get_tokenizer is another function: gone, not moved there
    gone = d["tgt.mod:get_tokenizer_group"]
    assert (gone["verdict"], gone["candidates"]) == ("gone", [])
    # renamed with the same code: moved, to the name that is it
    moved = d["tgt.mod:old_helper_name"]
    assert (moved["verdict"], moved["candidates"]) == ("moved", ["tgt.mod:new_helper_name"])
    assert moved["diff"] == ""  # the same code
    # moved to another module and edited a little there: moved, with that edit as the diff
    relocated = d["tgt.mod:relocated"]
    assert (relocated["verdict"], relocated["candidates"]) == ("moved",
                                                               ["tgt.elsewhere:relocated"])
    assert "-        out.append(row * 2)\n+        out.append(row * 3)\n" in str(
        relocated["diff"])
    # now inherited from the base class: inherited, naming the base
    inherited = d["tgt.mod:Child.size"]
    assert (inherited["verdict"], inherited["candidates"]) == ("inherited", ["tgt.mod:Base"])

    status, out, err = cli(lab, "check", "labels")
    flat = " ".join(out.split())
    assert "drift: gone: tgt.mod:get_tokenizer_group is gone since the pin (tgt 1.0)" in flat, \
        out + err
    assert "get_tokenizer " not in flat and "get_tokenizer," not in flat
    assert ("drift: moved: tgt.mod:old_helper_name moved since the pin (tgt 1.0) to "
            "tgt.mod:new_helper_name") in flat
    assert ("drift: inherited: tgt.mod:Child.size is inherited from tgt.mod:Base since the pin"
            in flat)
    assert ("drift: moved: tgt.mod:relocated moved since the pin (tgt 1.0) to "
            "tgt.elsewhere:relocated (changed there too: see the diff)") in flat
    assert "+ out.append(row * 3)" in flat  # the diff, printed
    # the op's own line says inherited too; nothing says it is bound nowhere
    assert "Child.size is inherited from tgt.mod:Base: target that" in flat
    assert "not bound anywhere" not in flat


@pytest.mark.lab(target={"tgt/__init__.py": V1, "tgt/mod.py": MOD_V1},
                 patch={"bound.py": PATCH, "broken.py": BROKEN})
def test_pin_of_a_patch_whose_file_fails_to_load_fails_with_the_error(lab: Lab) -> None:
    status, out, err = cli(lab, "pin", "broken")
    assert status == 1, out + err
    flat = " ".join(out.split())
    assert "nothing to pin" not in flat
    assert "broken: not pinned: its file" in flat and "broken.py does not load" in flat
    assert "no_such_module_of_importpatch_tests" in flat  # the load error itself
    status, out, err = cli(lab, "pin", "broken", "--json")
    assert status == 1, err
    report = json.loads(out)
    assert report["ok"] is False
    assert "no_such_module_of_importpatch_tests" in report["pins"][0]["problem"]
    assert not (lab.patches / "broken.pin.toml").exists()
    # a patch that loads is still pinned beside the one that does not; the run still fails
    status, out, err = cli(lab, "pin", "broken", "twice-bound")
    assert status == 1 and (lab.patches / "bound.pin.toml").exists(), out + err


def legacy_digest(text: str) -> str:
    """How pins were made before issue 37: every blank and #-line dropped, strings included."""
    kept = [x.rstrip() for x in text.splitlines() if x.strip() and not x.strip().startswith("#")]
    return "sha256:" + hashlib.sha256(("\n".join(kept) + "\n").encode()).hexdigest()


def test_a_pin_written_before_is_compared_as_it_was_made(lab: Lab, tmp_path: Path) -> None:
    """An upgrade of importpatch reports no drift that is not there: an old pin (``sha256:``, of
    the first binding) of an unchanged target stays unchanged, at check and at import."""
    pin(lab, "twice-bound")
    path = lab.patches / "bound.pin.toml"
    first = {"tgt.mod:twice": "def twice():\n    return 1\n",
             "tgt.mod:kernel_source": MOD_V1.split("\n\n\n")[3] + "\n"}
    lines, target = [], ""
    for line in path.read_text().splitlines():
        if line.startswith("target = "):
            target = json.loads(line.partition("=")[2])
        if line.startswith("digest = ") and target in first:
            line = f'digest = "{legacy_digest(first[target])}"'
        lines.append(line)
    path.write_text("\n".join(lines) + "\n")
    assert path.read_text().count('digest = "sha256:') == 2
    d = check_drifts(lab, "twice-bound")
    assert d["tgt.mod:twice"]["verdict"] == "unchanged"
    assert d["tgt.mod:kernel_source"]["verdict"] == "unchanged"
    assert "drift []" in lab.ok(RUN, enable="twice-bound").stdout
