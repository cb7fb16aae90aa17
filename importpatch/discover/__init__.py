"""Stage 1, discover: find the patches. The catalog of patch files, packages of patches and
entry points (and its index), declarations (``Patch(...)``) run under a time limit in a
child process, and patch folders imported as packages so their helpers resolve.

Runs inside every patched process: cheap to import, never raises.
"""
