"""``HFEngine`` on the tiny model: equal to ``HFBackend`` alone (greedy, seeded samples, log-probs =
``score``), admission at a decode step, streaming, abort/cancel freeing the row, the three weight-update
policies with per-token versions, refused weights, and per-request failures.

Tests that need the engine at a known step block its thread in ``step_hook`` on an event and submit
work meanwhile; ``await asyncio.sleep(0)`` only lets a just-created task run up to its submission."""

from __future__ import annotations

import asyncio
import threading

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from sqlrl.policy.engine import EngineError, UpdatePolicy, check_engine_class  # noqa: E402
from sqlrl.policy.hf_backend import HFBackend  # noqa: E402
from sqlrl.policy.hf_engine import HFEngine, make_hf_engine  # noqa: E402
from sqlrl.policy.load import load_policy  # noqa: E402
from sqlrl.policy.types import SamplingParams  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

QUESTIONS = ["hi", "How many books are in the library?", "List every flight from Paris to Rome after 2020.",
             "SELECT name FROM", "Which customers ordered twice?", "count the rows of orders"]
GREEDY = SamplingParams(temperature=0, max_new_tokens=16)
SAMPLED = SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=16, seed=11)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.getbasetemp() / "policy-cache"


@pytest.fixture(scope="module")
def policy(cache_dir):
    """The tiny policy the tests without weight updates share."""
    return _engine_policy(cache_dir)


@pytest.fixture(scope="module")
def reference(cache_dir):
    """``HFBackend`` on its own copy of the weights, without a prefix cache: the numbers to match."""
    return HFBackend(load_policy("tiny", cache_dir=cache_dir), prefix_cache=False)


@pytest.fixture(scope="module")
def prompts(policy):
    tok = policy.tokenizer
    return [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                    tokenize=True, return_dict=False) for q in QUESTIONS]


def _engine_policy(cache_dir):
    return load_policy("tiny", cache_dir=cache_dir)  # its own weights: updates must not leak into others


class Gate:
    """A ``step_hook`` that stops the engine thread after sampling step ``at`` until ``open()``."""

    def __init__(self, at: int) -> None:
        self.at, self.reached, self.released = at, threading.Event(), threading.Event()

    def __call__(self, step: int) -> None:
        if step == self.at:
            self.reached.set()
            assert self.released.wait(60), "the test never opened the gate"

    async def wait(self) -> None:
        assert await asyncio.to_thread(self.reached.wait, 60)

    def open(self) -> None:
        self.released.set()


def run(coro):
    return asyncio.run(coro)


async def _with(engine: HFEngine, coro):
    try:
        return await coro
    finally:
        await engine.close()


async def _gather(*coros):
    return await asyncio.gather(*coros)


def _alone(reference, prompt, sampling):
    return reference.generate([prompt], sampling)[0]


def test_the_engine_class_implements_the_contract(policy):
    assert check_engine_class(HFEngine) is HFEngine
    engine = make_hf_engine(policy, seed=3, max_batch=4)
    assert isinstance(engine, HFEngine) and engine.policy_version == 0
    run(engine.close())


def test_greedy_equals_hfbackend_alone_while_batched(policy, reference, prompts):
    engine = HFEngine(policy)
    gens = run(_with(engine, _gather(*[engine.generate(p, GREEDY) for p in prompts])))
    alone = [_alone(reference, p, GREEDY) for p in prompts]
    assert [g.token_ids for g in gens] == [a.token_ids for a in alone]
    assert len({g.token_ids for g in gens}) >= 3  # outputs depend on the prompt: the test can fail
    for g, a in zip(gens, alone):
        assert max(abs(x - y) for x, y in zip(g.logprobs, a.logprobs)) < 1e-4
        assert g.versions == (0,) * len(g.token_ids) and g.finish_reason == a.finish_reason


def test_seeded_sample_is_the_same_alone_and_beside_five_others(policy, reference, prompts):
    gate = Gate(at=-1)  # armed below
    engine = HFEngine(policy, step_hook=gate)

    async def both():
        alone = await engine.generate(prompts[0], SAMPLED)
        gate.at = (await engine.stats()).steps + 1
        blocker = asyncio.create_task(engine.generate(prompts[5], GREEDY))
        await gate.wait()  # the engine is held: the six below are all waiting when it goes on
        others = [engine.generate(p, SamplingParams(temperature=t, max_new_tokens=12, seed=s))
                  for p, t, s in zip(prompts[1:], (1.0, 0.7, 0.0, 1.3, 1.0), (1, 2, 3, 4, 5))]
        together = asyncio.gather(engine.generate(prompts[0], SAMPLED), *others)
        await asyncio.sleep(0)
        gate.open()
        together = await together
        await blocker
        reseeded = await engine.generate(prompts[0], SamplingParams(temperature=0.7, top_p=0.9,
                                                                    max_new_tokens=16, seed=12))
        return alone, together, reseeded

    alone, together, reseeded = run(_with(engine, both()))
    assert together[0].token_ids == alone.token_ids
    assert {g.meta["admitted_step"] for g in together} == {gate.at}  # the six joined one running batch
    assert alone.token_ids == _alone(reference, prompts[0], SAMPLED).token_ids  # as HFBackend seeds it
    assert reseeded.token_ids != alone.token_ids


def _on_nucleus_edge(backend, prompt, completion, temperature, top_p, eps=1e-6):
    """Positions of ``completion`` where some token's mass-before sits within ``eps`` of ``top_p``: two
    computations of the same logits that differ by float error may keep or drop that token, and
    the log-probs then differ by its mass (seen: 3.6e-4)."""
    ids = torch.tensor([list(prompt) + list(completion)])
    with torch.inference_mode():
        logits = backend.model(input_ids=ids).logits[0, len(prompt) - 1:-1].float() / temperature
    probs = torch.sort(torch.softmax(logits, -1), descending=True).values
    before = torch.cumsum(probs, -1) - probs
    return {i for i in range(len(completion)) if bool(((before[i] - top_p).abs() < eps).any())}


def test_sampled_logprobs_equal_score(policy, reference, prompts):
    engine = HFEngine(policy)
    gens = run(_with(engine, _gather(*[engine.generate(p, SAMPLED) for p in prompts])))
    scored = reference.score([(p, g.token_ids) for p, g in zip(prompts, gens)], temperature=0.7, top_p=0.9)
    excused = 0
    for p, g, s in zip(prompts, gens, scored):
        assert len(s) == len(g.logprobs) > 0
        edge = _on_nucleus_edge(reference, p, g.token_ids, 0.7, 0.9)
        excused += len(edge)
        assert max(abs(x - y) for i, (x, y) in enumerate(zip(g.logprobs, s)) if i not in edge) < 1e-4
    assert excused <= 3  # the exception stays an exception
    plain = SamplingParams(temperature=0.7, max_new_tokens=16, seed=11)  # no nucleus: no edge at all
    engine = HFEngine(policy)
    gens = run(_with(engine, _gather(*[engine.generate(p, plain) for p in prompts])))
    scored = reference.score([(p, g.token_ids) for p, g in zip(prompts, gens)], temperature=0.7)
    for g, s in zip(gens, scored):
        assert max(abs(x - y) for x, y in zip(g.logprobs, s)) < 1e-4


def test_a_short_request_submitted_after_a_long_one_started_finishes_first(policy, reference, prompts):
    long_params = SamplingParams(temperature=0, max_new_tokens=40)
    short_params = SamplingParams(temperature=0, max_new_tokens=4)
    expected_long = _alone(reference, prompts[2], long_params)
    assert len(expected_long.token_ids) >= 10  # still decoding when the short one ends
    gate = Gate(at=2)
    engine = HFEngine(policy, step_hook=gate)

    async def scenario():
        long_task = asyncio.create_task(engine.generate(prompts[2], long_params))
        await gate.wait()  # the long request has sampled 2 tokens and the engine is held
        short_task = asyncio.create_task(engine.generate(prompts[1], short_params))
        await asyncio.sleep(0)  # let it submit
        gate.open()
        return await long_task, await short_task

    long_gen, short_gen = run(_with(engine, scenario()))  # which ended first: by the step counters
    assert long_gen.meta["admitted_step"] == 0 and short_gen.meta["admitted_step"] == 2
    assert short_gen.meta["finished_step"] == 6 < long_gen.meta["finished_step"]
    # joining a running batch (left-padded to its width) changes neither request's tokens
    assert long_gen.token_ids == expected_long.token_ids
    assert short_gen.token_ids == _alone(reference, prompts[1], short_params).token_ids


def test_stream_yields_each_token_as_sampled_and_equals_generate(policy, prompts):
    params = SamplingParams(temperature=0.9, max_new_tokens=20, seed=5)
    gate = Gate(at=1)
    engine = HFEngine(policy, step_hook=gate)

    async def scenario():
        deltas = []
        async for delta in engine.stream(prompts[3], params):
            if not deltas:
                assert not gate.released.is_set()  # the first token came while the engine was held at step 1
                gate.open()
            deltas.append(delta)
        return deltas, await engine.generate(prompts[3], params)

    deltas, gen = run(_with(engine, scenario()))
    final = deltas[-1].final
    assert final is not None and all(d.final is None for d in deltas[:-1])
    assert tuple(d.token_id for d in deltas[:-1]) == final.token_ids == gen.token_ids
    assert tuple(d.logprob for d in deltas[:-1]) == final.logprobs
    assert tuple(d.version for d in deltas[:-1]) == final.versions
    assert final.text == gen.text and final.finish_reason == gen.finish_reason


def test_abort_ends_the_request_frees_its_row_and_spares_the_others(policy, reference, prompts):
    params = SamplingParams(temperature=0, max_new_tokens=40)
    gate = Gate(at=2)
    engine = HFEngine(policy, step_hook=gate)

    async def scenario():
        doomed = asyncio.create_task(engine.generate(prompts[2], params, request_id="doomed"))
        other = asyncio.create_task(engine.generate(prompts[0], GREEDY))
        await gate.wait()
        abort = asyncio.create_task(engine.abort("doomed"))
        await asyncio.sleep(0)
        gate.open()
        await abort
        after = await engine.stats()
        await engine.abort("doomed")  # finished/unknown ids are a no-op
        await engine.abort("never-seen")
        return await doomed, await other, after, await engine.stats()

    doomed, other, during, after = run(_with(engine, scenario()))
    assert doomed.finish_reason == "abort" and len(doomed.token_ids) == 2
    assert doomed.token_ids == _alone(reference, prompts[2], params).token_ids[:2]
    assert other.token_ids == _alone(reference, prompts[0], GREEDY).token_ids
    assert during.running <= 1  # only the other request may still run
    assert after.running == after.waiting == after.kv_positions == 0


def test_cancelling_generate_and_closing_a_stream_free_the_row(policy, prompts):
    params = SamplingParams(temperature=0, max_new_tokens=200)
    gate = Gate(at=2)
    engine = HFEngine(policy, step_hook=gate)

    async def scenario():
        task = asyncio.create_task(engine.generate(prompts[2], params))
        await gate.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        gate.open()
        after_cancel = await engine.stats()
        agen = engine.stream(prompts[1], params)
        first = await agen.__anext__()
        await agen.aclose()
        return first, after_cancel, await engine.stats()

    first, after_cancel, after_close = run(_with(engine, scenario()))
    assert first.token_id is not None
    for stats in (after_cancel, after_close):
        assert stats.running == stats.waiting == stats.kv_positions == 0
    assert after_close.steps < 150  # the aborted requests did not run to their 200 tokens


# ---------------------------------------------------------------------- weight updates
@pytest.fixture(scope="module")
def new_weights(cache_dir):
    """A perturbed copy of the tiny model's weights and an ``HFBackend`` that runs them."""
    fresh = load_policy("tiny", cache_dir=cache_dir)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in fresh.model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.2 * p.std())
    return dict(fresh.model.state_dict()), HFBackend(fresh, prefix_cache=False)


async def _update_mid_request(engine, gate, weights, policy, prompt, params, later_prompt=None):
    """Start ``prompt``, and while the engine is held at the gate queue the update (then
    ``later_prompt``, if any); open the gate; ``(first, version, later)``."""
    first = asyncio.create_task(engine.generate(prompt, params))
    await gate.wait()
    update = asyncio.create_task(engine.update_weights(weights, policy=policy))
    await asyncio.sleep(0)
    later = None
    if later_prompt is not None:
        later = asyncio.create_task(engine.generate(later_prompt, params))
        await asyncio.sleep(0)
    gate.open()
    return await first, await update, (await later if later is not None else None)


def test_drain_finishes_in_flight_on_old_weights_then_admits_on_new(cache_dir, reference, new_weights, prompts):
    weights, new_reference = new_weights
    params = SamplingParams(temperature=0, max_new_tokens=12)
    gate = Gate(at=2)
    engine = HFEngine(_engine_policy(cache_dir), step_hook=gate)
    first, version, later = run(_with(engine, _update_mid_request(
        engine, gate, weights, UpdatePolicy.DRAIN, prompts[2], params, later_prompt=prompts[1])))
    assert version == 1
    assert first.versions == (0,) * len(first.token_ids)
    assert first.token_ids == _alone(reference, prompts[2], params).token_ids
    assert later.versions == (1,) * len(later.token_ids)
    assert later.meta["admitted_step"] >= first.meta["finished_step"]
    expected = _alone(new_reference, prompts[1], params)
    assert later.token_ids == expected.token_ids != _alone(reference, prompts[1], params).token_ids


def test_abort_update_regenerates_in_flight_requests_on_the_new_weights(cache_dir, new_weights, prompts):
    weights, new_reference = new_weights
    params = SamplingParams(temperature=0, max_new_tokens=12)
    gate = Gate(at=2)
    engine = HFEngine(_engine_policy(cache_dir), step_hook=gate)
    gen, version, _ = run(_with(engine, _update_mid_request(
        engine, gate, weights, UpdatePolicy.ABORT, prompts[2], params)))
    assert version == 1 and gen.meta["restarts"] == 1
    assert gen.versions == (1,) * len(gen.token_ids)
    assert gen.token_ids == _alone(new_reference, prompts[2], params).token_ids


def test_continue_update_loads_between_steps_and_versions_record_it(cache_dir, reference, new_weights, prompts):
    weights, _ = new_weights
    params = SamplingParams(temperature=0, max_new_tokens=12)
    expected_old = _alone(reference, prompts[2], params)
    assert expected_old.finish_reason == "length"
    gate = Gate(at=3)
    engine = HFEngine(_engine_policy(cache_dir), step_hook=gate)

    async def scenario():
        gen, version, _ = await _update_mid_request(engine, gate, weights, UpdatePolicy.CONTINUE, prompts[2], params)
        return gen, version, await engine.stats()

    gen, version, stats = run(_with(engine, scenario()))
    assert version == stats.version == 1
    # step 3's forward ran before the update was applied, so token 4 (index 3) is still old-weights
    assert gen.versions == (0,) * 4 + (1,) * (len(gen.token_ids) - 4)
    assert gen.token_ids[:4] == expected_old.token_ids[:4]
    assert stats.cached_prefix_tokens == 0  # its KV mixes versions: not stored after the clear


def test_an_update_clears_the_prefix_cache(cache_dir, new_weights, prompts):
    weights, new_reference = new_weights
    engine = HFEngine(_engine_policy(cache_dir))

    async def scenario():
        await engine.generate(prompts[0], GREEDY)
        before = await engine.stats()
        await engine.update_weights(weights, policy=UpdatePolicy.CONTINUE)  # nothing runs: loads at once
        after = await engine.stats()
        return before, after, await engine.generate(prompts[0], GREEDY)

    before, after, gen = run(_with(engine, scenario()))
    assert before.cached_prefix_tokens > 0 and after.cached_prefix_tokens == 0
    assert gen.versions[0] == 1 and gen.token_ids == _alone(new_reference, prompts[0], GREEDY).token_ids


def test_mismatched_weights_are_refused_before_anything_loads(cache_dir, new_weights):
    weights, _ = new_weights
    pol = _engine_policy(cache_dir)
    engine = HFEngine(pol)
    name = "model.layers.0.self_attn.q_proj.weight"
    before = {k: v.clone() for k, v in pol.model.state_dict().items()}
    bad = {
        "unknown": {**weights, "model.not_a_layer.weight": weights[name]},
        "missing": {k: v for k, v in weights.items() if k != name},
        "wrong shapes": {**weights, name: weights[name][..., :1]},
        "not tensors": {**weights, name: [1.0]},
    }

    async def scenario():
        for what, w in bad.items():
            with pytest.raises(ValueError, match=what):
                await engine.update_weights(w, policy=UpdatePolicy.CONTINUE)
        with pytest.raises(ValueError):
            await engine.update_weights([("x", 1)])
        with pytest.raises(ValueError):
            await engine.update_weights(weights, policy="sideways")
        return await engine.stats()

    stats = run(_with(engine, scenario()))
    assert stats.version == 0 and engine.policy_version == 0
    assert all(torch.equal(before[k], v) for k, v in pol.model.state_dict().items())


# ---------------------------------------------------------------------- bad input and failures
def test_bad_requests_raise_value_error_only_there(policy, reference, prompts):
    engine = HFEngine(policy)
    limit = policy.model.config.max_position_embeddings

    async def scenario():
        good = asyncio.create_task(engine.generate(prompts[0], GREEDY, request_id="dup"))
        await asyncio.sleep(0)
        with pytest.raises(ValueError, match="already in flight"):
            await engine.generate(prompts[1], GREEDY, request_id="dup")
        with pytest.raises(ValueError, match="outside the vocabulary"):
            await engine.generate([1, 10**7], GREEDY)
        with pytest.raises(ValueError, match="is empty"):
            await engine.generate([], GREEDY)
        with pytest.raises(ValueError, match="non-integer"):
            await engine.generate([1, "x"], GREEDY)
        with pytest.raises(ValueError, match="exceeds the model's"):
            await engine.generate(prompts[0], SamplingParams(max_new_tokens=limit))
        with pytest.raises(ValueError, match="n == 1"):
            await engine.generate(prompts[0], SamplingParams(n=2))
        with pytest.raises(ValueError, match="outside the vocabulary"):
            async for _ in engine.stream([10**7], GREEDY):
                pass
        return await good, await engine.stats()

    good, stats = run(_with(engine, scenario()))
    assert good.token_ids == _alone(reference, prompts[0], GREEDY).token_ids
    assert stats.running == stats.waiting == stats.kv_positions == 0


def _faulty_engine(cache_dir, fails, message):
    """An engine on its own policy whose model raises ``RuntimeError(message)`` on a forward whose
    ``input_ids`` satisfy ``fails``, held at step 2 by its gate; ``(engine, gate, hook handle)``."""
    pol = _engine_policy(cache_dir)

    def refuse(module, args, kwargs):
        if fails(kwargs["input_ids"]):
            raise RuntimeError(message)

    handle = pol.model.register_forward_pre_hook(refuse, with_kwargs=True)
    gate = Gate(at=2)
    return HFEngine(pol, step_hook=gate), gate, handle


def test_a_failing_prefill_fails_only_its_request(cache_dir, reference, prompts):
    marker = next(t for t in range(100, 1000) if all(t not in p for p in prompts))  # in no other prompt
    poisoned = prompts[3] + [marker]
    engine, gate, handle = _faulty_engine(cache_dir, lambda ids: ids.shape[1] > 1 and bool((ids == marker).any()),
                                          "injected prefill failure")

    async def scenario():
        running = asyncio.create_task(engine.generate(prompts[2], GREEDY))
        await gate.wait()
        bad = asyncio.create_task(engine.generate(poisoned, GREEDY))
        fine = asyncio.create_task(engine.generate(prompts[1], GREEDY))
        await asyncio.sleep(0)
        gate.open()
        with pytest.raises(EngineError, match="injected prefill failure"):
            await bad
        return await running, await fine, await engine.stats()

    try:
        running, fine, stats = run(_with(engine, scenario()))
    finally:
        handle.remove()
    assert running.token_ids == _alone(reference, prompts[2], GREEDY).token_ids
    assert fine.token_ids == _alone(reference, prompts[1], GREEDY).token_ids
    assert fine.meta["admitted_step"] == 2  # admitted with the poisoned one, retried alone
    assert stats.running == stats.kv_positions == 0


def test_a_failing_decode_step_ends_its_batch_and_the_engine_goes_on(cache_dir, reference, prompts):
    fail = threading.Event()

    def once(ids):
        if fail.is_set() and ids.shape[1] == 1:
            fail.clear()
            return True
        return False

    engine, gate, handle = _faulty_engine(cache_dir, once, "injected decode failure")

    async def scenario():
        task = asyncio.create_task(engine.generate(prompts[2], GREEDY))
        await gate.wait()
        fail.set()
        gate.open()
        with pytest.raises(EngineError, match="injected decode failure"):
            await task
        return await engine.generate(prompts[0], GREEDY), await engine.stats()

    try:
        after, stats = run(_with(engine, scenario()))
    finally:
        handle.remove()
    assert after.token_ids == _alone(reference, prompts[0], GREEDY).token_ids
    assert stats.running == stats.kv_positions == 0


def test_a_closed_engine_refuses_and_ends_what_it_held(policy, prompts):
    gate = Gate(at=1)
    engine = HFEngine(policy, step_hook=gate)

    async def scenario():
        task = asyncio.create_task(engine.generate(prompts[0], SamplingParams(temperature=0, max_new_tokens=50)))
        await gate.wait()
        closing = asyncio.create_task(engine.close())
        await asyncio.sleep(0)
        gate.open()
        await closing
        with pytest.raises(EngineError, match="closed"):
            await task
        with pytest.raises(EngineError, match="closed"):
            await engine.generate(prompts[0], GREEDY)

    run(scenario())


def test_abort_update_ends_a_stream_that_already_delivered_tokens(cache_dir, new_weights, prompts):
    weights, _ = new_weights
    params = SamplingParams(temperature=0, max_new_tokens=12)
    admit, update_at = Gate(at=1), Gate(at=3)  # hold while the two requests are queued, then after 2 tokens
    engine = HFEngine(_engine_policy(cache_dir), step_hook=lambda step: (admit(step), update_at(step)))

    async def scenario():
        deltas = []

        async def consume():
            async for delta in engine.stream(prompts[2], params):
                deltas.append(delta)

        blocker = asyncio.create_task(engine.generate(prompts[5], SamplingParams(temperature=0, max_new_tokens=40)))
        await admit.wait()
        streaming = asyncio.create_task(consume())
        quiet = asyncio.create_task(engine.generate(prompts[1], params))
        await asyncio.sleep(0)
        admit.open()  # both join at step 1 and have sampled 2 tokens at step 3
        await update_at.wait()
        update = asyncio.create_task(engine.update_weights(weights, policy=UpdatePolicy.ABORT))
        await asyncio.sleep(0)
        update_at.open()
        await streaming
        return deltas, await quiet, await update, await blocker

    deltas, quiet, version, blocker = run(_with(engine, scenario()))
    final = deltas[-1].final
    assert version == 1 and final.finish_reason == "abort" and final.versions == (0, 0)
    assert [d.token_id for d in deltas[:-1]] == list(final.token_ids)
    for regenerated in (quiet, blocker):
        assert regenerated.meta["restarts"] == 1 and set(regenerated.versions) == {1}


def test_stack_rows_left_pads_and_trim_left_drops_dead_columns():
    from sqlrl.policy.hf_kv import growing_cache, stack_rows, trim_left

    def part(rows, width, fill):
        cache = growing_cache(2, width)
        for layer in range(2):
            k = torch.full((rows, 1, width, 2), float(fill + layer))
            cache.update(k, -k, layer)
        return cache, torch.ones((rows, width), dtype=torch.long)

    cache, mask = stack_rows([part(1, 3, 10), part(2, 5, 20)], capacity=8)
    assert mask.tolist() == [[0, 0, 1, 1, 1], [1] * 5, [1] * 5]
    keys = cache.layers[1].keys
    assert keys.shape == (3, 1, 5, 2) and cache.layers[1]._kbuf.shape[2] == 8
    assert keys[0, 0, :2].abs().sum() == 0 and bool((keys[0, 0, 2:] == 11).all()) and bool((keys[1:] == 21).all())
    assert bool((cache.layers[0].values[1:] == -20).all())
    index = torch.tensor([0])
    cache.batch_select_indices(index)
    mask = trim_left(cache, mask[index])
    assert mask.tolist() == [[1, 1, 1]] and cache.layers[0].keys.shape == (1, 1, 3, 2)
    assert bool((cache.layers[0].keys == 10).all())
    cache.update(torch.zeros((1, 1, 1, 2)), torch.zeros((1, 1, 1, 2)), 0)  # appending still works after a trim
    assert cache.layers[0].keys.shape[2] == 4 and bool((cache.layers[0].keys[0, 0, :3] == 10).all())


def test_max_batch_bounds_the_running_rows_and_the_rest_wait_their_turn(policy, reference, prompts):
    with pytest.raises(ValueError, match="max_batch"):
        HFEngine(policy, max_batch=0)
    engine = HFEngine(policy, max_batch=2)
    gens = run(_with(engine, _gather(*[engine.generate(p, GREEDY) for p in prompts])))
    assert [g.token_ids for g in gens] == [_alone(reference, p, GREEDY).token_ids for p in prompts]
    admitted = sorted(g.meta["admitted_step"] for g in gens)
    assert admitted[2] > 0  # the third request could only start once a row was free
    for g in gens:  # never more than two rows at once
        assert sum(o.meta["admitted_step"] <= g.meta["admitted_step"] < o.meta["finished_step"]
                   for o in gens if o is not g) <= 1
