"""Stage 4, load: the finder on ``sys.meta_path`` and its loader, which drive the stages before
it at a target's import: the look-up of target modules at a package's first import, the
compiled cache, modules a patch adds, publishing the patched text (``inspect``/``linecache``),
the Triton kernel check and composing with other import hooks.

Imports discover, rewrite, install and the shared basics. Runs inside every patched process:
cheap to import, never raises.
"""
