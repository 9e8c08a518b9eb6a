"""vLLM backend: the output conversion and the head-size check (run everywhere, with stand-in
objects). The real engine is tests/integration/test_vllm_backend.py."""

from __future__ import annotations

from types import SimpleNamespace as NS

import os
import pytest

from sqlrl.policy.vllm_backend import head_size, to_generation


def completion(finish_reason, stop_reason, ids=(5, 9, 2), text="ab"):
    logprobs = [{t: NS(logprob=-0.5 * (i + 1)), 77: NS(logprob=-9.0)} for i, t in enumerate(ids)]
    return NS(token_ids=list(ids), logprobs=logprobs, text=text, finish_reason=finish_reason, stop_reason=stop_reason)


def test_finish_reasons_and_logprobs():
    g = to_generation(completion("stop", None), 3, 1)
    assert (g.finish_reason, g.token_ids, g.logprobs, g.text) == ("eos", (5, 9, 2), (-0.5, -1.0, -1.5), "ab")
    assert g.meta == {"prompt_index": 3, "sample_index": 1}
    assert to_generation(completion("stop", 2)).finish_reason == "eos"
    assert to_generation(completion("stop", "</tool_call>")).finish_reason == "stop"
    assert to_generation(completion("length", None)).finish_reason == "length"


def test_missing_logprobs_or_unknown_reason_is_an_error():
    bad = completion("stop", None)
    bad.logprobs = None
    with pytest.raises(ValueError, match="logprobs"):
        to_generation(bad)
    with pytest.raises(ValueError, match="finish_reason"):
        to_generation(completion("abort", None))


def test_head_size_from_config(tmp_path):
    (tmp_path / "config.json").write_text('{"hidden_size": 64, "num_attention_heads": 4}')
    assert head_size(tmp_path) == 16
    (tmp_path / "config.json").write_text('{"hidden_size": 64, "num_attention_heads": 4, "head_dim": 32}')
    assert head_size(tmp_path) == 32
    (tmp_path / "config.json").write_text("not json")
    assert head_size(tmp_path) is None
    assert head_size(tmp_path / "missing") is None


def test_auto_backend_picks_vllm_only_where_it_can_run(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from sqlrl.policy import backends

    pytest.importorskip("torch")
    (tmp_path / "config.json").write_text('{"hidden_size": 576, "num_attention_heads": 9}')  # SmolLM2: 64
    smol_like = SimpleNamespace(path=tmp_path)
    tiny_dir = tmp_path / "tiny"
    tiny_dir.mkdir()
    (tiny_dir / "config.json").write_text('{"hidden_size": 64, "num_attention_heads": 4}')
    tiny_like = SimpleNamespace(path=tiny_dir)
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "vllm" else None)
    assert backends.vllm_unavailable(smol_like) is None
    assert "head size 16" in backends.vllm_unavailable(tiny_like)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    assert backends.vllm_unavailable(smol_like) == "vllm is not installed"
    chosen = []
    # "auto" builds through the registry's entries (BACKENDS), so those are what a spy replaces
    monkeypatch.setitem(backends.BACKENDS, "hf", lambda policy, seed=None, **o: chosen.append(("hf", o)) or "hf-backend")
    monkeypatch.setitem(backends.BACKENDS, "vllm", lambda policy, seed=None, **o: chosen.append(("vllm", o)) or "vllm-backend")
    assert backends.make_backend("auto", smol_like, kv_cache_gb=1) == "hf-backend"  # vllm missing
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "vllm" else None)
    assert backends.make_backend("auto", smol_like, kv_cache_gb=1) == "vllm-backend"
    assert backends.make_backend("auto", tiny_like) == "hf-backend"
    assert backends.make_backend("auto", tiny_like, prefix_cache=False) == "hf-backend"
    assert chosen == [("hf", {}), ("vllm", {"kv_cache_gb": 1}), ("hf", {}), ("hf", {"prefix_cache": False})]


def test_the_sampling_seed_seeds_vllms_engine_and_nothing_else(monkeypatch):
    """vLLM's CPU build samples from the engine's generator, so the caller's seed (``rl.seed``
    through the loop's ``SamplingParams.seed``) must reach the engine, or every run draws the same
    samples; a ``seed`` in the backend options wins; the HF and scripted backends seed per call and
    ignore it. ``Agent.build`` passes the loop's seed to the engine it makes."""
    import types

    import sqlrl.policy.vllm_backend as vb
    from sqlrl.policy import backends
    from sqlrl.agent.agent import Agent, AgentConfig
    from sqlrl.policy.spec import PolicySpec
    from sqlrl.agent.loop import LoopConfig
    from sqlrl.policy import hf_backend
    from sqlrl.policy.types import SamplingParams

    made = []
    monkeypatch.setattr(vb, "VLLMBackend", lambda path, **o: made.append(o) or "vllm-backend")
    monkeypatch.setattr(hf_backend, "HFBackend", lambda policy, **o: made.append(("hf", o)) or "hf-backend")
    param = types.SimpleNamespace(dtype="torch.float32")
    policy = types.SimpleNamespace(path="/m", eos_token_ids=(2,), model=types.SimpleNamespace(
        parameters=lambda: iter([param])))
    backends.make_backend("vllm", policy, 7)
    backends.make_backend("vllm", policy)
    backends.make_backend("hf", policy, 7, prefix_cache=False)
    assert [m.get("seed") if isinstance(m, dict) else m for m in made] == [7, None, ("hf", {"prefix_cache": False})]
    seen = []
    monkeypatch.setattr(backends, "make_engine", lambda name, pol, seed=None, **o: seen.append((name, seed, o)))
    monkeypatch.setattr("sqlrl.policy.load.load_policy", lambda model, dtype=None, weights=True: types.SimpleNamespace(
        tokenizer=None))
    monkeypatch.setattr(backends, "place_policy", lambda pol, device, backend: pol)
    monkeypatch.setattr("sqlrl.agent.agent.HFChatFormat", lambda tok: None)
    loop = LoopConfig(mode="single", sampling=SamplingParams(temperature=0.7, seed=11))
    Agent.build(AgentConfig(PolicySpec("m", backend="vllm", engine_options={"kv_cache_gb": 1}), loop=loop))
    Agent.build(AgentConfig(PolicySpec("m", backend="vllm", engine_options={"seed": 3}), loop=loop))
    assert seen == [("vllm", 11, {"kv_cache_gb": 1}), ("vllm", 3, {})]


def test_the_lock_step_vllm_engine_calls_an_in_process_cpu_backend_on_its_own_thread(monkeypatch):
    """``make_engine("vllm-batched")`` (the rollout workers' lock-step path) over a thread-bound
    ``VLLMBackend`` (in-process on CPU: its attention checks the calling thread) calls it inline, as
    ``as_engine`` does; one that is not thread-bound goes to the adapter's worker thread."""
    import types

    import sqlrl.policy.vllm_backend as vb
    from sqlrl.policy import backends

    class Fake:
        per_request_seeds = False

        def __init__(self, path, **options):
            self.thread_bound = options.pop("in_process", True)

        def close(self):
            pass

    monkeypatch.setattr(vb, "VLLMBackend", Fake)
    param = types.SimpleNamespace(dtype="torch.float32")
    policy = types.SimpleNamespace(path="/m", eos_token_ids=(2,), model=types.SimpleNamespace(
        parameters=lambda: iter([param])))
    assert backends.make_engine("vllm-batched", policy).inline is True
    assert backends.make_engine("vllm-batched", policy, in_process=False).inline is False


def test_small_machines_reserve_no_core_for_vllms_scheduler_unless_the_user_says(monkeypatch):
    from sqlrl.policy import vllm_engine

    monkeypatch.delenv("VLLM_CPU_NUM_OF_RESERVED_CPU", raising=False)
    monkeypatch.setattr(vllm_engine.os, "sched_getaffinity", lambda pid: {0, 1})
    vllm_engine.reserve_no_core_on_small_machines()
    assert os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"
    monkeypatch.setenv("VLLM_CPU_NUM_OF_RESERVED_CPU", "1")  # the user's choice stays
    vllm_engine.reserve_no_core_on_small_machines()
    assert os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "1"
    monkeypatch.delenv("VLLM_CPU_NUM_OF_RESERVED_CPU")
    monkeypatch.setattr(vllm_engine.os, "sched_getaffinity", lambda pid: set(range(32)))
    vllm_engine.reserve_no_core_on_small_machines()  # a big machine keeps vLLM's own reservation
    assert "VLLM_CPU_NUM_OF_RESERVED_CPU" not in os.environ
