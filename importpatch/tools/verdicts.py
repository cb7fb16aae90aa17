"""One verdict word per patch in one environment: ``list``, ``check``, ``doctor`` and ``status``
take their words from here, so that no two of them call one patch two things (issue 36: ``list``
said "error ... it is not applied" of a patch package that ``check`` called ok and every process
applied in place).

A word answers "does this patch apply here, with the other patches on here?"; ``check`` decides
it by a dry run of the whole set (``doctor`` takes check's words), ``list`` only where the
declaration alone or the set's landings decide it (it does not load: fail; it loads only in place:
ok, unless the import refuses it on top of the patches that land at the definition site:
``check.landing_conflicts``, fail), and ``status`` from what the processes did (an event's
outcome, ``OUTCOME``). tests/test_check_set.py runs the four on one environment.
"""

from __future__ import annotations

from typing import Any

from importpatch.rewrite import diffs

ALREADY_APPLIED = diffs.ALREADY_APPLIED
OK, FAIL, SKIP, ABSENT, WARN = "ok", "fail", "skip", "absent", "warn"
SHADOWED = "shadowed"

# The word, and what it means, as every command prints it (docs/cli.md says the same).
WORDS = {
    OK: "applies here (with its warnings, if any)",
    FAIL: "does not apply here: the import of its target fails (on_error=warn: skips it)",
    SKIP: "its version requirement does not hold here: the import hook skips it",
    ABSENT: "no target package of it is here: the import hook never sees its modules",
    ALREADY_APPLIED: "the change is already in this release: the import hook fails it",
    SHADOWED: "it applied, then something re-assigned its target: the patch no longer runs there "
              "(status, doctor, importpatch.applied())",
}

# What a process's event says, as the word above (``status``).
OUTCOME = {"applied": OK, "failed": FAIL, "skipped": SKIP, "missing": FAIL, "shadowed": SHADOWED}


def declared(entry: Any, strict: bool) -> tuple[str | None, str]:
    """The verdict the declaration alone decides, and the line that says why: FAIL and the
    error when it does not load; OK and the in-place note for a patch package that imports its
    own target (``catalog.in_place_only``), which applies in place outside strict mode; None and
    "" when only a dry run (``check``) can tell."""
    from importpatch.discover.catalog import in_place_note, in_place_only

    if not entry.error:
        return None, ""
    if in_place_only(entry) and not strict:
        return OK, in_place_note(entry)
    return FAIL, f"the declaration does not load: {entry.error}"
