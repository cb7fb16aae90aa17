"""Stage 3, rewrite: turn a module's source into its patched code at compile time. Unified
diffs, AST transforms, class-body fields, the analysis of where a name is bound (shared
with ``check`` and late activation) and the definition-site landing calls compiled in.

Runs inside every patched process: cheap to import, never raises.
"""
