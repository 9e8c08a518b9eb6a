"""The report job: draw the results figures of a curriculum run as PNGs.

    python -m jobs.report RUN_DIR [--out DIR]     # prints one written path per line

``write_figures(run_dir, out_dir=None)`` reads ``RUN_DIR/results.json`` (the table written by
``jobs.main``) and every ``metrics.jsonl`` at ``RUN_DIR`` and one folder below it (one per variant
when the run has variants), and writes into ``out_dir`` (default ``RUN_DIR/curves``, created):

- ``eval_success.png``: one panel per evaluated mode (``single``, ``agentic``, ``spider``, in that
  order, then any other mode), success per row with its 95% interval as error bars (none when a
  summary has no ``success_ci95``); x = the row labels (``label``, else ``name``) in order of first appearance, the rows of
  each variant drawn side by side (offset markers, one fixed colour per variant in every panel, legend).
- one figure per trainer of ``jobs.train.TRAINERS`` (its ``Curves``), one panel per stage of
  ``curriculum.stages.STAGES`` with that trainer that has any of its metrics -- so a new stage's
  curves show up with no edit here: ``rl_curves.png`` (GRPO stages: ``reward_mean``,
  ``pass_rate``, ``reward_format``, ``reward_result`` per step; colour = metric, line style =
  source when there are several ``metrics.jsonl``, labelled by their folder name) and
  ``sft_loss.png`` (SFT stages: ``loss`` per step).

Guarantees: a figure with no data to draw is not written (never an empty plot); a metrics line
that is not a JSON object with a ``stage`` and a numeric ``step`` is skipped, as are values that
are not finite numbers; a re-logged step (a resumed stage) replaces the earlier one; a missing
``results.json`` raises ``FileNotFoundError`` naming its path. Returns the paths written, in the
order above. Uses matplotlib's Agg backend (no display needed); these file names do not collide
with the per-stage ``curves/<stage>.png`` written by ``sqlrl.metrics.MetricsLogger``.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from sqlrl.metrics import read_metrics

MODE_ORDER = ("single", "agentic", "spider")
LINE_STYLES = ("-", "--", ":", "-.")

# source label -> stage -> metric -> {step: value}
Series = dict[str, dict[str, dict[str, dict[float, float]]]]


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) else None


def load_results(run_dir: str | Path) -> dict[str, Any]:
    """``run_dir/results.json`` as a dict; ``FileNotFoundError`` naming the path when absent."""
    path = Path(run_dir) / "results.json"
    if not path.is_file():
        raise FileNotFoundError(f"no results table at {path} (run jobs.main on this run first)")
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def metrics_files(run_dir: str | Path) -> dict[str, Path]:
    """Every ``metrics.jsonl`` at ``run_dir`` and one level below, keyed by its folder's name."""
    run_dir = Path(run_dir)
    found = {p.parent.name: p for p in sorted(run_dir.glob("*/metrics.jsonl")) if p.is_file()}
    if (run_dir / "metrics.jsonl").is_file():
        root = run_dir.resolve().name or "run"
        found = {(root if root not in found else "."): run_dir / "metrics.jsonl", **found}
    return found


def load_series(run_dir: str | Path) -> Series:
    """Numeric per-step metrics of every source; garbled lines and non-numbers are skipped."""
    series: Series = {}
    for label, path in metrics_files(run_dir).items():
        for row in read_metrics(path):
            step = _number(row.get("step"))
            if step is None or not isinstance(row.get("stage"), str):
                continue
            stage = series.setdefault(label, {}).setdefault(row["stage"], {})
            for key, value in row.items():
                x = _number(value)
                if x is not None and key not in ("step", "time"):
                    stage.setdefault(key, {})[step] = x
    return series


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _save(fig, path: Path) -> Path:
    plt = _pyplot()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _label(row: dict[str, Any]) -> str:
    """The x position of a row: its ``label`` (the stage without the variant, so the variants of
    one stage sit side by side), else its ``name``."""
    return str(row.get("label") or row.get("name", "?"))


def plot_eval(results: dict[str, Any], path: Path) -> Path | None:
    """``eval_success.png`` (see the module docstring); ``None`` when no row has a success."""
    rows = [r for r in results.get("rows") or [] if isinstance(r, dict)]
    points: dict[str, list[tuple[str, str, float, Any]]] = {}  # mode -> (name, variant, y, ci)
    for r in rows:
        for mode, summary in (r.get("eval") or {}).items():
            y = _number(summary.get("success")) if isinstance(summary, dict) else None
            if y is not None:
                points.setdefault(mode, []).append(
                    (_label(r), str(r.get("variant") or ""), y, summary.get("success_ci95")))
    modes = [m for m in MODE_ORDER if m in points] + sorted(set(points) - set(MODE_ORDER))
    if not modes:
        return None
    names = list(dict.fromkeys(_label(r) for r in rows))
    variants = list(dict.fromkeys(str(r.get("variant") or "") for r in rows))
    width = 0.8 / len(variants)
    plt = _pyplot()
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, axes = plt.subplots(1, len(modes), figsize=(max(5.0, 0.9 * len(names) + 2) * len(modes), 4.2),
                             squeeze=False)
    for ax, mode in zip(axes.flat, modes):
        for k, variant in enumerate(variants):
            xs, ys, lo, hi = [], [], [], []
            for name, v, y, ci in points[mode]:
                if v != variant:
                    continue
                xs.append(names.index(name) + (k - (len(variants) - 1) / 2) * width)
                ys.append(y)
                ok = isinstance(ci, (list, tuple)) and len(ci) == 2 and all(_number(c) is not None for c in ci)
                lo.append(max(0.0, y - float(ci[0])) if ok else 0.0)
                hi.append(max(0.0, float(ci[1]) - y) if ok else 0.0)
            if xs:
                ax.errorbar(xs, ys, yerr=[lo, hi], fmt="o", capsize=4, linestyle="none",
                            color=colours[k % len(colours)],
                            label=variant or ("shared" if len(variants) > 1 else None))
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
        ax.set_xlim(-0.6, len(names) - 0.4)
        ax.set_ylim(-0.05, 1.05)
        ax.set_ylabel("success")
        ax.set_title(mode)
        ax.grid(axis="y", alpha=0.3)
        if len(variants) > 1:
            ax.legend(fontsize=8)
    fig.suptitle(f"held-out success ({results.get('model', '?')}, 95% CI)", fontsize=10)
    return _save(fig, path)


def plot_stages(series: Series, stages: tuple[str, ...], metrics: tuple[str, ...], path: Path,
                title: str) -> Path | None:
    """One panel per stage in ``stages`` that has any of ``metrics``; ``None`` when none has."""
    present = [s for s in stages if any(m in src.get(s, {}) for src in series.values() for m in metrics)]
    if not present:
        return None
    labels = list(series)
    plt = _pyplot()
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, axes = plt.subplots(1, len(present), figsize=(5.5 * len(present), 3.8), squeeze=False)
    for ax, stage in zip(axes.flat, present):
        for j, label in enumerate(labels):
            for i, metric in enumerate(metrics):
                points = sorted(series[label].get(stage, {}).get(metric, {}).items())
                if not points:
                    continue
                steps, values = zip(*points)
                name = metric if len(labels) == 1 else f"{metric} [{label}]"
                ax.plot(steps, values, color=colours[i % len(colours)],
                        linestyle=LINE_STYLES[j % len(LINE_STYLES)],
                        marker="." if len(steps) < 30 else None, label=name)
        ax.set_title(stage)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    return _save(fig, path)


def write_figures(run_dir: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Write the figures that have data (see the module docstring); return their paths."""
    run_dir = Path(run_dir)
    results = load_results(run_dir)
    out = Path(out_dir) if out_dir is not None else run_dir / "curves"
    series = load_series(run_dir)
    from jobs.train import TRAINERS  # the registries, on first use (importing curriculum takes seconds)

    written = [plot_eval(results, out / "eval_success.png")]
    for name, trainer in TRAINERS.items():
        c = trainer.curves
        written.append(plot_stages(series, stages_of(name), c.metrics, out / c.file, c.title))
    return [p for p in written if p is not None]


def stages_of(trainer: str) -> tuple[str, ...]:
    """The registered stages (``curriculum.stages.STAGES``, in curriculum order) that ``trainer`` trains."""
    from curriculum.stages import STAGES

    return tuple(name for name, spec in STAGES.items() if spec.trainer == trainer)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m jobs.report", description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path, help="a run folder holding results.json")
    ap.add_argument("--out", type=Path, default=None, help="where to write (default RUN_DIR/curves)")
    args = ap.parse_args(argv)
    try:
        paths = write_figures(args.run_dir, args.out)
    except FileNotFoundError as exc:
        ap.exit(2, f"error: {exc}\n")
    for p in paths:
        print(p)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
