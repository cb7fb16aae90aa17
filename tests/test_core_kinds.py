"""Every kind of patch, applied by the real import hook in a child of the wheel venv:
replace, wrap, add, source diffs from .diff files, AST transforms."""

from __future__ import annotations

import textwrap

import pytest
from coreutil import EVENTS, Lab

TARGET = {
    "tpkg/__init__.py": "",
    "tpkg/mod.py": '''
        def f(x):
            return x + 1

        def g(a, b=2, *, c=3):
            """g doc."""
            return a + b + c

        LIMIT = 10

        class Old:
            def who(self):
                return "old"

        class C:
            def meth(self, x):
                """meth doc."""
                return ("meth", x)

            @staticmethod
            def st(x):
                return ("st", x)

            @classmethod
            def cm(cls, x):
                return ("cm", cls.__name__, x)

            @property
            def prop(self):
                return "prop"

            @property
            def whole(self):
                return "whole"
        ''',
}


def test_replace_function_class_attribute_method_staticmethod_classmethod_property(
    lab: Lab,
) -> None:
    lab.target(TARGET).patch({"kinds.py": '''
        from importpatch import Patch
        p = Patch("kinds")

        @p.replace("tpkg.mod:f")
        def f(x):
            return x + 100

        @p.replace("tpkg.mod:Old")
        class New:
            def who(self):
                return "new"

        p.replace("tpkg.mod:LIMIT", 99)

        @p.replace("tpkg.mod:C.meth")
        def meth(self, x):
            return ("METH", x)

        @p.replace("tpkg.mod:C.st")
        def st(x):
            return ("ST", x)

        @p.replace("tpkg.mod:C.cm")
        def cm(cls, x):
            return ("CM", cls.__name__, x)

        @p.replace("tpkg.mod:C.prop")  # stands in for the getter; @property is re-applied
        def prop(self):
            return "PROP"

        @p.replace("tpkg.mod:C.whole", decorated=True)
        @property
        def whole(self):
            return "WHOLE"
        '''})
    out = lab.json('''
        import json, tpkg.mod as m
        c = m.C()
        print(json.dumps([
            m.f(1), m.Old().who(), m.LIMIT, c.meth(1), m.C.st(1), c.st(2), m.C.cm(1), c.cm(2),
            c.prop, c.whole, type(m.C.__dict__["st"]).__name__, type(m.C.__dict__["cm"]).__name__,
            type(m.C.__dict__["prop"]).__name__,
        ]))
        ''', enable="kinds")
    assert out == [
        101, "new", 99, ["METH", 1], ["ST", 1], ["ST", 2], ["CM", "C", 1], ["CM", "C", 2],
        "PROP", "WHOLE", "staticmethod", "classmethod", "property",
    ]


def test_wrap_keeps_signature_name_doc_wrapped_and_binds_methods(lab: Lab) -> None:
    lab.target(TARGET).patch({"w.py": '''
        from importpatch import Patch
        p = Patch("w")

        @p.wrap("tpkg.mod:g")
        def wg(wrapped, instance, args, kwargs):
            return ["wrapped", instance, wrapped(*args, **kwargs)]

        @p.wrap("tpkg.mod:C.meth")
        def wm(wrapped, instance, args, kwargs):
            return [type(instance).__name__, list(args), wrapped(*args, **kwargs)]

        @p.wrap("tpkg.mod:C.st")
        def ws(wrapped, instance, args, kwargs):
            return ["st-wrapped", wrapped(*args, **kwargs)]
        '''})
    out = lab.json('''
        import inspect, json, tpkg.mod as m
        c = m.C()
        print(json.dumps({
            "call": m.g(1, c=10),
            "sig": str(inspect.signature(m.g)),
            "name": [m.g.__name__, m.g.__qualname__, m.C.meth.__name__],
            "doc": [m.g.__doc__, m.C.meth.__doc__],
            "unwrapped": m.g.__wrapped__(1),
            "bound": c.meth(5),
            "unbound": m.C.meth(c, 6),
            "bound_sig": str(inspect.signature(c.meth)),
            "static": [m.C.st(7), c.st(8)],
        }))
        ''', enable="w")
    assert out == {
        "call": ["wrapped", None, 13],
        "sig": "(a, b=2, *, c=3)",
        "name": ["g", "g", "meth"],
        "doc": ["g doc.", "meth doc."],
        "unwrapped": 6,
        "bound": ["C", [5], ["meth", 5]],
        "unbound": ["C", [6], ["meth", 6]],
        "bound_sig": "(x)",
        "static": [["st-wrapped", ["st", 7]], ["st-wrapped", ["st", 8]]],
    }


# The opcodes one call runs in the frame of a wrap (the generated function around the wrapper),
# counted by tracing that frame alone: a structural stand-in for its instruction cost (issue 35)
# that needs no callgrind and holds on every Python.
OPCODES_OF_ONE_CALL = """
import dis, sys
def opcodes(func, call):
    code, seen = func.__code__, []
    def trace(frame, event, arg):
        if frame.f_code is not code:
            return None
        frame.f_trace_opcodes = True
        if event == "opcode":
            seen.append(dis.opname[code.co_code[frame.f_lasti]])
        return trace
    sys.settrace(trace)
    try:
        call()
    finally:
        sys.settrace(None)
    return seen
def _warm():
    return None
opcodes(_warm, _warm)  # 3.12.1 traces no opcode in the first frame it ever traces
"""


def test_a_method_wrap_binds_the_original_with_one_call_and_no_lookup(lab: Lab) -> None:
    """Per call a method wrap's frame runs what a function wrap's runs and one call more, the
    binding of the original to ``self``; nothing is looked up by name or attribute (it was
    ``original.__get__(self, type(self))``: an attribute, a global and two calls, +3,007
    instructions a call where the frame now costs +2,576 on 3.11). The wrapper still gets the
    original bound to the instance."""
    lab.target(TARGET).patch({"w.py": '''
        from importpatch import Patch
        p = Patch("w")

        @p.wrap("tpkg.mod:f")
        def wf(wrapped, instance, args, kwargs):
            return wrapped(*args, **kwargs)

        @p.wrap("tpkg.mod:C.meth")
        def wm(wrapped, instance, args, kwargs):
            return [wrapped.__self__ is instance, wrapped.__func__.__qualname__,
                    wrapped(*args, **kwargs)]

        @p.wrap("tpkg.mod:C.cm")
        def wc(wrapped, instance, args, kwargs):
            return [wrapped.__self__ is instance, wrapped.__func__.__qualname__,
                    wrapped(*args, **kwargs)]
        '''})
    out = lab.json(OPCODES_OF_ONE_CALL + textwrap.dedent('''
        import json, tpkg.mod as m
        c = m.C()
        function = opcodes(m.f, lambda: m.f(1))
        method = opcodes(vars(m.C)["meth"], lambda: c.meth(1))
        classmethod_ = opcodes(vars(m.C)["cm"].__func__, lambda: c.cm(1))
        print(json.dumps({"function": function, "method": method, "classmethod": classmethod_,
                          "seen": [c.meth(1), c.cm(2)]}))
        '''), enable="w")

    def calls(ops: list[str]) -> int:
        return sum(op.startswith("CALL") for op in ops)

    assert out["function"] and calls(out["function"]) == 1, out["function"]
    for kind in ("method", "classmethod"):
        ops = out[kind]
        assert calls(ops) == calls(out["function"]) + 1, (kind, ops)
        looked_up = [op for op in ops if op in ("LOAD_GLOBAL", "LOAD_NAME", "LOAD_ATTR",
                                                "LOAD_METHOD", "LOAD_SUPER_ATTR")]
        assert looked_up == [], (kind, ops)
    # the original bound to the instance (to the class for a classmethod, whose instance is it)
    assert out["seen"] == [[True, "C.meth", ["meth", 1]], [True, "C.cm", ["cm", "C", 2]]]


def test_wraps_of_several_patches_nest_by_order_then_patch_name(lab: Lab) -> None:
    wrappers = "".join(
        f'{name[0]} = Patch("{name}")\n'
        f'@{name[0]}.wrap("tpkg.mod:f", order={order})\n'
        f"def w_{name[0]}(wrapped, instance, args, kwargs):\n"
        f'    return "{name}(" + str(wrapped(*args, **kwargs)) + ")"\n'
        for name, order in (("b-wrap", 0), ("a-wrap", 0), ("z-first", -1), ("c-last", 5))
    )
    lab.target(TARGET).patch({"wraps.py": "from importpatch import Patch\n" + wrappers})
    # innermost first: order -1, then order 0 by name (a, b), then order 5
    expected = "c-last(b-wrap(a-wrap(z-first(2))))"
    for enable in ("all", "c-last,b-wrap,a-wrap,z-first", "z-first a-wrap c-last b-wrap"):
        proc = lab.ok("import tpkg.mod as m; print(m.f(1))", enable=enable)
        assert proc.stdout.strip() == expected, enable


def test_add_puts_new_names_on_module_and_class(lab: Lab) -> None:
    lab.target(TARGET).patch({"adds.py": '''
        from importpatch import Patch
        p = Patch("adds")

        @p.add("tpkg.mod:helper")
        def helper():
            return "helper"

        @p.add("tpkg.mod:C.extra")
        def extra(self):
            return ["extra", type(self).__name__]

        p.add("tpkg.mod:NEW_CONST", 7)
        '''})
    out = lab.json(f'''
        import json, importpatch.events, tpkg.mod as m
        print(json.dumps([m.helper(), m.C().extra(), m.NEW_CONST, {EVENTS}]))
        ''', enable="adds")
    assert out[:3] == ["helper", ["extra", "C"], 7]
    targets = sorted(e[2] for e in out[3] if e[0] == "applied")
    assert targets == ["tpkg.mod:C.extra", "tpkg.mod:NEW_CONST", "tpkg.mod:helper"]


@pytest.mark.parametrize(
    ("target", "message"),
    [("tpkg.mod:LIMIT", "add LIMIT: the module defines that name itself"),
     ("tpkg.mod:C.meth", "add C.meth: 'meth' already exists")],
)
def test_add_of_an_existing_name_fails_the_import(lab: Lab, target: str, message: str) -> None:
    lab.target(TARGET).patch({"clash.py": f'''
        from importpatch import Patch
        Patch("clash").add("{target}", 1)
        '''})
    out = lab.json('''
        import json, sys
        try:
            import tpkg.mod
        except ImportError as exc:
            print(json.dumps([type(exc).__name__, str(exc), "tpkg.mod" in sys.modules]))
        ''', enable="clash")
    assert out[0] == "PatchError"
    assert "patch 'clash'" in out[1] and message in out[1], out[1]
    assert out[2] is False


DPKG: dict[str, str | bytes] = {
    "dpkg/__init__.py": "",
    "dpkg/one.py": 'def a():\n    return "a"\n\n\ndef b():\n    return "b"\n',
    "dpkg/crlf.py": b'def c():\r\n    return "c"\r\n\r\nX = 1\r\n',
    "dpkg/nonl.py": b'def d():\n    return "d"',
    "dpkg/uni.py": '# -*- coding: utf-8 -*-\ndef e():\n    return "h\u00e9llo"\n',
}

MULTI_DIFF = '''\
Name: multi-fix
Requires: packaging>=20
Default: on
Summary: four files in one diff

diff --git a/dpkg/one.py b/dpkg/one.py
--- a/dpkg/one.py
+++ b/dpkg/one.py
@@ -1,3 +1,3 @@
 def a():
-    return "a"
+    return "A"

@@ -5,2 +5,2 @@
 def b():
-    return "b"
+    return "B"
diff --git a/dpkg/crlf.py b/dpkg/crlf.py
--- a/dpkg/crlf.py
+++ b/dpkg/crlf.py
@@ -1,3 +1,3 @@
 def c():
-    return "c"
+    return "C"

diff --git a/dpkg/nonl.py b/dpkg/nonl.py
--- a/dpkg/nonl.py
+++ b/dpkg/nonl.py
@@ -1,2 +1,2 @@
 def d():
-    return "d"
\\ No newline at end of file
+    return "D"
\\ No newline at end of file
diff --git a/dpkg/uni.py b/dpkg/uni.py
--- a/dpkg/uni.py
+++ b/dpkg/uni.py
@@ -2,2 +2,2 @@
 def e():
-    return "h\u00e9llo"
+    return "h\u00e9llo w\u00f6rld \u2713"
'''

READ_DPKG = f'''
    import json, importpatch.events
    import dpkg.one as o, dpkg.crlf as c, dpkg.nonl as n, dpkg.uni as u
    import inspect
    with open(c.c.__code__.co_filename, "rb") as f:  # the published patched text
        published = f.read().decode()
    print(json.dumps([o.a(), o.b(), c.c(), n.d(), u.e(), published, {EVENTS}]))
    '''


def test_diff_file_applies_to_several_files_crlf_no_final_newline_and_non_ascii(lab: Lab) -> None:
    lab.target(DPKG).patch({"multi.diff": MULTI_DIFF})
    out = lab.json(READ_DPKG, enable="multi-fix")
    assert out[:5] == ["A", "B", "C", "D", "h\u00e9llo w\u00f6rld \u2713"]
    assert out[5] == 'def c():\r\n    return "C"\r\n\r\nX = 1\r\n'  # still CRLF
    applied = [(e[1], e[2], e[3]) for e in out[6] if e[0] == "applied"]
    assert applied == [("multi-fix", f"dpkg.{m}", "source-diff")
                       for m in ("one", "crlf", "nonl", "uni")]


def test_diff_header_name_default_and_requires_are_honoured(lab: Lab) -> None:
    unmet = MULTI_DIFF.replace("Name: multi-fix", "Name: needs-old").replace(
        "Requires: packaging>=20", "Requires: packaging<1"
    )
    lab.target(DPKG).patch({"multi.diff": MULTI_DIFF, "unmet.diff": unmet})
    # Default: on -> applied with no IMPORTPATCH_ENABLE at all; the file stem is not the name
    out = lab.json(READ_DPKG, enable=None)
    assert out[:5] == ["A", "B", "C", "D", "h\u00e9llo w\u00f6rld \u2713"]
    skipped = {(e[1], e[3]) for e in out[6] if e[0] == "skipped"}
    assert skipped == {("needs-old", "version")}
    proc = lab.ok(
        "import importpatch.events as ev, dpkg.one;"
        "print([e['detail'] for e in ev.events() if e['outcome'] == 'skipped'])",
        enable=None,
    )
    assert "requires packaging<1, installed packaging" in proc.stdout
    # named in IMPORTPATCH_DISABLE: off although on by default
    out = lab.json(READ_DPKG, enable=None, env={"IMPORTPATCH_DISABLE": "multi-fix"})
    assert out[:5] == ["a", "b", "c", "d", "h\u00e9llo"]


def test_ast_transform_keeps_lines_of_untouched_code(lab: Lab) -> None:
    lab.target({
        "xpkg/__init__.py": "",
        "xpkg/m.py": '''
            def top(a):
                x = a * 2
                y = x + 1
                return y


            def below():
                raise ValueError("below")
            ''',
    }).patch({"tr.py": '''
        import ast
        from importpatch import Patch
        p = Patch("tr")

        @p.transform("xpkg.m")
        def fewer_lines(tree):
            for node in ast.walk(tree):
                if isinstance(node, ast.FunctionDef) and node.name == "top":
                    node.body = [ast.Return(ast.Constant(42))]
            return tree
        '''})
    code = '''
        import json, traceback, xpkg.m as m
        try:
            m.below()
        except ValueError as exc:
            tb = traceback.extract_tb(exc.__traceback__)[-1]
        print(json.dumps([m.top(1), m.below.__code__.co_firstlineno, tb.lineno, tb.line]))
        '''
    patched = lab.json(code, enable="tr")
    original = lab.json(code, enable=None)
    assert patched[0] == 42 and original[0] == 3
    assert patched[1:] == original[1:] == [8, 9, 'raise ValueError("below")']
