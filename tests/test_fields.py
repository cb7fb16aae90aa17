"""Class-body fields (issue 12, item 2): ``Patch.field`` writes a member into the class body before
the class statement runs, so a dataclass, NamedTuple, TypedDict or Enum is built with it (vLLM's
msgspec ``SamplingParams`` is proved in tests/test_vllm_ports.py); ``importpatch diff`` shows only
the inserted or changed lines; ``check`` flags an ``add`` of a value to such a class."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import Venv, clean_env
from coreutil import COMPILE_SPY, Lab

from importpatch.rewrite.facts import HOOKS

MODELS = '''\
import dataclasses
import enum
import typing


@dataclasses.dataclass
class Params:
    """Sampling parameters."""

    n: int
    # the temperature
    temperature: float = 1.0  # the usual
    top_k: int = -1
    """Top k."""

    def describe(self):
        return f"{self.n}/{self.temperature}"


class Point(typing.NamedTuple):
    x: int
    y: int = 0


class Movie(typing.TypedDict):
    title: str


class Color(enum.Enum):
    RED = 1
    GREEN = 2
'''

TARGET = {"fpkg/__init__.py": "", "fpkg/models.py": MODELS}

PATCH = {"fields_patch.py": '''
    import os
    from importpatch import Patch


    class Marker:
        def __init__(self, text):
            self.text = text


    MARKER = Marker(os.environ.get("FIELD_MARK", "a"))

    p = Patch("fields")
    p.field("fpkg.models:Params.banned", "list[int] | None", None)
    p.field("fpkg.models:Params.seed", "int")                 # no default: before the defaults
    p.field("fpkg.models:Params.marker", "object", MARKER)    # not a literal: stays an object
    p.field("fpkg.models:Params.temperature", default=0.5, existing=True)
    p.field("fpkg.models:Point.z", "int", 5)
    p.field("fpkg.models:Movie.year", "int")
    p.field("fpkg.models:Color.BLUE", None, 3)                # an Enum member: no annotation
    '''}


pytestmark = pytest.mark.lab(target=TARGET, patch=PATCH)


def test_fields_are_part_of_the_class_when_it_is_built(lab: Lab) -> None:
    out = lab.json('''
        import dataclasses, json, sys
        import fpkg.models as m
        patch = next(v for k, v in sys.modules.items() if "fields_patch" in k)
        params = m.Params(1, 7, banned=[3])
        print(json.dumps({
            "params": [f.name for f in dataclasses.fields(m.Params)],
            "values": [params.seed, params.temperature, params.banned, params.marker.text],
            "marker_is_the_patch_object": params.marker is patch.MARKER,
            "point": [list(m.Point._fields), m.Point(1).z],
            "movie": list(m.Movie.__annotations__),
            "color": [c.name for c in m.Color],
            "events": [[e["patch"], e["target"], e["how"]] for e in
                       __import__("importpatch").applied()],
        }))
        ''', enable="fields")
    assert out["params"] == ["n", "seed", "temperature", "top_k", "banned", "marker"]
    assert out["values"] == [7, 0.5, [3], "a"]
    assert out["marker_is_the_patch_object"]
    assert out["point"] == [["x", "y", "z"], 5]
    assert out["movie"] == ["title", "year"]
    assert out["color"] == ["RED", "GREEN", "BLUE"]
    assert sorted(out["events"]) == sorted(
        ["fields", f"fpkg.models:{q}", "class-body"]
        for q in ("Params.banned", "Params.seed", "Params.marker", "Params.temperature",
                  "Point.z", "Movie.year", "Color.BLUE"))


def test_diff_shows_only_the_written_lines_and_keeps_comments(lab: Lab) -> None:
    proc = lab.ok([str(lab.venv.script("importpatch")), "diff", "fields"], enable="fields")
    changed = [line for line in proc.stdout.splitlines()
               if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    hook = f"{HOOKS}.value('fpkg.models', 'Params.marker')"
    assert changed == [
        "+    seed: int",
        "-    temperature: float = 1.0  # the usual",
        "+    temperature: float = 0.5  # the usual",
        "+    banned: list[int] | None = None",
        f"+    marker: object = {hook}",
        "+    z: int = 5",
        "+    year: int",
        "+    BLUE = 3",
    ]
    # The member without a default goes above the comment that introduces the first member with
    # one; a new member goes after the last one and the string that documents it.
    assert "     n: int\n+    seed: int\n     # the temperature\n" in proc.stdout
    assert '     """Top k."""\n+    banned: list[int] | None = None\n' in proc.stdout


COUNT = COMPILE_SPY + '''
import json, sys
import fpkg.models as m
print(json.dumps([compiles, m.Params(1, 2).marker.text]))
'''


def test_a_default_object_stays_out_of_the_cached_code(lab: Lab) -> None:
    """The code names the field, never the object: the second process loads the cached code and
    still gets its own patch's object (here made from a variable that changed in between)."""
    first = lab.json(COUNT, enable="fields", env={"FIELD_MARK": "first"})
    second = lab.json(COUNT, enable="fields", env={"FIELD_MARK": "second"})
    assert first == [["fpkg.models"], "first"]
    assert second == [[], "second"]


@pytest.mark.parametrize(("decl", "message"), [
    ('p.field("fpkg.models:Missing.x", "int", 1)',
     "field Missing.x: class Missing not found (no class statement binds it)"),
    ('p.field("fpkg.models:Params.top_k", "int", 3)',
     "field Params.top_k: Params.top_k already exists (line 13); use existing=True to change "
     "its default"),
    ('p.field("fpkg.models:Params.nope", default=3, existing=True)',
     "field Params.nope: Params.nope is not assigned in the class body (line 7); use "
     "existing=False to add it"),
    ('p.field("fpkg.models:Params.describe", default=3, existing=True)',
     "field Params.describe: Params.describe is bound by a FunctionDef statement at line 16, "
     "not a plain 'name = value' or 'name: type = value' (use replace)"),
])
def test_a_field_that_cannot_be_written_fails_the_import_and_check_alike(
        wheel_venv: Venv, tmp_path: Path, decl: str, message: str) -> None:
    lab = Lab(wheel_venv, tmp_path).target(TARGET).patch({"bad.py": f'''
        from importpatch import Patch
        p = Patch("bad-field")
        {decl}
        '''})
    proc = lab.run("import fpkg.models", enable="bad-field")
    assert proc.returncode == 1
    assert "PatchError: importpatch: patch 'bad-field' cannot apply to fpkg.models" in proc.stderr
    assert message in proc.stderr
    check = lab.run([str(wheel_venv.script("importpatch")), "check", "bad-field", "--json"],
                    enable="bad-field")
    assert check.returncode == 1
    (op,) = json.loads(check.stdout)["patches"][0]["ops"]
    assert op["status"] == "fail" and op["detail"] == message


def test_check_describes_each_field(lab: Lab) -> None:
    proc = lab.ok([str(lab.venv.script("importpatch")), "check", "fields", "--json"],
                  enable="fields")
    details = [op["detail"] for op in json.loads(proc.stdout)["patches"][0]["ops"]]
    assert details == [
        "writes 'banned: list[int] | None = None' into the body of class Params",
        "writes 'seed: int' into the body of class Params",
        "writes 'marker: object = <the patch's Marker object>' into the body of class Params",
        "changes the default 0.5 of Params.temperature in place",
        "writes 'z: int = 5' into the body of class Point",
        "writes 'year: int' into the body of class Movie",
        "writes 'BLUE = 3' into the body of class Color",
    ]


COLLECTING = '''\
import dataclasses
import enum
import typing

import msgspec
import pydantic
from attrs import define


class Plain:
    pass


@dataclasses.dataclass
class DC:
    a: int = 1


class NT(typing.NamedTuple):
    a: int


class TD(typing.TypedDict):
    a: int


class E(enum.IntEnum):
    A = 1


class Sampling(msgspec.Struct, omit_defaults=True):
    a: int = 1


class Model(pydantic.BaseModel):
    a: int = 1


class SubModel(Model):
    b: int = 2


@define
class Attrs:
    a: int = 1
'''


def test_check_flags_an_add_of_a_value_to_a_class_that_collects_fields(
        wheel_venv: Venv, tmp_path: Path) -> None:
    """Read from the source only (msgspec, pydantic and attrs are not even installed)."""
    adds = "\n".join(f'p.add("cpkg.kinds:{c}.new", None)' for c in
                     ("Plain", "DC", "NT", "TD", "E", "Sampling", "Model", "SubModel", "Attrs"))
    lab = Lab(wheel_venv, tmp_path).target({"cpkg/__init__.py": "",
                                            "cpkg/kinds.py": COLLECTING}).patch({"adds.py": f'''
from importpatch import Patch
p = Patch("adds")
{adds}
p.add("cpkg.kinds:DC.method", lambda self: 1)   # a method: fine after the class is built
'''})
    proc = lab.ok([str(wheel_venv.script("importpatch")), "check", "adds", "--json"],
                  enable="adds")
    ops = json.loads(proc.stdout)["patches"][0]["ops"]
    verdicts = {op["target"].split(":")[1]: (op["status"], op["detail"]) for op in ops}
    assert verdicts["Plain.new"] == ("ok", "Plain.new is free")
    assert verdicts["DC.method"][0] == "warn"  # a class decorator may set it: as before
    assert "field" not in verdicts["DC.method"][1]
    def line(text: str) -> int:
        return COLLECTING.splitlines().index(text) + 1

    model = ("class Model is a pydantic model (base pydantic.BaseModel, line "
             f"{line('class Model(pydantic.BaseModel):')})")
    why = {
        "DC.new": f"class DC is a dataclass (decorator at line {line('class DC:') - 1})",
        "NT.new": f"class NT is a NamedTuple (base typing.NamedTuple, line "
                  f"{line('class NT(typing.NamedTuple):')})",
        "TD.new": f"class TD is a TypedDict (base typing.TypedDict, line "
                  f"{line('class TD(typing.TypedDict):')})",
        "E.new": f"class E is an Enum (base enum.IntEnum, line {line('class E(enum.IntEnum):')})",
        "Sampling.new": "class Sampling is a msgspec.Struct (base msgspec.Struct, line "
                        f"{line('class Sampling(msgspec.Struct, omit_defaults=True):')})",
        "Model.new": model,
        "SubModel.new": f"class SubModel derives from Model: {model}",
        "Attrs.new": f"class Attrs is an attrs class (decorator at line "
                     f"{line('class Attrs:') - 1})",
    }
    for target, reason in why.items():
        status, detail = verdicts[target]
        assert status == "warn", target
        assert detail == (
            f"{reason}: its fields are collected when the class is built, and add sets the "
            "attribute afterwards (a class attribute, not a field); to add a field use "
            f"patch.field('cpkg.kinds:{target}', annotation, default)"), target


@pytest.mark.parametrize(("call", "message"), [
    ('p.field("m:C.x", "list[int", None)', "annotation 'list[int' is not one Python expression"),
    ('p.field("m:C.x", "int  # why", None)', "is not one Python expression (a comment)"),
    ('p.field("m:C.x")', "field m:C.x: give an annotation, a default or both"),
    ('p.field("m:x", "int", 1)', "field target 'm:x' must name a class member"),
    ('p.replace("m:f", 42, original=True)', "replace m:f with original=True needs a callable"),
])
def test_declaration_errors_are_clear(wheel_venv: Venv, call: str, message: str) -> None:
    proc = wheel_venv.run(f"from importpatch import Patch\np = Patch('d')\n{call}")
    assert proc.returncode == 1
    assert "DeclarationError: patch d: " in proc.stderr and message in proc.stderr, proc.stderr


def test_a_field_is_refused_late_with_a_message(lab: Lab) -> None:
    """The class was built before patching started: no field can be added to it any more."""
    out = lab.json('''
        import json
        import fpkg.models as m
        import importpatch
        importpatch.enable("fields")
        print(json.dumps([[e["outcome"], e["detail"]] for e in importpatch.events.events()
                          if e["patch"] == "fields"][:1] + [hasattr(m.Params, "banned")]))
        ''', enable=None)
    (outcome, detail), has_field = out
    assert outcome == "failed" and not has_field
    assert detail.startswith("field patches apply only when the module is imported")


def test_fields_apply_to_crlf_files_and_to_every_class_statement(
        wheel_venv: Venv, tmp_path: Path) -> None:
    source = ("import dataclasses\nimport sys\n\nif sys.version_info >= (3,):\n"
              "    @dataclasses.dataclass\n    class P:\n        a: int = 1\nelse:\n"
              "    @dataclasses.dataclass\n    class P:\n        a: int = 2\n")
    lab = Lab(wheel_venv, tmp_path).target({
        "crlf/__init__.py": "", "crlf/m.py": source.replace("\n", "\r\n").encode(),
    }).patch({"c.py": '''
        from importpatch import Patch
        Patch("crlf").field("crlf.m:P.b", "int", 3)
        '''})
    out = lab.json('''
        import dataclasses, inspect, json
        import crlf.m as m
        print(json.dumps([[f.name for f in dataclasses.fields(m.P)], m.P().b]))
        ''', enable="crlf")
    assert out == [["a", "b"], 3]
    diff = lab.ok([str(wheel_venv.script("importpatch")), "diff", "crlf", "--json"],
                  enable="crlf")
    text = json.loads(diff.stdout)["modules"][0]["diff"]
    added = [line for line in text.split("\n") if line.startswith("+ ")]
    assert added == ["+        b: int = 3\r", "+        b: int = 3\r"]  # CRLF, as the file


def test_field_events_reach_status(lab: Lab) -> None:
    events = lab.root / "events"
    lab.ok("import fpkg.models", enable="fields", env={"IMPORTPATCH_EVENTS_DIR": str(events)})
    proc = subprocess.run([str(lab.venv.script("importpatch")), "status", "--json",
                           "--events-dir", str(events)], capture_output=True, text=True,
                          env=clean_env(), check=True)
    status = json.loads(proc.stdout)
    assert status["patches"]["fields"]["applied"] == 7


def test_the_hooks_address_the_compiled_code_carries_is_the_activation_module() -> None:
    """The rewrite names the run-time hooks by a string (rewrite/facts.py) so that it never
    imports the stage after it; the string must still reach importpatch.install.activation,
    whose ``begin``/``land``/``value``/``done`` the compiled code calls."""
    import importpatch.install.activation as activation

    hooks = eval(HOOKS)  # noqa: S307 - our own constant, as the compiled code evaluates it
    assert hooks is activation
    assert all(callable(getattr(hooks, f)) for f in ("begin", "land", "value", "done"))
