"""Benchmark one GRPO update: with and without sharing each group's prompt (``GRPOConfig.share_prefix``),
or in fp32 and in bf16 (``--compare precision``).

    python bench/grpo_update.py [--compare share|precision] [--model smollm2-135m] [--prompt 515]
                                [--response 90] [--group 8] [--groups 2] [--micro 8] [--rounds 3] [--out FILE]

Workload: ``--groups`` GRPO groups of ``--group`` rows; a group's rows share one prompt of
``--prompt`` tokens (515 = the mean single-turn prompt of the embedded default, bench/tokens.py)
and each row has its own response of 0.5-1.5 x ``--response`` tokens (random ids: a transformer's
cost does not depend on which tokens); rows right-padded; ``--micro`` rows per micro-batch (the
long preset sets it to the group size, so a micro-batch holds whole groups). Old log-probs are the
model's own, advantages +-1.

``--compare share`` (default): each round runs one ``Learner.step`` (forward, backward, AdamW
step) with ``share_prefix=False`` (the peer: every row's prompt run in full, as verl's actor does
without sequence packing) and one with ``share_prefix=True``, in alternating order, after one
warm-up step of each. ``--compare precision``: two learners on the same weights, ``fp32`` and
``bf16`` (``torch.autocast``: bf16 matmuls, fp32 weights and Adam state), both sharing the prompt;
before any step it also reports how far the bf16 forward's token probabilities are from fp32's
on the trained columns (verl's rollout-mismatch metrics; random tokens, so the probabilities are
small: read it as an order of magnitude). Reported: the per-round ratio of the two (paired, same
round) and its median, and both times per round. The baseline depends on the CPU's matmul
throughput (torch threads = all cores here; bf16 is fast only with AVX512-BF16 or AMX, printed as
``bf16 hardware``) and on nothing on disk. Prints a table and writes JSON (``--out``, default
bench/results/grpo_update-<timestamp>.json).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sqlrl.learn.batch import TokenBatch  # noqa: E402
from sqlrl.learn.config import GRPOConfig  # noqa: E402
from sqlrl.learn.engine import Learner  # noqa: E402
from sqlrl.learn.fsdp import cpu_bf16_hardware  # noqa: E402
from sqlrl.learn.losses import forward_logprobs, rollout_mismatch  # noqa: E402
from sqlrl.learn.optim import OptimConfig  # noqa: E402


def make_batch(args, model) -> TokenBatch:
    gen = torch.Generator().manual_seed(0)
    vocab = int(model.config.vocab_size)
    rows = []
    for _ in range(args.groups):
        prompt = torch.randint(5, vocab, (args.prompt,), generator=gen)
        for _ in range(args.group):
            n = int(args.response * (0.5 + torch.rand(1, generator=gen).item()))
            rows.append((prompt, torch.randint(5, vocab, (n,), generator=gen)))
    width = max(len(p) + len(r) for p, r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    attn, mask = torch.zeros_like(ids), torch.zeros(len(rows), width)
    for i, (p, r) in enumerate(rows):
        n = len(p) + len(r)
        ids[i, :n], attn[i, :n], mask[i, len(p):n] = torch.cat([p, r]), 1, 1
    batch = TokenBatch(input_ids=ids, attention_mask=attn, loss_mask=mask)
    with torch.no_grad():
        old, _ = forward_logprobs(model, batch, trained_only=True)
    sign = torch.tensor([1.0 if i % 2 else -1.0 for i in range(len(rows))])[:, None]
    return dataclasses.replace(batch, old_logprobs=old, advantages=mask * sign)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--prompt", type=int, default=515)
    ap.add_argument("--response", type=int, default=90)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--groups", type=int, default=2)
    ap.add_argument("--micro", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None)
    ap.add_argument("--compare", choices=("share", "precision"), default="share")
    args = ap.parse_args()

    optim = OptimConfig(lr=1e-7, micro_batch_size=args.micro, total_steps=2 * args.rounds + 2)
    learner = Learner(args.model, optim)
    batch = make_batch(args, learner.model)
    extra: dict = {"bf16_hardware": cpu_bf16_hardware()}
    if args.compare == "share":
        a, b = "plain", "shared"
        runs = {a: (learner, GRPOConfig(share_prefix=False)), b: (learner, GRPOConfig(share_prefix=True))}
    else:
        a, b = "fp32", "bf16"
        half = Learner(args.model, optim, mixed_precision="bf16")
        with torch.no_grad(), half.autocast():
            lp, _ = forward_logprobs(half.model, batch, trained_only=True)
        extra["bf16_vs_fp32"] = rollout_mismatch(lp.float(), batch.old_logprobs, batch.loss_mask)
        runs = {a: (learner, GRPOConfig(share_prefix=True)), b: (half, GRPOConfig(share_prefix=True))}

    def timed(name: str) -> float:
        who, cfg = runs[name]
        t = time.perf_counter()
        who.step(batch, "grpo", cfg)
        return time.perf_counter() - t

    timed(a), timed(b)  # warm-up
    rounds = []
    for i in range(args.rounds):
        order = [a, b] if i % 2 == 0 else [b, a]
        rounds.append({name: timed(name) for name in order})
    ratios = [r[a] / r[b] for r in rounds]
    tokens = int(batch.attention_mask.sum())
    print(f"GRPO update, {args.model}: {args.groups} groups x {args.group} rows, prompt {args.prompt}, "
          f"response ~{args.response}, micro-batch {args.micro}, {tokens} input tokens, {torch.get_num_threads()} threads, "
          f"bf16 hardware: {extra['bf16_hardware']}")
    if "bf16_vs_fp32" in extra:
        print("bf16 forward vs fp32 (token probabilities, trained columns):",
              ", ".join(f"{k} {v:.2e}" for k, v in extra["bf16_vs_fp32"].items()))
    print(f"| round | {a} s | {b} s | {a} / {b} |\n|---|---|---|---|")
    for i, (r, q) in enumerate(zip(rounds, ratios)):
        print(f"| {i + 1} | {r[a]:.1f} | {r[b]:.1f} | {q:.2f} |")
    print(f"median paired ratio: {statistics.median(ratios):.2f} (min {min(ratios):.2f}, max {max(ratios):.2f})")
    out = Path(args.out or ROOT / "bench" / "results" / f"grpo_update-{time.strftime('%Y%m%d-%H%M%S')}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"command": " ".join(sys.argv), "args": vars(args), "machine": platform.processor()
                               or platform.machine(), "threads": torch.get_num_threads(), "input_tokens": tokens,
                               "rounds": rounds, "ratios": ratios, "median_ratio": statistics.median(ratios), **extra},
                              indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
