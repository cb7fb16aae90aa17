"""Helpers shared by test_cache.py and test_faults.py: child scripts that count compiles, read
the cache back, and run a child with folders mounted read-only. Real processes, no mocks."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from conftest import Venv, clean_env
from coreutil import COMPILE_SPY

# Imports the modules named in argv with a counter around the loader's compile step (the only
# place patched code is compiled), then prints what happened as one JSON line.
COUNTED_IMPORT = COMPILE_SPY + textwrap.dedent(
    """
    import importlib, json, sys
    out = {}
    for name in sys.argv[1:]:
        out[name] = importlib.import_module(name).f()
    print(json.dumps({"compiles": compiles, "values": out}))
    """
)

# argv[1]: cache root. Prints the entries that fail bytecache.load and the stray files.
VALIDATE = textwrap.dedent(
    """
    import json, os, sys
    from importpatch.load import bytecache
    root = sys.argv[1]
    bad, good, stray = [], 0, []
    for folder, _, names in os.walk(os.path.join(root, "code")):
        for name in names:
            path = os.path.join(folder, name)
            if not name.endswith(".ipc"):
                stray.append(path)
                continue
            key = bytes.fromhex(os.path.basename(folder) + name[:-4])
            if bytecache.load(root, key) is None:
                bad.append(path)
            else:
                good += 1
    print(json.dumps({"good": good, "bad": bad, "stray": stray}))
    """
)

DIFF_TEMPLATE = """\
Name: {name}
--- a/{path}
+++ b/{path}
@@ -1,3 +1,3 @@
 def f():
-    return {old}
+    return {new}

"""


def diff_patch(folder: Path, name: str, module: str, old: str, new: str) -> Path:
    """A .diff patch file changing ``return OLD`` on line 2 of ``module`` into ``return NEW`` (line
    3 must be blank: it is the hunk's trailing context, without which the hunk would be bound to
    the end of the file, as git apply binds it)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.diff"
    rel = module.replace(".", "/") + ".py"
    path.write_text(DIFF_TEMPLATE.format(name=name, path=rel, old=old, new=new), encoding="utf-8")
    return path


def patch_env(
    patches: Path, cache: Path, enable: str, **extra: str | None
) -> dict[str, str | None]:
    env: dict[str, str | None] = {
        "IMPORTPATCH_PATH": str(patches),
        "IMPORTPATCH_CACHE_DIR": str(cache),
        "IMPORTPATCH_ENABLE": enable,
    }
    env.update(extra)
    return env


def counted_import(
    venv: Venv, modules: Sequence[str], env: Mapping[str, str | None], target: Path
) -> dict[str, Any]:
    """Import ``modules`` in a child of ``venv`` (``target`` on PYTHONPATH); returns
    ``{"compiles": [module, ...], "values": {module: f()}, "stderr": ...}``."""
    proc = venv.run(["-c", COUNTED_IMPORT, *modules], env={**env, "PYTHONPATH": str(target)})
    assert proc.returncode == 0, proc.stderr
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    out["stderr"] = proc.stderr
    return out


def validate_cache(venv: Venv, root: Path) -> dict[str, Any]:
    proc = venv.run(["-c", VALIDATE, str(root)])
    assert proc.returncode == 0, proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def cache_entries(root: Path) -> list[Path]:
    return sorted((root / "code").rglob("*.ipc")) if (root / "code").is_dir() else []


def can_mount_read_only() -> bool:
    """Whether this process may make a private mount namespace with a read-only bind mount."""
    if shutil.which("unshare") is None or os.geteuid() != 0:
        return False
    probe = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c",
         "mount --bind /tmp /tmp && mount -o remount,bind,ro /tmp /tmp && ! touch /tmp/.ro-probe"],
        capture_output=True, timeout=30,
    )
    return probe.returncode == 0


def run_read_only(
    read_only: Sequence[Path], cmd: Sequence[str], env: Mapping[str, str | None]
) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` in a private mount namespace where every folder of ``read_only`` is a
    read-only bind mount of itself (the rest of the system, and other processes, see no change).
    Root ignores file modes, so a read-only *mount* is the only real read-only folder for root."""
    mounts = " && ".join(
        f"mount --bind '{p}' '{p}' && mount -o remount,bind,ro '{p}' '{p}'" for p in read_only
    )
    script = f'{mounts} && exec "$@"'
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", *cmd],
        env=clean_env(env), capture_output=True, text=True, timeout=120,
    )
