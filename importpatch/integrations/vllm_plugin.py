"""vLLM general plugin (entry point group ``vllm.general_plugins``).

vLLM calls ``load_general_plugins()`` in every process it starts (main, EngineCore, Worker, Ray
workers) after many of its modules are imported. Where the ``.pth`` already activated patching with
the toggles in force now this does nothing; where it did not (``python -S``; a Ray worker whose
variables arrived after start), or where the toggles changed since (a Ray worker whose node turned
some patches on at start, and whose driver asked for more by RPC), it activates late: targets
imported from now on are patched at load, targets already imported are patched in place and the
copies their importers' source proves are re-bound (see late.py); patches already on stay on.

In strict mode (``IMPORTPATCH_STRICT=1``) a problem with the chosen patches found here (an unknown
name, a broken enabled patch) raises ``StrictError``, which stops vLLM: its loader does not catch
what a plugin function raises.

It also makes vLLM's legacy Ray executor copy the ``IMPORTPATCH_*`` variables to its workers: that
executor copies only names with the prefixes of ``vllm/ray/ray_env.py`` (``VLLM_``, ``HF_``, ...)
plus those listed in ``VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY``, to which ``IMPORTPATCH_`` is
added here (in the driver, before the EngineCore that runs the executor is started). RayExecutorV2,
the default from vLLM 0.32 on, copies every variable of the driver anyway.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import MutableMapping

PREFIX = "IMPORTPATCH_"
RAY_PREFIXES_VAR = "VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY"


def activate() -> None:
    from importpatch import _boot
    from importpatch.load.finder import installed
    from importpatch.strict import StrictError

    try:
        export_to_ray_workers()
        if installed() is None:
            _boot.activate(late=True)
        elif _boot.activated_with != _boot.toggles_key():
            _boot.enable()  # earlier patches stay on; the newly named ones are added
            _boot.activated_with = _boot.toggles_key()
    except StrictError:
        raise  # strict mode: stop vLLM here (see importpatch/strict.py)
    except Exception as exc:  # a plugin must not take vLLM down; targeted imports report failures
        import logging

        logging.getLogger("importpatch").warning("late activation failed: %s", exc)


def export_to_ray_workers(environ: MutableMapping[str, str] | None = None) -> bool:
    """Add ``IMPORTPATCH_`` to ``VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY`` when an
    ``IMPORTPATCH_*`` variable is set; True when it changed the variable."""
    env = os.environ if environ is None else environ
    if not any(name.startswith(PREFIX) for name in env):
        return False
    current = env.get(RAY_PREFIXES_VAR, "")
    if PREFIX in {tok.strip() for tok in current.split(",")}:
        return False
    env[RAY_PREFIXES_VAR] = ",".join(filter(None, (current.strip().strip(","), PREFIX)))
    return True
