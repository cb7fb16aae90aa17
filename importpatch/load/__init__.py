"""Stage 2, load: the finder on ``sys.meta_path`` and its loader. Which enabled patches apply
to a module, the look-up of target modules at a package's first import, the compiled
cache, publishing the patched text (``inspect``/``linecache``) and the Triton kernel check.

Runs inside every patched process: cheap to import, never raises.
"""
