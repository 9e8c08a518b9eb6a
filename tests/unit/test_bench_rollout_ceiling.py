"""bench/decode_ceiling.py, the decode-throughput ceiling of bench/rollout_engines.py: the curve measures b sequences at once on
both engine kinds (the lock-step adapter through one batched backend call of b prompts), and the
ceiling of the async / lock-step ratio is N * T_max / G over the lock-step side's trajectories/s."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import decode_ceiling  # noqa: E402
import rollout_engines  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from sqlrl.policy.load import load_policy

    return load_policy("tiny", weights=False, cache_dir=tmp_path_factory.getbasetemp() / "policy-cache")


def test_the_curve_runs_b_sequences_at_once_on_both_engine_kinds(tiny):
    import asyncio

    from sqlrl.policy.batched import BatchedEngine
    from sqlrl.policy.scripted import ScriptedBackend, ScriptedEngine

    backend = ScriptedBackend(tiny.tokenizer, tiny.eos_token_ids)
    lockstep = BatchedEngine(backend)
    engine = ScriptedEngine(tiny.tokenizer, tiny.eos_token_ids)
    try:
        answer = len(engine.script.ids(engine.script.answer(""), 64)[0])
        for measured in (decode_ceiling.decode_curve(lockstep, tiny, [1, 3, 5], 64),
                         decode_ceiling.decode_curve(engine, tiny, [1, 3, 5], 64)):
            assert sorted(measured) == [1, 3, 5]
            for b, row in measured.items():
                assert row["generated"] == b * answer and row["tok_s"] > 0
        # a one-token warm-up (the prompt into the prefix cache), then one batched call of b prompts
        assert backend.calls == [1, 1, 3, 5]
        assert [e for e, _ in engine.log].count("finish") == 1 + 1 + 3 + 5
    finally:
        asyncio.run(lockstep.close())
        asyncio.run(engine.close())


def test_the_rollout_benchmark_uses_these_functions():
    assert rollout_engines.decode_curve is decode_ceiling.decode_curve
    assert rollout_engines.ceilings is decode_ceiling.ceilings


def test_the_counting_prompt_has_the_context_asked_for(tiny):
    short = decode_ceiling.counting_prompt(tiny.tokenizer, 0)
    assert 0 < len(short) < 200
    for context in (1, 300, 1000):
        assert len(decode_ceiling.counting_prompt(tiny.tokenizer, context)) == context


def test_the_ceiling_is_n_times_the_best_throughput_over_tokens_against_the_lockstep_rate():
    async_run = {"trajectories": 32, "generated_tokens": 6400, "mean_running_busy": 8.0,
                 "curve": {"1": {"tok_s": 20.0}, "16": {"tok_s": 80.0}, "32": {"tok_s": 64.0}}}
    lockstep_run = {"traj_per_s": 0.25, "curve": {"32": {"tok_s": 90.0}}}
    out = decode_ceiling.ceilings({"vllm": [async_run], "vllm-batched": [lockstep_run]},
                                   [("vllm", "vllm-batched")])
    (r,) = out["vllm/vllm-batched"]["rounds"]
    # the async engine cannot finish 6400 tokens faster than 6400 / 80 = 80 s: 0.4 traj/s at best
    assert r["t_max"] == 80.0 and r["ceiling"] == pytest.approx(0.4 / 0.25)
    assert r["lockstep_t_max"] == 90.0
    # at the 8 sequences it kept running, between b=1 (20) and b=16 (80) on the curve
    assert r["t_at_running"] == pytest.approx(20.0 + 60.0 * 7 / 15)
    assert r["ceiling_at_running"] == pytest.approx(32 * r["t_at_running"] / 6400 / 0.25)
    assert decode_ceiling.interpolate(async_run["curve"], 64) == 64.0  # clamped to the last size
    assert out["vllm/vllm-batched"]["median"] == pytest.approx(1.6)
    # no curve (--curve ''): no ceiling claimed
    assert decode_ceiling.ceilings({"vllm": [{**async_run, "curve": {}}], "vllm-batched": [lockstep_run]},
                                    [("vllm", "vllm-batched")]) == {}
