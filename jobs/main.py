"""The README's main job: the four-stage curriculum at micro scale on the embedded default.

    python -m jobs.main                      # SmolLM2-135M, generated data, in-process, ≤ 30 min on 2 cores
    python -m jobs.main --model tiny         # the fast variant (a random tiny model: plumbing only)
    python -m jobs.main --ray                # the same on a local Ray cluster (actors for everything)
    python -m jobs.main rl.steps=1 ...       # key=value overrides go to every stage

Setup: the generated data (``data.synth_dir``, built once). Run: the base model is evaluated on the
held-out tasks, then stages 1–4 run one after another from ``jobs/configs/<stage>.yaml`` — each
starts from the previous stage's checkpoint and is evaluated after it. Report: a table in the
spirit of the BIRD-RL paper — success on held-out tasks (single-turn and agentic) for the base
model and after every stage — printed and written to ``<run_dir>/results.{json,md}``. Checkpoints
stay in ``<run_dir>/<stage>/final`` for serving.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from curriculum.config import STAGE_TITLES, STAGES

console = Console()
CONFIGS = Path(__file__).resolve().parent / "configs"


def _stage_main(stage: str):
    from importlib import import_module

    module = {"stage1": "jobs.stage1_reasoning_sft", "stage2": "jobs.stage2_tooluse_sft",
              "stage3": "jobs.stage3_reasoning_rl", "stage4": "jobs.stage4_agentic_rl"}[stage]
    return import_module(module).main


def results_table(rows: list[dict], modes: list[str], held_out: str) -> tuple[Table, str]:
    table = Table(title=f"Success on held-out tasks: {held_out} (greedy; format = well-formed answers)")
    table.add_column("model")
    for m in modes:
        table.add_column(f"{m} success", justify="right")
        table.add_column(f"{m}: debug / text2sql", justify="right")
    table.add_column("stage time", justify="right")
    md = ["| model | " + " | ".join(f"{m} success | {m}: debug / text2sql" for m in modes) + " | stage time |",
          "|---" * (2 * len(modes) + 2) + "|"]
    for row in rows:
        cells = []
        for m in modes:
            e = row["eval"].get(m)
            if e is None:
                cells += ["—", "—"]
            else:
                cells += [f"{e['success']:.2f} (format {e.get('format_ok', 0.0):.2f}, n={e['scored']})",
                          f"{e.get('success_critic', float('nan')):.2f} / {e.get('success_text2sql', float('nan')):.2f}"]
        cells.append(f"{row['seconds']:.0f} s")
        table.add_row(row["name"], *cells)
        md.append(f"| {row['name']} | " + " | ".join(cells) + " |")
    return table, "\n".join(md) + "\n"


def _progress() -> Progress:
    """The job's overall progress (phases done, elapsed time), drawn on the stage jobs' console
    (stderr) so their step lines scroll above it; a plain final line when stderr is not a terminal."""
    from jobs.runtime import console as job_console

    return Progress(SpinnerColumn(), TextColumn("[bold]{task.description}"), BarColumn(),
                    MofNCompleteColumn(), TextColumn("phases"), TimeElapsedColumn(), console=job_console)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m jobs.main", description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m", help="the base model (smollm2-135m, tiny, or a folder)")
    ap.add_argument("--run-dir", default="runs/main")
    ap.add_argument("--stages", default=",".join(STAGES), help="comma-separated subset, in order")
    ap.add_argument("--eval-modes", default="own",
                    help="modes every stage is evaluated in: 'own' (the stage's own mode; the base model "
                         "in both) or a list such as single,agentic")
    ap.add_argument("--ray", action="store_true", help="run every stage on Ray actors (local cluster)")
    ap.add_argument("overrides", nargs="*", help="key=value overrides for every stage")
    a = ap.parse_args(argv)
    stages = [s for s in a.stages.split(",") if s]
    unknown = [s for s in stages if s not in STAGES]
    if unknown:
        raise SystemExit(f"unknown stage(s) {unknown}; known: {', '.join(STAGES)}")
    own = a.eval_modes == "own"
    modes = ["single", "agentic"] if own else [m for m in a.eval_modes.split(",") if m]
    common = [f"run_dir={a.run_dir}", *([] if own else [f"eval.modes=[{', '.join(modes)}]"]), *a.overrides]
    if a.ray:
        common.append("cluster.ray=true")
    t_start = time.perf_counter()

    # -- setup: data (generated once) and the base model's scores
    from jobs.runtime import Runtime, evaluate, prepare_data
    from curriculum.config import load_stage_config

    first = load_stage_config(CONFIGS / f"{stages[0]}.yaml", [*common, f"model.init={a.model}"])
    data = prepare_data(first)
    console.rule(f"sqlrl main job: {a.model}, stages {', '.join(stages)}, data {data.source}")
    console.print(f"tasks: {data.counts()}")
    rows = []
    with _progress() as progress:
        show = progress.console.print
        phases = progress.add_task("base model evaluation", total=1 + len(stages))
        t0 = time.perf_counter()
        with Runtime(first, data) as rt:
            base = {m: evaluate(rt, a.model, data.eval, m) for m in modes}
        rows.append({"name": f"base ({a.model})", "eval": base, "seconds": time.perf_counter() - t0})
        progress.advance(phases)
        show(results_table(rows, modes, data.source)[0])

        # -- run: the stages, each from the previous one's checkpoint
        for i, stage in enumerate(stages):
            progress.console.rule(f"{stage}: {STAGE_TITLES[stage]}")
            progress.update(phases, description=f"{stage}: {STAGE_TITLES[stage]}")
            init = a.model if i == 0 else "previous"
            t0 = time.perf_counter()
            summary = _stage_main(stage)(["--config", str(CONFIGS / f"{stage}.yaml"), *common, f"model.init={init}"])
            rows.append({"name": f"+ {stage} {STAGE_TITLES[stage]}", "eval": {e["mode"]: e for e in summary["eval"]},
                         "seconds": time.perf_counter() - t0})
            progress.advance(phases)
            show(results_table(rows, modes, data.source)[0])
        progress.update(phases, description="done")

    # -- report
    table, md = results_table(rows, modes, data.source)
    run_dir = Path(a.run_dir)
    total = time.perf_counter() - t_start
    report = {"model": a.model, "held_out": data.source, "rows": rows, "seconds": total}
    (run_dir / "results.json").write_text(json.dumps(report, indent=2, default=str))
    (run_dir / "results.md").write_text(md + f"\nHeld-out tasks: {data.source}. Total: {total / 60:.1f} min.\n")
    console.rule("result")
    console.print(table)
    console.print(f"total {total / 60:.1f} min; checkpoints in {run_dir}/<stage>/final; "
                  f"curves in {run_dir}/curves; metrics in {run_dir}/metrics.jsonl")
    return 0


if __name__ == "__main__":
    sys.exit(main())
