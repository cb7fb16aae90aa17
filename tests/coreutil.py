"""Helpers for tests/test_core_*.py: a scratch folder of target packages and patch files, and
child interpreters of a real venv (the session's wheel venv unless told otherwise) that see them.

A ``Lab`` run gets PYTHONPATH=<targets>, IMPORTPATCH_PATH=<patches>, IMPORTPATCH_ENABLE=<enable>
(default "all"; None leaves it unset) and a cache folder of its own (IMPORTPATCH_CACHE_DIR and
XDG_CACHE_HOME), so no test reads or writes ~/.cache or sees another test's patches.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from conftest import Venv

Files = Mapping[str, "str | bytes"]


def write_tree(root: Path, files: Files) -> Path:
    """Write ``files`` (relative path -> text, dedented, or exact bytes) under ``root``."""
    for rel, content in files.items():
        dest = root / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            dest.write_bytes(content)
        else:
            dest.write_text(textwrap.dedent(content), encoding="utf-8")
    return root


class Lab:
    def __init__(self, venv: Venv, root: Path) -> None:
        self.venv = venv
        self.root = root
        self.targets = root / "targets"
        self.patches = root / "patches"
        self.cache = root / "cache"
        for d in (self.targets, self.patches):
            d.mkdir(parents=True, exist_ok=True)

    def target(self, files: Files) -> Lab:
        write_tree(self.targets, files)
        return self

    def patch(self, files: Files) -> Lab:
        write_tree(self.patches, files)
        return self

    def env(self, enable: str | None = "all", extra: Mapping[str, str | None] | None = None
            ) -> dict[str, str | None]:
        env: dict[str, str | None] = {
            "PYTHONPATH": str(self.targets),
            "IMPORTPATCH_PATH": str(self.patches),
            "IMPORTPATCH_ENABLE": enable,
            "IMPORTPATCH_CACHE_DIR": str(self.cache),
            "XDG_CACHE_HOME": str(self.root / "xdg"),
            # A declaration is cut off after 20 s without progress (the default): on a loaded CI
            # machine a child interpreter can starve that long, which made an unrelated test
            # fail. The tests of the limit set their own (tests/test_start.py).
            "IMPORTPATCH_DISCOVERY_TIMEOUT": "120",
        }
        env.update(extra or {})
        return env

    def run(
        self,
        code_or_args: str | Sequence[str | os.PathLike[str]],
        *,
        enable: str | None = "all",
        env: Mapping[str, str | None] | None = None,
        venv: Venv | None = None,
        flags: Sequence[str] = (),
        timeout: float = 120,
    ) -> subprocess.CompletedProcess[str]:
        """``python *FLAGS -c CODE`` (dedented) or ``python *FLAGS *ARGS`` in the lab's folder."""
        if isinstance(code_or_args, str):
            args: list[str | os.PathLike[str]] = ["-c", textwrap.dedent(code_or_args)]
        else:
            args = list(code_or_args)
        return (venv or self.venv).run(
            [*flags, *args], env=self.env(enable, env), cwd=self.root, timeout=timeout
        )

    def ok(self, code_or_args: str | Sequence[str | os.PathLike[str]], **kw: Any
           ) -> subprocess.CompletedProcess[str]:
        proc = self.run(code_or_args, **kw)
        assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        return proc

    def json(self, code: str, **kw: Any) -> Any:
        """Run ``code``; it prints one JSON document as its last line of output."""
        proc = self.ok(code, **kw)
        return json.loads(proc.stdout.strip().splitlines()[-1])


# Printed by child code: what importpatch recorded in that process, as JSON-able tuples.
EVENTS = "[[e['outcome'], e['patch'], e['target'], e['how']] for e in importpatch.events.events()]"

# Child code, put first in a script: from here on ``compiles`` lists the module names that the
# loader's compile step (the only place patched code is compiled) compiles, in order; an import
# served from the bytecode cache adds nothing. The one copy of this spy (the module moves: here).
COMPILE_SPY = """\
import importpatch.rewrite.transforms as _spied_transforms
compiles = []
_compile_module = _spied_transforms.compile_module
def _counting_compile(*args, **kwargs):
    compiles.append(args[0])
    return _compile_module(*args, **kwargs)
_spied_transforms.compile_module = _counting_compile
"""


def write_wheel(
    path: Path,
    dist: str,
    version: str,
    files: Mapping[str, str | bytes],
    *,
    entry_points: str = "",
    top_level: Sequence[str] = (),
) -> Path:
    """Write a pure-Python wheel by hand at ``path`` (the ``.whl`` file), per the binary
    distribution format spec: ``files`` as given, a ``.dist-info`` with METADATA (Name ``dist``),
    WHEEL, entry_points.txt / top_level.txt when given, and a RECORD with a sha256 per file."""
    import base64
    import hashlib
    import zipfile

    info = f"{dist.replace('-', '_')}-{version}.dist-info"
    data = {rel: blob if isinstance(blob, bytes) else blob.encode() for rel, blob in files.items()}
    data[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n".encode()
    data[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    if entry_points:
        data[f"{info}/entry_points.txt"] = entry_points.encode()
    if top_level:
        data[f"{info}/top_level.txt"] = "".join(f"{t}\n" for t in top_level).encode()
    record = []
    for rel, blob in data.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(blob).digest()).rstrip(b"=").decode()
        record.append(f"{rel},sha256={digest},{len(blob)}")
    data[f"{info}/RECORD"] = ("\n".join([*record, f"{info}/RECORD,,"]) + "\n").encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for rel, blob in data.items():
            zf.writestr(rel, blob)
    return path


def install_dist(
    venv: Venv,
    dest: Path,
    dist: str,
    version: str,
    files: Mapping[str, str],
    *,
    entry_points: str = "",
    top_level: Sequence[str] = (),
) -> Path:
    """Build a tiny wheel of ``files`` (dedented) by hand and ``pip install --target dest`` it (a
    real install: pip writes the .dist-info with its RECORD, entry points and top_level.txt)."""
    norm = dist.replace("-", "_")
    wheel = write_wheel(
        dest.parent / f"{norm}-{version}-py3-none-any.whl", dist, version,
        {rel: textwrap.dedent(text) for rel, text in files.items()},
        entry_points=textwrap.dedent(entry_points), top_level=top_level,
    )
    venv.pip("install", "--no-deps", "--no-index", "--disable-pip-version-check", "-q",
             "--target", str(dest), str(wheel))
    return dest / f"{norm}-{version}.dist-info"
