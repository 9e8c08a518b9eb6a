"""Benchmark one GRPO update with and without sharing each group's prompt (``GRPOConfig.share_prefix``).

    python bench/grpo_update.py [--model smollm2-135m] [--prompt 515] [--response 90] [--group 8]
                                [--groups 2] [--micro 8] [--rounds 3] [--out FILE]

Workload: ``--groups`` GRPO groups of ``--group`` rows; a group's rows share one prompt of
``--prompt`` tokens (515 = the mean single-turn prompt of the embedded default, bench/tokens.py)
and each row has its own response of 0.5-1.5 x ``--response`` tokens (random ids: a transformer's
cost does not depend on which tokens); rows right-padded; ``--micro`` rows per micro-batch (the
long preset sets it to the group size, so a micro-batch holds whole groups). Old log-probs are the
model's own, advantages +-1.

Each round runs one ``Learner.step`` (forward, backward, AdamW step) with ``share_prefix=False``
(the peer: every row's prompt run in full, as verl's actor does without sequence packing) and one
with ``share_prefix=True``, in alternating order, after one warm-up step of each. Reported: the
per-round ratio plain / shared (paired, same round) and its median, and both times per round.
The baseline depends on the CPU's matmul throughput (torch threads = all cores here) and on
nothing on disk. Prints a table and writes JSON (``--out``, default
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
from sqlrl.learn.losses import forward_logprobs  # noqa: E402
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
    args = ap.parse_args()

    learner = Learner(args.model, OptimConfig(lr=1e-7, micro_batch_size=args.micro, total_steps=2 * args.rounds + 2))
    batch = make_batch(args, learner.model)
    cfgs = {"plain": GRPOConfig(share_prefix=False), "shared": GRPOConfig(share_prefix=True)}

    def timed(name: str) -> float:
        t = time.perf_counter()
        learner.step(batch, "grpo", cfgs[name])
        return time.perf_counter() - t

    timed("plain"), timed("shared")  # warm-up
    rounds = []
    for i in range(args.rounds):
        order = ["plain", "shared"] if i % 2 == 0 else ["shared", "plain"]
        rounds.append({name: timed(name) for name in order})
    ratios = [r["plain"] / r["shared"] for r in rounds]
    tokens = int(batch.attention_mask.sum())
    print(f"GRPO update, {args.model}: {args.groups} groups x {args.group} rows, prompt {args.prompt}, "
          f"response ~{args.response}, micro-batch {args.micro}, {tokens} input tokens, {torch.get_num_threads()} threads")
    print("| round | plain s | shared s | plain / shared |\n|---|---|---|---|")
    for i, (r, q) in enumerate(zip(rounds, ratios)):
        print(f"| {i + 1} | {r['plain']:.1f} | {r['shared']:.1f} | {q:.2f} |")
    print(f"median paired ratio: {statistics.median(ratios):.2f} (min {min(ratios):.2f}, max {max(ratios):.2f})")
    out = Path(args.out or ROOT / "bench" / "results" / f"grpo_update-{time.strftime('%Y%m%d-%H%M%S')}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"command": " ".join(sys.argv), "args": vars(args), "machine": platform.processor()
                               or platform.machine(), "threads": torch.get_num_threads(), "input_tokens": tokens,
                               "rounds": rounds, "ratios": ratios, "median_ratio": statistics.median(ratios)},
                              indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
