from importpatch.pytest_plugin import assert_applies_cleanly


def test_applies():
    assert_applies_cleanly("my-priority")      # against the installed vLLM, nothing imported

def test_runs(importpatch_run):                # a real fresh interpreter
    r = importpatch_run("import vllm.v1.engine.core as c\nresult = c.HANDSHAKE_TIMEOUT_MINS",
                        enable=["my-priority"])
    assert r.returncode == 0 and r.result == 10
    assert "my-priority" in {e["patch"] for e in r.applied}  # (and the ones on by default)
