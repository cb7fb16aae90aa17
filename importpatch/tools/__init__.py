"""Command-line tools: ``importpatch ...`` (cli), the dry run ``check`` and the package
readers it shares, authoring, ``rebase``, ``capture``, release downloads, diffs from git
and the pytest plugin.

Command-line tools, never imported by the stages (nor by the top-level modules).
"""
