"""The README's main job: the four-stage curriculum at micro scale on the embedded default.

    python -m jobs.main                      # SmolLM2-135M, generated data, in-process, ≤ 30 min on 2 cores
    python -m jobs.main --model tiny         # the fast variant (a random tiny model: plumbing only)
    python -m jobs.main --ray                # the same on a local Ray cluster (actors for everything)
    python -m jobs.main rl.steps=1 ...       # key=value overrides go to every stage
    python -m jobs.main --overwrite          # run again into a run dir that holds stage results
    python -m jobs.main --preset long --spider-eval ../shared/data/spider
                                             # Zeno and Talon, 144 held-out tasks + 100 Spider dev questions

Setup: the preset (``jobs.presets``: ``default`` = the shipped stage configs; ``long`` =
``jobs/configs/presets/long.yaml``) and the generated data (``data.synth_dir``, built once). Run:
the base model is evaluated on the held-out tasks (and, with ``--spider-eval PATH``, on a fixed
subset of Spider dev), then for each of the preset's variants (long: Zeno, then Talon, each in
``<run_dir>/<variant>``) the stages of ``curriculum.stages.STAGES`` (1–4) run one after another,
each from its shipped config (``StageSpec.config``: ``jobs/configs/<stage>.yaml``) plus the
preset's overrides through the one stage recipe ``jobs.stage.run_stage`` — the first from the base
model, each later one from the previous stage's checkpoint — and each is evaluated after it.
Report: a table in the spirit of the BIRD-RL paper — success on held-out tasks (single-turn and
agentic) with its 95% Wilson interval for the base model and after every stage,
and the paired difference (95% bootstrap interval, ``jobs.held_out.compare``) against the previous
row of the same variant (the base model for a variant's first stage) evaluated in the same mode
on the same tasks — printed once at the end and written to ``<run_dir>/results.{json,md}`` with the
figures of ``jobs.report`` in ``<run_dir>/curves`` (one summary line per phase as it ends, with
its time and the job process's peak resident memory, ``peak_rss_gib`` in ``results.json``).
Checkpoints stay in ``<run_dir>/[<variant>/]<stage>/final`` for serving.

A run dir whose stages already hold results (``<run_dir>/<stage>/summary.json`` or ``final/``) is
refused before anything runs, unless ``--overwrite`` (passed on to every stage as
``overwrite=true``) or another ``--run-dir``, or ``--resume``: a variant's finished stages (they
must come first in its chain, made with the very config this run gives them, else the run stops
naming the keys that differ) are not run again -- their rows are read back from their
``summary.json`` (the Spider subset, when asked for, is scored again), the first unfinished one goes
on from its newest mid-stage checkpoint (``resume=true``; ``checkpoint.every_steps``) -- and the base model's
scores are read back from ``<run_dir>/base_eval.json`` when it holds the same model, schema style,
modes and held-out tasks (every run writes it); the rest runs as usual, from the last finished checkpoint.
In a terminal the progress is a rich display and the table a rich table; otherwise (CI,
``ray job submit`` logs) plain lines, heartbeats during long phases (``jobs.console``), and the
table as plain markdown, full width.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

import jobs.held_out as held_out
import jobs.runtime as runtime
import jobs.stage as stage_job
import jobs.stage_data as stage_data
from jobs.presets import PRESETS, load_preset
from jobs.report import write_figures
from curriculum.stages import STAGES
from jobs.console import heading, make_console, quiet_third_party_bars
from sqlrl.db.dialects.descriptor import find
from sqlrl import memory

console = make_console()


def table_title(source: str, sampled: bool = False) -> str:
    how = "greedy, and k samples a task in the <mode>@k columns" if sampled else "greedy"
    return f"Success on held-out tasks: {source} ({how}; format = well-formed answers)"


LEGEND = ("success [95% Wilson interval]; change = success minus the previous row's in the same mode on the "
          "same tasks [95% paired bootstrap interval] (n = tasks compared, +gained/-lost, answers changed = tasks "
          "on which the model wrote something else than in that row); training signal = what the stage's own "
          "steps measured (SFT: loss first -> last; GRPO: its samples' pass rate, and how many groups had "
          "unequal rewards -- the only ones with a gradient); a mode <mode>@k "
          "(eval.samples): k sampled rollouts a task, success = the mean per-task solve rate (avg@k) "
          "[95% bootstrap interval over tasks], +gained/-lost = tasks whose rate rose/fell")


def add_changes(rows: list[dict], modes: list[str]) -> None:
    """Give each row ``change``: per mode, the paired difference (``jobs.held_out.compare``) against
    the latest earlier row of the same variant (or the first row, the base model) evaluated in that
    mode, with that row's name as ``vs``."""
    for i, row in enumerate(rows):
        row["change"] = {}
        for m in modes:
            e = row["eval"].get(m)
            prev = next((r for j, r in reversed(list(enumerate(rows[:i])))
                         if r["eval"].get(m) is not None and (j == 0 or r.get("variant", "") == row.get("variant", ""))),
                        None)
            if e is None or prev is None:
                continue
            d = held_out.compare(prev["eval"][m], e)
            if d is not None:
                row["change"][m] = {"vs": prev["name"], **d}


def change_cell(row: dict, modes: list[str]) -> str:
    parts = [f"{m} {held_out.change_text(d)}" for m in modes if (d := row.get("change", {}).get(m))]
    return "; ".join(parts) or "—"


def results_table(rows: list[dict], modes: list[str], held_out_name: str) -> tuple[Table, str]:
    sampled = any("@" in m for m in modes)
    table = Table(title=table_title(held_out_name, sampled))
    table.add_column("model")
    for m in modes:
        table.add_column(f"{m} success", justify="right")
        table.add_column(f"{m}: debug / text2sql", justify="right")
    table.add_column("change vs previous", justify="right")
    table.add_column("training signal", justify="right")
    table.add_column("stage time", justify="right")
    md = ["| model | " + " | ".join(f"{m} success | {m}: debug / text2sql" for m in modes)
          + " | change vs previous | training signal | stage time |",
          "|---" * (2 * len(modes) + 4) + "|"]
    for row in rows:
        cells = []
        for m in modes:
            e = row["eval"].get(m)
            if e is None:
                cells += ["—", "—"]
            else:
                k = f", pass@{e['samples']} {e['pass_at_k']:.2f}" if "pass_at_k" in e else ""
                cells += [f"{held_out.success_text(e)} (format {e.get('format_ok', 0.0):.2f}{k}, n={e['scored']})",
                          " / ".join(f"{e[k]:.2f}" if k in e else "—" for k in ("success_critic", "success_text2sql"))]
        cells.append(change_cell(row, modes))
        cells.append((row.get("training") or {}).get("text", "—"))
        cells.append(time_cell(row))
        table.add_row(row["name"], *cells)
        md.append(f"| {row['name']} | " + " | ".join(cells) + " |")
    return table, "\n".join(md) + "\n"


def time_cell(row: dict) -> str:
    """The row's time; a row read back by ``--resume`` says so (its training time is not known)."""
    return "resumed" if row.get("resumed") else f"{row['seconds']:.0f} s"


def read_summary(cfg: Any, eval_ids: list[str]) -> dict[str, Any]:
    """A finished stage's ``summary.json`` (``--resume``), made with the config ``cfg`` this run
    would give it and evaluated on this run's held-out tasks (``eval_ids``); a missing or unreadable
    one, one trained with another config, or one scored on other tasks is an error naming the file
    (and the keys that differ: a row must not pass off another run's numbers; where the run dir
    lives -- ``run_dir`` -- and ``overwrite`` are not part of what is compared)."""
    from sqlrl.config import config_changes

    path = cfg.stage_dir / "summary.json"
    try:
        summary = json.loads(path.read_text())
        if not isinstance(summary, dict) or "checkpoint" not in summary or "eval" not in summary:
            raise ValueError("no checkpoint/eval")
    except (OSError, ValueError) as exc:
        raise SystemExit(f"main: --resume: cannot read the finished stage's {path} ({exc}); "
                         "pass --overwrite to run it again") from None
    saved = summary.get("config")
    changes = (config_changes(saved, cfg, ignore=("overwrite", "run_dir", "resume", "checkpoint.every_steps",
                                                  "checkpoint.keep")) if isinstance(saved, dict)
               else ["it records no config"])
    changes += [f"its {e.get('mode')} evaluation was on other held-out tasks" for e in summary["eval"]
                if sorted(e.get("per_task") or ()) != sorted(eval_ids)]
    if changes:
        raise SystemExit(f"main: --resume: {path} does not match what this run gives "
                         f"{cfg.stage} ({'; '.join(changes[:8])}{' ...' if len(changes) > 8 else ''}); "
                         "pass --overwrite to run it again, or --run-dir <another folder>")
    return summary


def read_base_eval(run_dir: Path, key: dict[str, Any]) -> dict[str, Any] | None:
    """The base model's cached scores from ``<run_dir>/base_eval.json`` when they were made for the
    same model, schema style, modes and held-out tasks (``key``); otherwise ``None`` (evaluate again)."""
    try:
        cached = json.loads((Path(run_dir) / "base_eval.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(cached, dict) or any(cached.get(k) != v for k, v in key.items()):
        return None
    return cached.get("eval") if isinstance(cached.get("eval"), dict) else None


def phase_line(row: dict, modes: list[str]) -> str:
    """One line for a finished phase: its evaluations (with intervals, and the change since the
    previous evaluation in the same mode), its time, the job process's peak resident memory
    during it (``sqlrl.memory``; the process's peak so far where the kernel cannot reset it) and
    what its training steps measured (``jobs.train.Trainer.signal``)."""
    evals = [f"{m} {held_out.success_text(e)} (format {e.get('format_ok', 0.0):.2f}, n={e['scored']})"
             for m in modes if (e := row["eval"].get(m)) is not None]
    changes = [f"{m} {held_out.change_text(d)} vs {d['vs']}" for m in modes if (d := row.get("change", {}).get(m))]
    peak = f", peak memory {row['peak_rss_gib']:.1f} GiB" if row.get("peak_rss_gib") and not row.get("resumed") else ""
    training = f"; training: {row['training']['text']}" if (row.get("training") or {}).get("text") else ""
    return (f"{row['name']}: {', '.join(evals) or 'not evaluated'}; {time_cell(row)}{peak}"
            + (f"; change: {', '.join(changes)}" if changes else "") + training)


class Phases:
    """The job's overall progress. In a terminal: a rich display (phases done, elapsed time) on the
    stage jobs' console (stderr), so their step lines scroll above it. Otherwise plain lines. Either
    way one summary line per finished phase (``main: k/n phases done: ...``)."""

    def __init__(self, total: int) -> None:
        from jobs.output import console as job_console

        self.console, self.total, self.done = job_console, total, 0
        self.t0 = time.perf_counter()
        self._progress: Progress | None = None
        self._task: Any = None

    def __enter__(self) -> "Phases":
        if self.console.is_terminal:
            self._progress = Progress(SpinnerColumn(), TextColumn("[bold]{task.description}"), BarColumn(),
                                      MofNCompleteColumn(), TextColumn("phases"), TimeElapsedColumn(),
                                      console=self.console)
            self._progress.__enter__()
            self._task = self._progress.add_task("starting", total=self.total)
        return self

    def start(self, description: str) -> None:
        heading(self.console, description)
        if self._progress is not None:
            self._progress.update(self._task, description=description)

    def finished(self, line: str) -> None:
        self.done += 1
        elapsed = (time.perf_counter() - self.t0) / 60
        self.console.print(f"main: {self.done}/{self.total} phases done ({elapsed:.1f} min): {line}",
                           markup=False, highlight=False)
        if self._progress is not None:
            self._progress.advance(self._task)
            if self.done == self.total:
                self._progress.update(self._task, description="done")

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.__exit__(*exc)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m jobs.main", description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m", help="the base model (smollm2-135m, tiny, or a folder)")
    ap.add_argument("--preset", default="default", choices=sorted(PRESETS),
                    help="default: the shipped stage configs (<= 30 min); long: jobs/configs/presets/long.yaml")
    ap.add_argument("--variants", default=None, help="comma-separated subset of the preset's variants (long: zeno,talon)")
    ap.add_argument("--run-dir", default=None, help="default: the preset's (runs/main; long: runs/long)")
    ap.add_argument("--stages", default=",".join(STAGES), help="comma-separated subset, in order")
    ap.add_argument("--eval-modes", default="own",
                    help="modes every stage is evaluated in: 'own' (the stage's own mode; the base model "
                         "in both) or a list such as single,agentic")
    ap.add_argument("--spider-eval", default=None, metavar="PATH",
                    help="a Spider folder: also evaluate every checkpoint on a fixed subset of its dev questions "
                         "(single-turn; --spider-size questions)")
    ap.add_argument("--spider-size", type=int, default=None, help="default: the preset's spider_eval, else 100")
    ap.add_argument("--ray", action="store_true", help="run every stage on Ray actors (local cluster)")
    ap.add_argument("--overwrite", action="store_true",
                    help="replace the results of stages already run in --run-dir (else the job refuses)")
    ap.add_argument("--resume", action="store_true",
                    help="keep the stages that already hold results (a prefix of each variant's chain) and the "
                         "base model's cached scores; run the rest")
    ap.add_argument("overrides", nargs="*", help="key=value overrides for every stage")
    a = ap.parse_args(argv)
    stages = [s for s in a.stages.split(",") if s]
    unknown = [s for s in stages if s not in STAGES]
    if unknown:
        raise SystemExit(f"unknown stage(s) {unknown}; known: {', '.join(STAGES)}")
    try:
        preset = load_preset(a.preset, STAGES)
    except ValueError as exc:
        raise SystemExit(f"main: {exc}") from None
    variants = preset.variant_names()
    if a.variants:
        variants = [v for v in a.variants.split(",") if v]
        bad = [v for v in variants if v not in preset.variants]
        if bad:
            raise SystemExit(f"main: unknown variant(s) {bad} for preset {a.preset!r}; known: "
                             f"{', '.join(preset.variants) or 'none'}")
    run_dir = Path(a.run_dir or preset.run_dir or "runs/main")
    own = a.eval_modes == "own"
    modes = ["single", "agentic"] if own else [m for m in a.eval_modes.split(",") if m]
    common = [*([] if own else [f"eval.modes=[{', '.join(modes)}]"]), *a.overrides]
    if a.ray:
        common.append("cluster.ray=true")
    t_start = time.perf_counter()
    quiet_third_party_bars()

    # -- setup: refuse to replace finished stages, then data (generated once) and the base model's scores
    from curriculum.config import load_stage_config
    from sqlrl.config import ConfigError

    def args_for(stage: str, variant: str, init: str) -> list[str]:
        vdir = run_dir / variant if variant else run_dir
        return [*preset.overrides(stage, variant), f"run_dir={vdir}", *common, f"model.init={init}"]

    try:  # each stage's config, parsed once: the first of a chain from the base model, the others from the previous
        configs = {(v, s): load_stage_config(STAGES[s].config_path(),
                                             [f"stage={s}", *args_for(s, v, a.model if i == 0 else "previous")])
                   for v in variants for i, s in enumerate(stages)}
        first = configs[variants[0], stages[0]]
        overwrite = a.overwrite or first.overwrite  # --overwrite, or overwrite=true given as an override
        if overwrite:
            configs = {k: dataclasses.replace(c, overwrite=True) for k, c in configs.items()}
        finished = {k: bool(c.existing_result()) for k, c in configs.items()}
        sampled: list[str] = []  # the stages' sampled evaluations (eval.samples): columns of their own
        for c in configs.values():
            sampled += [f"{m}@{c.eval.samples}" for m in c.eval.sampled_modes(c.eval.modes or (c.mode,))
                        if f"{m}@{c.eval.samples}" not in sampled]
        done = [f"{v + '/' if v else ''}{s}" for (v, s), f in finished.items() if f]
    except (ConfigError, ValueError) as exc:
        raise SystemExit(f"main: {exc}") from None
    if a.resume and overwrite:
        raise SystemExit("main: --resume keeps finished stages and --overwrite replaces them: pass one")
    if a.resume:  # each variant's first unfinished stage goes on from its newest mid-stage checkpoint, if any
        for v in variants:
            first_open = next((s for s in stages if not finished[v, s]), None)
            if first_open is not None:
                configs[v, first_open] = dataclasses.replace(configs[v, first_open], resume=True)
    if a.resume:
        for v in variants:
            flags = [finished[v, s] for s in stages]
            if any(flags[i + 1] and not flags[i] for i in range(len(flags) - 1)):
                raise SystemExit(f"main: --resume: {run_dir / v if v else run_dir} holds results of a later stage "
                                 f"without the earlier ones ({', '.join(s for s, f in zip(stages, flags) if f)}); "
                                 "pass --overwrite, or --run-dir <another folder>")
        done = []
    if done and not overwrite:
        raise SystemExit(f"main: {run_dir} already holds results of {', '.join(done)}; not replacing them: "
                         f"pass --overwrite to replace them, or --run-dir <another folder> to keep them")
    spider_n = a.spider_size if a.spider_size is not None else (preset.spider_eval or 100)
    if a.spider_eval:
        modes.append("spider")
    shown = modes + sampled  # the base model is not sampled: its rows there are empty
    data = stage_data.prepare_data(first)
    spider = stage_data.spider_held_out(a.spider_eval, spider_n, first.data.seed + 1) if a.spider_eval else None
    heading(console, f"sqlrl main job: {a.model}, preset {a.preset}"
                     + (f" (variants {', '.join(variants)})" if variants != [""] else "")
                     + f", stages {', '.join(stages)}, data {data.source}, run dir {run_dir}" + (" (overwrite)" if done else ""))
    console.print(f"tasks: {data.counts()}" + (f"; {spider.source}" if spider else ""), markup=False)

    def spider_eval(model: str) -> dict[str, Any]:
        if spider is None:
            return {}
        with runtime.Runtime(first, spider) as rt:
            return {"spider": held_out.evaluate(rt, model, spider.eval, "single").to_dict()}

    rows: list[dict[str, Any]] = []
    with Phases(1 + len(stages) * len(variants)) as phases:
        phases.start("base model evaluation")
        t0 = time.perf_counter()
        memory.reset_peak()  # this phase's own peak (run_stage resets it again at its start)
        base_key = {"model": a.model, "schema_style": first.model.schema_style, "modes": modes,
                    "tasks": [t.task_id for t in data.eval],
                    "spider": [t.task_id for t in spider.eval] if spider else None}
        base = read_base_eval(run_dir, base_key) if a.resume else None
        if base is None:
            with runtime.Runtime(first, data) as rt:
                base = {m: held_out.evaluate(rt, a.model, data.eval, m).to_dict() for m in modes if m != "spider"}
            base.update(spider_eval(a.model))
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "base_eval.json").write_text(json.dumps({**base_key, "eval": base}, default=str))
            resumed = False
        else:
            resumed = True
        rows.append({"name": f"base ({a.model})", "variant": "", "eval": base, "seconds": time.perf_counter() - t0,
                     "resumed": resumed, "peak_rss_gib": memory.peak_gib()})
        add_changes(rows, shown)
        phases.finished(phase_line(rows[-1], shown))

        # -- run: each variant's stages, each from the previous one's checkpoint
        for variant in variants:
            for stage in stages:
                title = STAGES[stage].title
                label = f"{variant} {stage}" if variant else stage
                phases.start(f"{label}: {title}")
                t0 = time.perf_counter()
                memory.reset_peak()  # this phase's own peak (run_stage resets it again at its start)
                cfg = configs[variant, stage]
                kept = a.resume and finished[variant, stage]
                summary = (read_summary(cfg, [t.task_id for t in data.eval]) if kept
                           else stage_job.run_stage(cfg, config_path=STAGES[stage].config_path()))
                evals = {e["mode"]: e for e in summary["eval"]}
                if spider is not None:
                    evals.update(spider_eval(summary["checkpoint"]))
                rows.append({"name": f"+ {label} {title}", "label": f"+ {stage} {title}", "variant": variant, "eval": evals,
                             "training": summary.get("training"), "seconds": time.perf_counter() - t0, "resumed": kept,
                             "peak_rss_gib": memory.peak_gib()})
                add_changes(rows, shown)
                phases.finished(phase_line(rows[-1], shown))

    # -- report: the table, once, and the figures
    table, md = results_table(rows, shown, data.source)
    total = time.perf_counter() - t_start
    report = {"model": a.model, "preset": a.preset, "variants": variants, "held_out": data.source,
              "spider": spider.source if spider else None, "rows": rows, "seconds": total}
    (run_dir / "results.json").write_text(json.dumps(report, indent=2, default=str))
    figures = write_figures(run_dir)
    (run_dir / "results.md").write_text(md + f"\nHeld-out tasks: {data.source}. {LEGEND}. Total: {total / 60:.1f} min.\n"
                                        + "".join(f"\n![{p.stem}]({p.relative_to(run_dir)})\n" for p in figures))
    heading(console, "result")
    if console.is_terminal:
        console.print(table)
    else:  # plain markdown, full width: nothing wrapped or cut in a log
        print(table_title(data.source, bool(sampled)), md, sep="\n", end="", flush=True)
    console.print(LEGEND, markup=False, highlight=False, soft_wrap=True)
    last = run_dir / variants[0] if variants[0] else run_dir
    console.print(f"total {total / 60:.1f} min; checkpoints in {last}/<stage>/final; "
                  f"figures in {run_dir}/curves; metrics in {last}/metrics.jsonl", markup=False)
    console.print(f"serve the trained model (docs/serving.md):\n  {serve_command(last / stages[-1] / 'final', data.catalog)}",
                  markup=False, highlight=False, soft_wrap=True)
    return 0


def serve_command(final: Path, catalog: dict) -> str:
    """The command that serves ``final`` as Zeno (both SQL endpoints) on the run's database files
    (a file-based engine's URL from each catalog entry, ``Dialect.file_based``: SQLite's)."""
    files = {db: next((url for dialect, url in urls.items() if _file_based(dialect)), None)
             for db, urls in sorted(catalog.items())}
    dbs = [f"--database {db}={url}" for db, url in files.items() if url]
    return " ".join(["SQLRL_SERVE_API_KEYS=<key> python -m jobs.serve", f"--model zeno={final.resolve()}", *dbs])


def _file_based(dialect: str) -> bool:
    engine = find(dialect)
    return engine is not None and engine.file_based


if __name__ == "__main__":
    from jobs.stop import exit_on_sigterm

    exit_on_sigterm()  # SIGTERM unwinds through finally: engines and sessions closed
    sys.exit(main())
