"""No path of the machine that built the docs in what is published (docs/, README.md, the built
site): measured notes and demo data are copied from real runs, whose absolute paths (the build
machine's work folders, its home, pytest's temporary folders) mean nothing to a reader and leak
where the project was built. Examples use `/home/me/...`, `/tmp/...` or relative paths.

    python scripts/release/check_published_paths.py [PATH...]   # default: docs/ and README.md

Exit status 1 (and one line per hit) when such a path is found. tests/test_docs_paths.py runs it on
the sources; `tox -e docs` on the built site.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# /work/... (the build machine's work tree), /root/... (its home), pytest's and pip's temporary
# folders, and this checkout's own absolute path: not preceded by a path character, so that
# `~/.local/share/importpatch/work/NAME` is not one.
PATTERN = re.compile(r"(?<![\w.~/-])(/work/|/root/|/tmp/pytest-of-|/tmp/pip-)")
TEXT = {".md", ".json", ".html", ".js", ".svg", ".txt", ".yml", ".css", ".xml"}


def hits(paths: list[Path]) -> list[str]:
    own = str(ROOT) + "/"
    found = []
    for top in paths:
        files = [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.is_file())
        for f in files:
            if f.suffix not in TEXT:
                continue
            text = f.read_text(encoding="utf-8", errors="replace")
            for n, line in enumerate(text.splitlines(), 1):
                m = PATTERN.search(line)
                if m or own in line:
                    where = m.group(0) if m else own
                    found.append(f"{f}:{n}: {where}... {line.strip()[:100]}")
    return found


def main(argv: list[str]) -> int:
    paths = [Path(a) for a in argv] or [ROOT / "docs", ROOT / "README.md"]
    found = hits(paths)
    for line in found:
        print(line)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
