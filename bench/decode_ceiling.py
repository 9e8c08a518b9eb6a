"""The decode-throughput ceiling of ``bench/rollout_engines.py`` (issue 43's async / lock-step ratio).

``--curve 1,4,8,16,32`` (on by default; ``--curve ""`` skips it): after its rollout, each engine (the same instance, warm) decodes ``--curve-tokens`` tokens greedily for
``b`` copies of a counting prompt at once (``--curve-context`` tokens long; by default the
rollout's mean prompt length, since attention over a longer context costs more per token), for
every ``b`` in the list (async engines: ``b``
concurrent ``generate`` calls; the lock-step adapter: one ``backend.generate`` of ``b`` prompts, as
its rounds do), and reports generated tokens/s per ``b``. The best of these, ``T_max``, bounds what
any schedule can get from that engine on this machine: a rollout of ``N`` trajectories that
generates ``G`` tokens cannot run faster than ``G / T_max`` (prefill, contexts growing past the
prompt and tool calls only add to it). So per round **the ceiling of the async / lock-step ratio** is
``(N * T_max(async) / G(async)) / (lock-step trajectories/s)``: if it is below the issue's 1.5x,
no scheduling on this engine can reach the target on this machine, whatever the turn lengths. The
same ratio with the curve read at the batch the async side actually kept running (its busy mean,
interpolated) is printed beside it: trajectories end after different numbers of turns, so fewer
than ``N`` are alive for most of a rollout.

Guarantees: ``decode_curve`` times decoding, not prefill (the prompt is put in the engine's prefix
cache with one token first); ``ceilings`` claims nothing for a run without a curve.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any


def counting_prompt(tokenizer: Any, context: int) -> list[int]:
    """Token ids of "1, 2, 3, ..." (greedy decoding keeps counting): 20 numbers, or the last
    ``context`` tokens of a count long enough to fill them (``context`` > 0)."""
    if context <= 0:
        return list(tokenizer(", ".join(str(i) for i in range(1, 21)) + ",", add_special_tokens=False)["input_ids"])
    n = 20
    while True:
        ids = list(tokenizer(", ".join(str(i) for i in range(1, n + 1)) + ",", add_special_tokens=False)["input_ids"])
        if len(ids) >= context:
            return ids[-context:]
        n *= 2


def decode_curve(engine: Any, policy: Any, sizes: list[int], tokens: int, context: int = 0) -> dict[int, dict]:
    """Generated tokens/s of ``engine`` for ``b`` greedy sequences at once, for each ``b`` in ``sizes``
    (module docstring: the ceiling), after a prompt of ``context`` tokens (0: a short one). The
    lock-step adapter is measured through its backend's own batched call (its rounds' call); the
    async engines through ``b`` concurrent ``generate`` calls."""
    from sqlrl.policy.batched import BatchedEngine
    from sqlrl.policy.types import SamplingParams

    prompt = counting_prompt(policy.tokenizer, context)
    params = SamplingParams(temperature=0.0, max_new_tokens=tokens)

    def run(b: int, sampling: SamplingParams) -> list:
        if isinstance(engine, BatchedEngine):
            return list(engine.backend.generate([prompt] * b, sampling))

        async def together() -> list:
            return list(await asyncio.gather(*(engine.generate(prompt, sampling) for _ in range(b))))
        return asyncio.run(together())

    # one token first, so the prompt is in the engine's prefix cache: the curve times decoding,
    # not b prefills of the same prompt in one step
    run(1, SamplingParams(temperature=0.0, max_new_tokens=1))
    out: dict[int, dict] = {}
    for b in sizes:
        t0 = time.perf_counter()
        gens = run(b, params)
        wall = time.perf_counter() - t0
        generated = sum(len(g.token_ids) for g in gens)
        out[b] = {"tok_s": generated / wall, "wall_s": round(wall, 3), "generated": generated,
                  "full_length": sum(len(g.token_ids) == tokens for g in gens)}
    return out


def interpolate(curve: dict, b: float) -> float:
    """tokens/s at ``b`` sequences, linear between the curve's measured sizes (clamped to its ends)."""
    points = sorted((int(k), v["tok_s"]) for k, v in curve.items())
    if b <= points[0][0]:
        return points[0][1]
    for (b0, t0), (b1, t1) in zip(points, points[1:]):
        if b <= b1:
            return t0 + (t1 - t0) * (b - b0) / (b1 - b0)
    return points[-1][1]


def ceilings(rows: dict[str, list[dict]], pairs: list[tuple[str, str]]) -> dict:
    """Per pair and round: the async engine's best decode throughput ``T_max`` and the ceiling of the
    async / lock-step trajectories/s ratio it allows (module docstring); empty without curves."""
    out = {}
    for a, b in pairs:
        rounds = []
        for x, y in zip(rows[a], rows[b]):
            if not x.get("curve") or not x["generated_tokens"]:
                continue
            t_max = max(c["tok_s"] for c in x["curve"].values())
            bound = x["trajectories"] * t_max / x["generated_tokens"]
            # the same at the batch the async side kept running (busy), read off the curve
            at_running = interpolate(x["curve"], x.get("mean_running_busy", 0.0))
            rounds.append({"t_max": t_max, "ceiling": bound / y["traj_per_s"],
                           "t_at_running": at_running,
                           "ceiling_at_running": (x["trajectories"] * at_running / x["generated_tokens"]) / y["traj_per_s"],
                           "lockstep_t_max": max((c["tok_s"] for c in (y.get("curve") or {}).values()), default=None)})
        if rounds:
            out[f"{a}/{b}"] = {"median": statistics.median(r["ceiling"] for r in rounds), "rounds": rounds}
    return out


