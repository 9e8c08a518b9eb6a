"""Per-step training metrics to a JSONL log, TensorBoard event files and PNG curves.

``MetricsLogger(run_dir, stage)`` is what every curriculum job writes its step metrics through.

Guarantees:
- ``log(step, metrics)`` appends one JSON line ``{"stage", "step", "time", **metrics}`` to
  ``run_dir/metrics.jsonl`` and flushes it, so a crashed job keeps every finished step; values must
  be finite numbers (``None`` and non-numbers are dropped from TensorBoard and curves, kept in
  JSONL as given). Extra sinks (e.g. Ray gauges for the dashboard, added by ``actors/``) are
  callables ``sink(stage, step, metrics)``; a failing sink is reported once, never fatal.
- TensorBoard scalars go to ``run_dir/tensorboard/<stage>`` when ``tensorboard`` is importable
  (skipped with a note otherwise).
- ``close()`` draws ``run_dir/curves/<stage>.png`` (one panel per metric, up to ``max_panels``,
  in the order first logged) when matplotlib is importable, and returns the paths it wrote.
- ``read_metrics(path, stage=None)`` reads the JSONL back (skipping a torn line).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

Sink = Callable[[str, int, Mapping[str, Any]], None]


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) else None


class MetricsLogger:
    def __init__(self, run_dir: str | Path, stage: str, *, sinks: Iterable[Sink] = (),
                 tensorboard: bool = True, max_panels: int = 12) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.stage = stage
        self.sinks = list(sinks)
        self.max_panels = max_panels
        self.notes: list[str] = []
        self._jsonl = open(self.run_dir / "metrics.jsonl", "a", encoding="utf-8")
        self._series: dict[str, list[tuple[int, float]]] = {}
        self._failed_sinks: set[int] = set()
        self._tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
                self._tb = SummaryWriter(str(self.run_dir / "tensorboard" / stage))
            except Exception as exc:  # tensorboard not installed
                self.notes.append(f"tensorboard off: {exc}")

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        row = {"stage": self.stage, "step": int(step), "time": time.time(), **metrics}
        self._jsonl.write(json.dumps(row, default=str) + "\n")
        self._jsonl.flush()
        for key, value in metrics.items():
            x = _number(value)
            if x is None:
                continue
            self._series.setdefault(key, []).append((int(step), x))
            if self._tb is not None:
                self._tb.add_scalar(key, x, int(step))
        for i, sink in enumerate(self.sinks):
            try:
                sink(self.stage, int(step), metrics)
            except Exception as exc:
                if i not in self._failed_sinks:
                    self._failed_sinks.add(i)
                    self.notes.append(f"metrics sink {i} failed: {exc!r}")

    def close(self) -> list[Path]:
        written: list[Path] = []
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if not self._jsonl.closed:
            self._jsonl.close()
        if self._series:
            png = self._plot()
            if png is not None:
                written.append(png)
        return written

    def __enter__(self) -> "MetricsLogger":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _plot(self) -> Path | None:
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except Exception as exc:
            self.notes.append(f"curves off: {exc}")
            return None
        keys = list(self._series)[: self.max_panels]
        cols = min(3, len(keys))
        rows = math.ceil(len(keys) / cols)
        fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 2.8 * rows), squeeze=False)
        for ax, key in zip(axes.flat, keys):
            steps, values = zip(*self._series[key])
            ax.plot(steps, values, marker="." if len(steps) < 30 else None)
            ax.set_title(key, fontsize=9)
            ax.set_xlabel("step", fontsize=8)
            ax.tick_params(labelsize=7)
        for ax in list(axes.flat)[len(keys):]:
            ax.axis("off")
        fig.suptitle(self.stage)
        fig.tight_layout()
        out = self.run_dir / "curves" / f"{self.stage}.png"
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=80)
        plt.close(fig)
        return out


def read_metrics(path: str | Path, stage: str | None = None) -> list[dict[str, Any]]:
    """The logged rows (of ``stage`` when given), in order. A line that is not a JSON object -- the
    torn last line of a job killed mid-write -- is skipped, so a stopped run can still be read."""
    rows = []
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and (stage is None or row.get("stage") == stage):
                rows.append(row)
    return rows
