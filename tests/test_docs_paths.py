"""What is published (docs/, README.md) holds no path of the machine that built it (issue 27,
item 5: docs/data/demo-status.json and docs/notes/* held /work/... paths of a build machine).
`tox -e docs` runs the same check on the built site."""

from __future__ import annotations

import importlib.util
from types import ModuleType

from conftest import ROOT


def _checker() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "check_published_paths", ROOT / "scripts" / "release" / "check_published_paths.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_published_docs_hold_no_build_machine_path() -> None:
    found = _checker().hits([ROOT / "docs", ROOT / "README.md"])
    assert found == [], "\n".join(found)


def test_the_check_finds_such_a_path_and_spares_examples(tmp_path: object) -> None:
    from pathlib import Path

    folder = Path(str(tmp_path))
    (folder / "a.md").write_text("see /work/wt/ship21/.demo/model and /root/.cache\n")
    (folder / "b.md").write_text("`~/.local/share/importpatch/work/NAME/`, /home/me/x, /tmp/ev\n")
    found = _checker().hits([folder])
    assert len(found) == 1 and "a.md:1" in found[0], found
