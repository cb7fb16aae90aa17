"""Stage 2, rewrite: turn a module's source into its patched code at compile time. Unified
diffs, AST transforms, class-body fields, the analysis of where a name is bound (shared
with ``check`` and late activation) and the definition-site landing calls compiled in; the
compiled code reaches stage 3 by the address in ``facts.HOOKS``, a string, not an import.

Imports only discover and the shared basics. Runs inside every patched process: cheap to import,
never raises.
"""
