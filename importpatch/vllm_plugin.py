"""vLLM general plugin (entry point group ``vllm.general_plugins``).

vLLM calls ``load_general_plugins()`` in every process it starts (main, EngineCore, Worker, Ray
workers) after many of its modules are imported. Where the ``.pth`` already activated patching this
does nothing; where it did not (``python -S``; a Ray worker whose variables arrived after start),
it activates late: targets imported from now on are patched at load, targets already imported are
patched in place and their copies re-bound.
"""

from __future__ import annotations


def activate() -> None:
    from . import _boot
    from .finder import installed

    if installed() is not None:
        return
    try:
        _boot.activate(late=True)
    except Exception as exc:  # a plugin must not take vLLM down; targeted imports report failures
        import logging

        logging.getLogger("importpatch").warning("late activation failed: %s", exc)
