"""bench/results.json is what bench/run_all.py writes and what scripts/release/gen_figures.py reads.

The benchmarks themselves take minutes (`tox -e bench`); here, cheaply: run_all's writer on real
``Row``/``Figure`` objects gives entries the figure script draws, it keeps the figures other
scripts measured, and the committed file was written by it (its run is recorded, and the figures
of the benchmarks it ran carry that run's date).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from types import ModuleType
from typing import Any

import pytest
from conftest import ROOT

RESULTS = ROOT / "bench" / "results.json"
# what draw_benchmarks / budget_share read of each figure, and the values they know
DRAWN = {"label", "kind", "value", "goal", "direction", "unit", "met"}


def _load(path: str, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def run_all() -> Any:
    sys.path.insert(0, str(ROOT / "bench"))  # run_all imports its siblings by name
    try:
        yield _load("bench/run_all.py", "run_all")
    finally:
        sys.path.remove(str(ROOT / "bench"))


@pytest.fixture(scope="module")
def gen_figures() -> Any:
    return _load("scripts/release/gen_figures.py", "gen_figures")


def _check_drawable(gen_figures: Any, figure: dict[str, Any]) -> None:
    assert set(figure) >= DRAWN, figure
    assert figure["kind"] in ("ratio", "absolute"), figure
    assert figure["direction"] in ("max", "min"), figure
    assert figure["met"] in ("yes", "no", "noise"), figure  # draw_benchmarks' colours
    assert isinstance(figure["value"], int | float) and isinstance(figure["goal"], int | float)
    assert gen_figures.budget_share(figure) >= 0


def test_run_all_writes_what_gen_figures_draws(run_all: Any, gen_figures: Any) -> None:
    common = sys.modules["_common"]
    row = common.Row("wrap", "a", "b", "+150 ns", "<= 1 us", True, figures=[
        common.Figure("wrap per call", "absolute", 150, 1000, unit="ns"),
        common.Figure("replace per call", "absolute", 2.0, 0, unit="ns", noise=5),
        common.Figure("import ratio", "ratio", 1.02, 1.01),
    ])
    previous = {"measured": "earlier", "figures": [
        {"label": "old wrap", "source": "bench/call_overhead.py"},  # replaced by this run
        {"label": "serving", "kind": "ratio", "value": 0.9, "goal": 1.02, "direction": "max",
         "unit": "", "met": "yes", "source": "bench/serving_load.py"},  # kept, dated
    ]}
    run = {"command": "python bench/run_all.py --only calls", "date": "D"}
    data = run_all.results([("calls", row)], ["calls"], run, previous)
    labels = [f["label"] for f in data["figures"]]
    assert labels == ["wrap per call", "replace per call", "import ratio", "serving"]
    assert [f["met"] for f in data["figures"][:3]] == ["yes", "noise", "no"]
    assert data["figures"][0]["source"] == "bench/call_overhead.py"
    assert data["figures"][0]["measured"] == "D" and data["figures"][3]["measured"] == "earlier"
    assert data["run"] is run and "D" in data["measured"]
    for figure in json.loads(json.dumps(data))["figures"]:
        _check_drawable(gen_figures, figure)


def test_committed_results_were_written_by_run_all(run_all: Any, gen_figures: Any) -> None:
    data = json.loads(RESULTS.read_text(encoding="utf-8"))
    assert isinstance(data["measured"], str)  # the chart's title
    run = data["run"]
    assert run["command"].startswith("python bench/run_all.py")
    assert run["rounds"] and run["scale"] > 0 and run["cpus"] >= 1
    ran = {run_all.source(name) for name in run["benchmarks"]}
    assert ran
    for figure in data["figures"]:
        _check_drawable(gen_figures, figure)
        assert figure["source"] and figure["measured"], figure
        if figure["source"] in ran:
            assert figure["measured"] == run["date"], figure
    assert ran <= {f["source"] for f in data["figures"]}
