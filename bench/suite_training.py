"""Does training on the stricter reward raise held-out success? Stage 3 (or 4) with and without
test-suite match (``reward.test_suite``), paired, scored by the suite metric (issue 47).

    python bench/suite_training.py --init runs/long/zeno/stage2/final [--variant zeno] [--seeds 0,1]
    python bench/suite_training.py --stage 4 --init ... --arms suite --no-eval   # the share only
    python bench/suite_training.py --quick        # the tiny model, a few tasks and steps: plumbing

For each seed the ``--stage`` job of the long preset (``jobs/configs/stage<N>.yaml`` + the preset's
overrides of that stage for ``--variant``: its data, steps, optimiser; stage 3 single-turn GRPO,
stage 4 interactive agentic GRPO) runs twice from the same start
checkpoint (``--init``) with the same data, held-out tasks and ``rl.seed``: once with the
default reward (``ex``: single-instance execution match) and once with ``reward.test_suite:
true`` (``suite``); ``--arms`` runs a subset, or another order. The arms use the jobs' own stage runner (``jobs.stage.run_stage``: the data
build, the GRPO loop, the checkpoint); their own held-out evaluation is off, because each would
score by its own reward. Instead the start checkpoint and the final checkpoints are evaluated
afterwards by one ``Runtime`` whose reward has the suite on (``jobs.held_out.evaluate``, greedy,
``--mode``: by default the stage's own, single-turn for 3 and agentic for 4), on the same held-out
tasks, so every number is the suite metric (``--no-eval`` skips it):

- per arm: held-out success with its 95% Wilson interval, and the paired difference against the
  start checkpoint;
- ``suite - ex`` (both arms run): the paired bootstrap difference of the two arms (per seed, and
  pooled over seeds by task-and-seed), with tasks gained/lost;
- the curves: each arm's per-step metrics (``metrics.jsonl``) drawn side by side in
  ``<out>/curves.png``;
- ``rewarded``: per arm and step, from its ``metrics.jsonl``, the scored samples, those the
  single-instance match rewards (``pass_rate + reward_lucky_match``: a suite pass is an EX pass)
  and, in the suite arm, those the suite rejects (``reward_lucky_match``), with their totals.

All arms share one suite folder (``<out>/test_suite``): the suite arm's stage pre-step distils
the suites (``Runtime.prebuild_suites``) and the evaluation reads them back. Writes
``<out>/report.json`` and ``<out>/report.md``. Timings are wall times of one run, not measurements.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ARMS = {"ex": [], "suite": ["reward.test_suite=true"]}
STAGES = {3: "single", 4: "agentic"}  # --stage: the stage number and its held-out evaluation's mode
# --quick: the tiny model on a handful of text-to-SQL tasks (plumbing, not a result)
QUICK = ["model.init=tiny", "data.mixture={text2sql: 1.0}", "data.eval_mixture={text2sql: 1.0}",
         "data.eval_split=test", "data.train_size=6", "data.eval_size=6", "rl.steps=2",
         "rl.tasks_per_step=2", "rl.group_size=2", "rl.probe_samples=0", "rl.sampling_rounds=1",
         "rollout.max_new_tokens=48", "rollout.batch=8", "model.mixed_precision=float32"]


def stage_overrides(args: argparse.Namespace) -> list[str]:
    """The long preset's overrides of stage ``args.stage`` for ``--variant`` (then ``--quick``'s,
    then the command line's ``--set``)."""
    from curriculum.stages import STAGES as CURRICULUM
    from jobs.presets import load_preset

    preset = load_preset(args.preset, CURRICULUM)
    out = preset.overrides(f"stage{args.stage}", args.variant)
    if args.quick:
        out += QUICK
    elif args.init:
        out.append(f"model.init={args.init}")
    return out + list(args.set)


def stage_config(stage: int, overrides: Sequence[str]) -> Any:
    """``jobs/configs/stage<stage>.yaml`` with ``overrides`` (a ``StageConfig``)."""
    from curriculum.config import load_stage_config

    return load_stage_config(str(ROOT / f"jobs/configs/stage{stage}.yaml"), [f"stage=stage{stage}", *overrides])


def run_arm(stage: int, base: list[str], arm: str, seed: int, out: Path) -> dict[str, Any]:
    """One stage job (``jobs.stage.run_stage``) in ``<out>/<arm>_s<seed>``; its summary."""
    from jobs.stage import run_stage

    run_dir = out / f"{arm}_s{seed}"
    cfg = stage_config(stage, [
        *base, *ARMS[arm], f"reward.test_suite_dir={out / 'test_suite'}",
        f"run_dir={run_dir}", f"rl.seed={seed}", "eval.enabled=false", "overwrite=true"])
    t0 = time.perf_counter()
    summary = run_stage(cfg)
    summary["wall_s"] = round(time.perf_counter() - t0, 1)
    return summary


def evaluate_all(stage: int, base: list[str], out: Path, models: dict[str, str], mode: str) -> dict[str, Any]:
    """Every model on the same held-out tasks, scored with the suite on (one ``Runtime``)."""
    import jobs.held_out as held_out
    import jobs.runtime as runtime
    import jobs.stage_data as stage_data

    cfg = stage_config(stage, [
        *base, "reward.test_suite=true", f"reward.test_suite_dir={out / 'test_suite'}",
        f"run_dir={out / 'eval'}", "overwrite=true"])
    data = stage_data.prepare_data(cfg)
    with runtime.Runtime(cfg, data) as rt:
        report = rt.prebuild_suites(data.eval)
        evals = {name: held_out.evaluate(rt, model, data.eval, mode).to_dict() for name, model in models.items()}
    return {"tasks": len(data.eval), "suites": report.to_dict() if report else None, "evals": evals}


def pooled(evals: dict[str, Any], seeds: Sequence[int], before: str, after: str) -> dict[str, Any] | None:
    """``after - before`` over (seed, task) pairs of every seed (per-seed arms named ``<arm>_s<seed>``)."""
    from jobs.held_out import outcomes
    from sqlrl.eval.stats import paired_difference

    b, a = {}, {}
    for s in seeds:
        for key, arm in ((b, before), (a, after)):
            name = arm if arm == "start" else f"{arm}_s{s}"
            key.update({f"s{s}:{t}": v for t, v in (outcomes(evals[name]) or {}).items()})
    try:
        return paired_difference(b, a).to_dict()
    except ValueError:
        return None


PREFERRED = ("pass_rate", "reward_mean", "reward_result", "reward_lucky_match", "reward_format",
             "trained_reward_mean")  # the first panels (the ex arm logs no lucky_match)


def rewarded(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """From one arm's per-step metrics rows: per step the scored samples (``trajectories -
    excluded``), those single-instance EX rewards (``(pass_rate + reward_lucky_match) x scored``:
    a suite pass is also an EX pass, a lucky match is an EX pass the suite fails) and those the
    suite rejects (``reward_lucky_match x scored``; ``None`` in an arm without the suite), and
    the totals. A row without ``trajectories`` or ``pass_rate`` is a ``ValueError``."""
    steps = []
    for r in rows:
        if not isinstance(r.get("trajectories"), int) or not isinstance(r.get("pass_rate"), (int, float)):
            raise ValueError(f"metrics row of step {r.get('step')!r} has no trajectories/pass_rate: {sorted(r)}")
        scored = r["trajectories"] - int(r.get("excluded", 0))
        lucky = r.get("reward_lucky_match")
        rejected = None if lucky is None else round(lucky * scored)
        steps.append({"step": r.get("step"), "scored": scored,
                      "rewarded_ex": round((r["pass_rate"] + (lucky or 0.0)) * scored), "rejected": rejected})
    total = {k: sum(s[k] for s in steps) for k in ("scored", "rewarded_ex")}
    total["rejected"] = None if any(s["rejected"] is None for s in steps) else sum(s["rejected"] for s in steps)
    return {"steps": steps, **total}


def curves(out: Path, runs: dict[str, Path], stage: str) -> Path | None:
    """Each arm's per-step metrics (its own reward's: ``pass_rate`` is EX in the ex arm and the
    suite's in the suite arm), side by side, one panel per metric (up to 8)."""
    from sqlrl.metrics import read_metrics

    series = {name: read_metrics(d / "metrics.jsonl", stage=stage) for name, d in runs.items()}
    numeric = {k for rows in series.values() for r in rows for k, v in r.items()
               if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in ("step", "time")}
    keys = [k for k in PREFERRED if k in numeric] + sorted(numeric - set(PREFERRED))
    keys = keys[:8]
    if not keys:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(4, len(keys))
    rows = (len(keys) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3 * rows), squeeze=False)
    for ax, key in zip(axes.flat, keys):
        for name, rows_ in series.items():
            pts = [(r["step"], r[key]) for r in rows_ if isinstance(r.get(key), (int, float))]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
        ax.set_title(key, fontsize=9)
        ax.set_xlabel("step")
    axes.flat[0].legend(fontsize=7)
    for ax in list(axes.flat)[len(keys):]:
        ax.axis("off")
    fig.tight_layout()
    path = out / "curves.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def report_md(rep: dict[str, Any]) -> str:
    from jobs.held_out import change_text, success_text

    lines = [f"# Stage {rep['stage']} with and without the test-suite reward ({rep['preset']}/{rep['variant']}"
             f"{', quick' if rep['quick'] else ''})", "", f"Start: {rep['start']}; seeds {rep['seeds']}; "
             f"arms {', '.join(rep['arms'])}.", ""]
    if rep["evaluation"]:
        ev = rep["evaluation"]["evals"]
        lines += [f"{rep['evaluation']['tasks']} held-out tasks, scored by the suite metric ({rep['mode']}, greedy).", "",
                  "| model | held-out success (suite) | vs start (paired 95%) | training wall |", "|---|---|---|---|",
                  f"| start | {success_text(ev['start'])} | | |"]
        for name in ev:
            if name == "start":
                continue
            lines.append(f"| {name} | {success_text(ev[name])} | {change_text(rep['vs_start'][name]) if rep['vs_start'][name] else 'n/a'} | "
                         f"{rep['runs'][name]['wall_s']:.0f} s |")
        if rep["suite_minus_ex"]:
            lines += ["", "| suite - ex | paired difference (95%) |", "|---|---|"]
            for name, d in rep["suite_minus_ex"].items():
                lines.append(f"| {name} | {change_text(d) if d else 'n/a'} |")
    else:
        lines += ["No held-out evaluation (--no-eval)."]
    lines += ["", "| arm | training wall | rewarded by EX per step (of scored) | rejected by the suite per step | total rejected |",
              "|---|---|---|---|---|"]
    for name, r in rep["rewarded"].items():
        per = ", ".join(f"{s['rewarded_ex']}/{s['scored']}" for s in r["steps"])
        rej = ", ".join("-" if s["rejected"] is None else str(s["rejected"]) for s in r["steps"])
        total = "-" if r["rejected"] is None else f"{r['rejected']} of {r['rewarded_ex']}"
        lines.append(f"| {name} | {rep['runs'][name]['wall_s']:.0f} s | {per} | {rej} | {total} |")
    if rep.get("curves"):
        lines += ["", f"![curves]({Path(rep['curves']).name})"]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="long")
    ap.add_argument("--stage", type=int, choices=sorted(STAGES), default=3,
                    help="the preset's stage to train: 3 (single-turn GRPO) or 4 (agentic GRPO)")
    ap.add_argument("--variant", default="zeno", help="the preset's variant whose stage data to use")
    ap.add_argument("--init", default=None, help="the start checkpoint (e.g. runs/long/zeno/stage2/final); "
                                                 "default: the preset's model.init for the stage")
    ap.add_argument("--seeds", default="0", help="comma-separated rl.seed values; one pair of runs each")
    ap.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated arms to run, in this order "
                                                         f"(per seed), of {', '.join(ARMS)}")
    ap.add_argument("--mode", default=None, help="the held-out evaluation's mode (default: the stage's, "
                                                 + ", ".join(f"{k}: {v}" for k, v in STAGES.items()) + ")")
    ap.add_argument("--no-eval", action="store_true", help="no held-out evaluation (the training share only)")
    ap.add_argument("--out", default=None, help="default runs/suite_training[_quick]")
    ap.add_argument("--quick", action="store_true", help="the tiny model, 6 tasks, 2 steps (plumbing)")
    ap.add_argument("--set", nargs="*", default=[], help="more stage key=value overrides")
    args = ap.parse_args(argv)
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        raise SystemExit(f"--seeds must be comma-separated integers, got {args.seeds!r}") from None
    if not seeds:
        raise SystemExit("--seeds names no seed")
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    if not arms or any(a not in ARMS for a in arms) or len(set(arms)) != len(arms):
        raise SystemExit(f"--arms must name some of {', '.join(ARMS)} once each, got {args.arms!r}")
    if not (args.quick or args.init or any(o.startswith("model.init=") for o in args.set)):
        raise SystemExit(f"--init is needed: the start checkpoint of stage {args.stage} "
                         "(e.g. runs/long/zeno/stage2/final)")
    mode = args.mode or STAGES[args.stage]
    out = Path(args.out or ("runs/suite_training_quick" if args.quick else "runs/suite_training")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    base = stage_overrides(args)
    runs: dict[str, dict[str, Any]] = {}
    for seed in seeds:
        for arm in arms:
            runs[f"{arm}_s{seed}"] = run_arm(args.stage, base, arm, seed, out)
    start = next(o.split("=", 1)[1] for o in reversed(base) if o.startswith("model.init="))
    from jobs.held_out import compare
    from sqlrl.metrics import read_metrics

    stage = f"stage{args.stage}"
    rep: dict[str, Any] = {
        "preset": args.preset, "variant": args.variant, "stage": args.stage, "arms": arms, "quick": args.quick,
        "mode": mode, "seeds": seeds, "start": start, "overrides": base, "evaluation": None, "vs_start": {},
        "suite_minus_ex": {},
        "rewarded": {name: rewarded(read_metrics(out / name / "metrics.jsonl", stage=stage)) for name in runs},
        "runs": {name: {"wall_s": s["wall_s"], "steps": s["steps"], "training": s["training"],
                        "test_suites": s.get("test_suites"), "last": s["last"]} for name, s in runs.items()}}
    if not args.no_eval:
        models = {"start": start, **{name: s["checkpoint"] for name, s in runs.items()}}
        rep["evaluation"] = evaluation = evaluate_all(args.stage, base, out, models, mode)
        ev = evaluation["evals"]
        rep["vs_start"] = {name: compare(ev["start"], ev[name]) for name in runs}
        if len(arms) == 2:
            rep["suite_minus_ex"] = {**{f"seed {s}": compare(ev[f"ex_s{s}"], ev[f"suite_s{s}"]) for s in seeds},
                                     **({"pooled": pooled(ev, seeds, "ex", "suite")} if len(seeds) > 1 else {})}
    path = curves(out, {name: out / name for name in runs}, stage)
    rep["curves"] = str(path) if path else None
    (out / "report.json").write_text(json.dumps(rep, indent=2, default=str))
    (out / "report.md").write_text(report_md(rep))
    print(report_md(rep))
    return rep


if __name__ == "__main__":
    from jobs.stop import exit_on_sigterm

    exit_on_sigterm()  # kill <pid> unwinds: the vLLM engine core and sessions are closed
    main()
