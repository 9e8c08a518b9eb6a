"""bench/rollout_engines.py's decode-throughput ceiling: the curve measures b sequences at once on
both engine kinds (the lock-step adapter through one batched backend call of b prompts), and the
ceiling of the async / lock-step ratio is N * T_max / G over the lock-step side's trajectories/s."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

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
        for measured in (rollout_engines.decode_curve(lockstep, tiny, [1, 3, 5], 64),
                         rollout_engines.decode_curve(engine, tiny, [1, 3, 5], 64)):
            assert sorted(measured) == [1, 3, 5]
            for b, row in measured.items():
                assert row["generated"] == b * answer and row["tok_s"] > 0
        assert backend.calls == [1, 3, 5]  # one batched call of b prompts, as the adapter's rounds
        assert [e for e, _ in engine.log].count("finish") == 1 + 3 + 5
    finally:
        asyncio.run(lockstep.close())
        asyncio.run(engine.close())


def test_the_ceiling_is_n_times_the_best_throughput_over_tokens_against_the_lockstep_rate():
    async_run = {"trajectories": 32, "generated_tokens": 6400,
                 "curve": {"1": {"tok_s": 20.0}, "16": {"tok_s": 80.0}, "32": {"tok_s": 64.0}}}
    lockstep_run = {"traj_per_s": 0.25, "curve": {"32": {"tok_s": 90.0}}}
    out = rollout_engines.ceilings({"vllm": [async_run], "vllm-batched": [lockstep_run]},
                                   [("vllm", "vllm-batched")])
    (r,) = out["vllm/vllm-batched"]["rounds"]
    # the async engine cannot finish 6400 tokens faster than 6400 / 80 = 80 s: 0.4 traj/s at best
    assert r["t_max"] == 80.0 and r["ceiling"] == pytest.approx(0.4 / 0.25)
    assert r["lockstep_t_max"] == 90.0
    assert out["vllm/vllm-batched"]["median"] == pytest.approx(1.6)
    # no curve (--curve ''): no ceiling claimed
    assert rollout_engines.ceilings({"vllm": [{**async_run, "curve": {}}], "vllm-batched": [lockstep_run]},
                                    [("vllm", "vllm-batched")]) == {}
