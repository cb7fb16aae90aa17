"""Stage 3, install: what the compiled code calls while the module executes (the name baked
into cached code lives here), late activation of modules imported before the hook, and
the installed objects: wrappers, names and pickling by reference, ``bind()``.

Imports only discover, rewrite and the shared basics. Runs inside every patched process: cheap
to import, never raises.
"""
