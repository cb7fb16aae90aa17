"""Stage 1, discover: find the patches. The catalog of patch files, packages of patches and
entry points (and its index), declarations (``Patch(...)``, the ``Op`` types every later stage
uses) run under a time limit in a child process, diff files parsed into hunks (``diffparse``),
the selection of the patches that apply to a module, and patch folders imported as packages so
their helpers resolve.

Imports only the shared basics (tests/test_layout.py). Runs inside every patched process: cheap
to import, never raises.
"""
