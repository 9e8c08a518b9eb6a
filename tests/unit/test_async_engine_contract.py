"""The ``AsyncEngine`` contract (``sqlrl.policy.engine``), checked on every registered engine that runs
here cheaply: ``scripted`` (``ScriptedEngine``) and ``hf`` (today the ``BatchedEngine`` adapter over
``HFBackend`` on the tiny model built from config). Requests are held in flight by gates (events),
never by waiting for time. Plus the registry's checks and the scripted engine's update policies."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from typing import Any, Callable

import pytest

from sqlrl.policy.backends import ENGINES, make_engine, register_engine
from sqlrl.policy.engine import EngineError, UpdatePolicy
from sqlrl.policy.scripted import Latch
from sqlrl.policy.types import SamplingParams

pytest.importorskip("transformers")

SCRIPT = [{"match": "Q-fail", "turns": [{"error": "the device fell over", "after_tokens": 2}]},
          {"match": "Q-", "turns": ["SELECT name FROM customers ORDER BY name LIMIT 3;"]}]
SAMPLING = SamplingParams(temperature=1.0, max_new_tokens=12, seed=5)


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    from sqlrl.policy.load import load_policy

    return load_policy("tiny", cache_dir=tmp_path_factory.getbasetemp() / "policy-cache")


def prompt(policy: Any, question: str) -> list[int]:
    return policy.tokenizer.encode(f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n",
                                   add_special_tokens=False)


class HeldBackend:
    """A sync backend whose calls wait for ``open`` while armed (holds an adapter's call in flight)."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.armed = inner, False
        self.reached, self.opened = Latch(), Latch()

    def generate(self, prompts, params):
        if self.armed:
            self.reached.set()
            self.opened.wait_sync(120)
        return self.inner.generate(prompts, params)


@dataclass
class Case:
    engine: Any
    hold: Callable[[], Any]  # arms a hold on the next request; returns (reached Latch, open())
    bad_prompt: list[int]  # a request that fails inside the engine
    weights: Callable[[], dict[str, Any]]  # a full, fitting set of weights


def scripted_case(policy: Any) -> Case:
    engine = make_engine("scripted", policy, script=SCRIPT)
    import numpy as np

    def hold():
        gate = engine.hold("Q-held", after_tokens=2)
        return gate.reached, gate.open

    return Case(engine, hold, prompt(policy, "Q-fail"), lambda: {"scripted.weight": np.zeros(1)})


def hf_case(policy: Any) -> Case:
    engine = make_engine("hf-batched", policy)
    held = engine.backend = HeldBackend(engine.backend)

    def hold():
        held.armed, held.reached, held.opened = True, Latch(), Latch()

        def release():
            held.armed = False
            held.opened.set()
        return held.reached, release

    bad = prompt(policy, "Q-fail") + [len(policy.tokenizer) + 10]  # outside the vocabulary
    return Case(engine, hold, bad, lambda: {k: v.clone() for k, v in policy.model.state_dict().items()})


CASES = {"scripted": scripted_case, "hf-batched": hf_case}


@pytest.fixture(params=sorted(CASES))
def case(request, policy):
    c = CASES[request.param](policy)
    yield c
    asyncio.run(c.engine.close())


# registered engines whose contract runs elsewhere, and where
ELSEWHERE = {
    "hf": "tests/unit/test_hf_engine.py (the same contract, held by its scheduler's step hook)",
    "vllm": "tests/integration/test_vllm_engine.py (not on this machine's tiny model)",
    "vllm-batched": "tests/integration/test_vllm_engine.py (not on this machine's tiny model)",
    "auto": "one of hf / vllm (resolve_engine)",
}


def coverage_problems(engines) -> list[str]:
    """Registered engines with neither a case here nor a reason (``ELSEWHERE``), and cases or
    reasons for engines that are not registered."""
    covered = set(CASES) | set(ELSEWHERE)
    return ([f"engine {n!r} is registered but the contract does not run on it: add a Case to "
             f"tests/unit/test_async_engine_contract.py::CASES (or where it runs to ELSEWHERE)"
             for n in engines if n not in covered]
            + [f"{n!r} has a case or reason here but is not a registered engine" for n in sorted(covered - set(engines))])


def test_every_registered_engine_has_a_case_or_a_reason():
    problems = coverage_problems(ENGINES)
    assert not problems, "; ".join(problems)


def test_an_engine_with_no_case_is_named():
    assert coverage_problems([*ENGINES, "echo"]) == [
        "engine 'echo' is registered but the contract does not run on it: add a Case to "
        "tests/unit/test_async_engine_contract.py::CASES (or where it runs to ELSEWHERE)"]


def test_one_sequence_with_a_version_per_token(case, policy):
    async def main():
        gen = await case.engine.generate(prompt(policy, "Q-one"), SAMPLING, request_id="one")
        with pytest.raises(ValueError, match="one sequence"):
            await case.engine.generate(prompt(policy, "Q-one"), SamplingParams(n=2))
        return gen

    gen = asyncio.run(main())
    assert 0 < len(gen.token_ids) <= SAMPLING.max_new_tokens
    assert len(gen.logprobs) == len(gen.versions) == len(gen.token_ids)
    assert set(gen.versions) == {case.engine.policy_version} and gen.finish_reason in ("eos", "length")
    assert case.engine.in_flight == 0


def test_stream_equals_generate(case, policy):
    async def main():
        gen = await case.engine.generate(prompt(policy, "Q-stream"), SAMPLING)
        deltas = [d async for d in case.engine.stream(prompt(policy, "Q-stream"), SAMPLING)]
        return gen, deltas

    gen, deltas = asyncio.run(main())
    final = deltas[-1].final
    assert all(d.final is None for d in deltas[:-1])
    # the same request twice: the same sample (log-probs to float noise: HF's second call reads
    # the first one's cached prefix)
    assert (final.token_ids, final.text, final.finish_reason, final.versions) == (
        gen.token_ids, gen.text, gen.finish_reason, gen.versions)
    assert final.logprobs == pytest.approx(gen.logprobs, abs=1e-4)
    assert [d.token_id for d in deltas[:-1]] == list(final.token_ids)
    assert [d.version for d in deltas[:-1]] == list(final.versions)
    assert [d.logprob for d in deltas[:-1]] == list(final.logprobs)


def test_abort_returns_abort_and_frees_the_request(case, policy):
    async def main():
        reached, release = case.hold()
        held = asyncio.ensure_future(case.engine.generate(prompt(policy, "Q-held"), SAMPLING, request_id="held"))
        await reached.wait()
        await case.engine.abort("held")
        await case.engine.abort("no-such-request")  # a no-op
        release()
        gen = await held
        after = await case.engine.generate(prompt(policy, "Q-after"), SAMPLING)
        return gen, after

    gen, after = asyncio.run(main())
    assert gen.finish_reason == "abort" and after.finish_reason != "abort"
    assert case.engine.in_flight == 0


def test_cancelling_the_caller_aborts_the_request(case, policy):
    async def main():
        reached, release = case.hold()
        held = asyncio.ensure_future(case.engine.generate(prompt(policy, "Q-held"), SAMPLING, request_id="c"))
        await reached.wait()
        held.cancel()
        with pytest.raises(asyncio.CancelledError):
            await held
        release()
        await case.engine.generate(prompt(policy, "Q-after"), SAMPLING)  # queued behind whatever ran

    asyncio.run(main())
    assert case.engine.in_flight == 0


def test_dropping_a_stream_mid_request_aborts_it(case, policy):
    async def main():
        reached, release = case.hold()
        got = []

        async def client():
            async for delta in case.engine.stream(prompt(policy, "Q-held"), SAMPLING, request_id="s"):
                got.append(delta)

        consumer = asyncio.ensure_future(client())
        await reached.wait()
        consumer.cancel()  # the client went away
        await asyncio.gather(consumer, return_exceptions=True)
        release()
        await case.engine.generate(prompt(policy, "Q-after"), SAMPLING)
        return got

    got = asyncio.run(main())
    assert all(d.final is None for d in got)
    assert case.engine.in_flight == 0


def test_scripted_aclose_after_the_first_token_aborts(policy):
    engine = make_engine("scripted", policy, script=SCRIPT)

    async def main():
        stream = engine.stream(prompt(policy, "Q-one"), SAMPLING, request_id="early")
        first = await stream.__anext__()
        assert engine.in_flight == 1
        await stream.aclose()
        return first

    first = asyncio.run(main())
    assert first.token_id is not None and engine.in_flight == 0
    assert engine.log == [("start", "early"), ("abort", "early")]


def test_weights_that_do_not_fit_are_refused_before_loading(case, policy):
    good = case.weights()
    name = sorted(good)[0]
    missing = {k: v for k, v in good.items() if k != name}
    unknown = {**good, "extra.weight": good[name]}
    wrong = {**good, name: good[name].reshape(-1)[:1].reshape(1, 1, 1)}

    async def main():
        for bad, message in ((missing, "missing"), (unknown, "unknown"), (wrong, "wrong shape")):
            with pytest.raises(ValueError, match=message):
                await case.engine.update_weights(bad)
        assert case.engine.policy_version == 0
        version = await case.engine.update_weights(good)
        return version, await case.engine.generate(prompt(policy, "Q-new"), SAMPLING)

    version, gen = asyncio.run(main())
    assert version == case.engine.policy_version == 1 and set(gen.versions) == {1}


def test_a_failing_request_fails_alone(case, policy):
    async def main():
        good = case.engine.generate(prompt(policy, "Q-good"), SamplingParams(max_new_tokens=8, seed=1))
        bad = case.engine.generate(case.bad_prompt, SamplingParams(max_new_tokens=8, seed=2))
        return await asyncio.gather(good, bad, return_exceptions=True)

    good, bad = asyncio.run(main())
    assert isinstance(bad, EngineError) and str(bad)
    assert not isinstance(good, BaseException) and good.finish_reason != "abort"
    assert case.engine.in_flight == 0


def test_drain_and_abort_updates(case, policy):
    """drain: the request in flight finishes on the old weights, a request made during the update
    starts on the new; abort: the request in flight is redone on the new weights."""
    async def main():
        reached, release = case.hold()
        held = asyncio.ensure_future(case.engine.generate(prompt(policy, "Q-held"), SAMPLING))
        await reached.wait()
        update = asyncio.ensure_future(case.engine.update_weights(case.weights(), policy=UpdatePolicy.DRAIN))
        await asyncio.sleep(0)  # one event-loop step: the update's synchronous start (admission closed)
        later = asyncio.ensure_future(case.engine.generate(prompt(policy, "Q-later"), SAMPLING))
        release()
        drained = (await update, await held, await later)
        reached, release = case.hold()
        held = asyncio.ensure_future(case.engine.generate(prompt(policy, "Q-held"), SAMPLING))
        await reached.wait()
        update = asyncio.ensure_future(case.engine.update_weights(case.weights(), policy=UpdatePolicy.ABORT))
        await asyncio.sleep(0)  # the update's synchronous start: the request is marked for a redo
        release()
        return drained, (await update, await held)

    (v1, old, new), (v2, redone) = asyncio.run(main())
    assert v1 == 1 and set(old.versions) == {0} and set(new.versions) == {1}
    assert v2 == 2 and redone.finish_reason != "abort" and set(redone.versions) == {2}
    assert case.engine.in_flight == 0


def test_two_event_loops_share_one_engine(case, policy):
    """A Ray actor's loop and a sync wrapper's ``asyncio.run`` may await the same engine at once."""
    results: dict[str, Any] = {}
    reached, release = case.hold()

    def in_thread(name: str, question: str) -> None:
        results[name] = asyncio.run(case.engine.generate(prompt(policy, question), SAMPLING))

    first = threading.Thread(target=in_thread, args=("held", "Q-held"))
    first.start()
    assert reached.wait_sync(120)  # the first loop's request is in flight ...
    second = threading.Thread(target=in_thread, args=("other", "Q-other"))
    second.start()  # ... when another loop's arrives
    release()
    first.join(120)
    second.join(120)
    assert set(results) == {"held", "other"} and all(v.finish_reason != "abort" for v in results.values())
    assert case.engine.in_flight == 0


def test_a_closed_engine_refuses_requests(case, policy):
    async def main():
        await case.engine.close()
        with pytest.raises(EngineError, match="closed"):
            await case.engine.generate(prompt(policy, "Q-x"), SAMPLING)

    asyncio.run(main())


# -- the scripted engine's continue policy and script errors ---------------------------------------


def test_scripted_continue_update_changes_the_version_mid_sequence(policy):
    import numpy as np

    engine = make_engine("scripted", policy, script=SCRIPT)

    async def main():
        gate = engine.hold("Q-held", after_tokens=3)
        held = asyncio.ensure_future(engine.generate(prompt(policy, "Q-held"), SAMPLING))
        await gate.reached.wait()
        version = await engine.update_weights({"scripted.weight": np.ones(1)}, policy=UpdatePolicy.CONTINUE)
        gate.open()
        return version, await held

    version, gen = asyncio.run(main())
    assert version == 1 and gen.versions[:3] == (0, 0, 0) and set(gen.versions[3:]) == {1}


# -- the registry ------------------------------------------------------------------------------


class NotAnEngine:
    def generate(self, prompts, params):  # a sync batch backend's shape
        return []


def test_registration_refuses_a_class_that_is_not_an_engine():
    with pytest.raises(TypeError, match=r"does not implement AsyncEngine.*abort \(missing\).*stream \(missing\)"):
        register_engine("not-an-engine", lambda policy, seed=None: NotAnEngine(), NotAnEngine)
    assert "not-an-engine" not in ENGINES


def test_a_lazily_named_class_is_checked_before_its_first_build():
    built = threading.Event()

    def build(policy, seed=None):
        built.set()
        return NotAnEngine()

    register_engine("lazy-bad", build, "tests.unit.test_async_engine_contract:NotAnEngine")
    try:
        with pytest.raises(TypeError, match="does not implement AsyncEngine"):
            make_engine("lazy-bad", None)
        assert not built.is_set()
    finally:
        ENGINES.pop("lazy-bad")


def test_unknown_engine_names_the_known_ones():
    with pytest.raises(ValueError, match="unknown engine 'nope'; known: scripted, hf, vllm, auto"):
        make_engine("nope", None)


# -- the adapter's batching --------------------------------------------------------------------


class Recorder:
    """A sync batch backend that records its calls' (prompt count, seed); with ``held`` set, its
    calls wait for ``opened``."""

    def __init__(self, per_request_seeds: bool = True) -> None:
        self.per_request_seeds = per_request_seeds
        self.calls: list[tuple[int, int | None]] = []
        self.held, self.reached, self.opened = False, Latch(), Latch()

    def generate(self, prompts, params):
        if self.held:
            self.reached.set()
            self.opened.wait_sync(120)
        self.calls.append((len(prompts), params.seed))
        from sqlrl.policy.types import Generation
        return [Generation((7, 8), (-0.1, -0.2), "ab", "length") for _ in prompts]


def test_the_adapter_merges_a_steps_requests_and_keeps_seeds_apart():
    from sqlrl.policy.batched import as_engine

    async def main(backend):
        engine, owned = as_engine(backend)
        assert owned
        same = [engine.generate([1, 2], SamplingParams(seed=1)) for _ in range(2)]
        other = engine.generate([3], SamplingParams(seed=2))
        gens = await asyncio.gather(*same, other)
        await engine.close()
        return gens

    exact, merging = Recorder(), Recorder(per_request_seeds=False)
    gens = asyncio.run(main(exact))
    assert exact.calls == [(2, 1), (1, 2)]  # one call per seed; same-step requests of one seed share it
    assert all(g.versions == (0, 0) and g.token_ids == (7, 8) for g in gens)
    asyncio.run(main(merging))
    assert merging.calls == [(3, 1)]  # a backend that ignores seeds: one call


class ThreadBound(Recorder):
    """A backend that must be called from the thread that made it (as an in-process vLLM engine on
    CPU): it records the thread of every call."""

    thread_bound = True

    def __init__(self) -> None:
        super().__init__()
        self.threads: list[int] = []

    def generate(self, prompts, params):
        self.threads.append(threading.get_ident())
        return super().generate(prompts, params)


def test_a_thread_bound_backend_is_called_on_the_loops_thread():
    from sqlrl.policy.batched import as_engine

    async def main(backend):
        engine, _ = as_engine(backend)
        assert engine.inline
        gens = await asyncio.gather(*(engine.generate([i], SamplingParams(seed=i)) for i in range(3)))
        await engine.close()
        return gens

    backend = ThreadBound()
    gens = asyncio.run(main(backend))  # the loop runs on this thread
    assert [g.token_ids for g in gens] == [(7, 8)] * 3 and len(backend.calls) == 3
    assert set(backend.threads) == {threading.get_ident()}
    assert not as_engine(Recorder())[0].inline


def test_the_adapter_aborts_a_queued_request_at_once_and_a_running_one_after_its_call():
    from sqlrl.policy.batched import BatchedEngine

    backend = Recorder()
    backend.held = True
    engine = BatchedEngine(backend)

    async def main():
        running = asyncio.ensure_future(engine.generate([1], SAMPLING, request_id="running"))
        await backend.reached.wait()
        queued = asyncio.ensure_future(engine.generate([2], SAMPLING, request_id="queued"))
        await asyncio.sleep(0)  # one event-loop step: the request is queued behind the running call
        await engine.abort("queued")
        gone = await queued  # answered without the backend: its call never starts
        await engine.abort("running")
        backend.opened.set()
        return gone, await running

    gone, stopped = asyncio.run(main())
    assert gone.finish_reason == "abort" and gone.token_ids == ()
    assert stopped.finish_reason == "abort" and stopped.token_ids == (7, 8)
    assert backend.calls == [(1, SAMPLING.seed)] and engine.in_flight == 0
    asyncio.run(engine.close())


def test_as_engine_refuses_what_cannot_generate():
    from sqlrl.policy.batched import as_engine

    with pytest.raises(TypeError, match="neither an AsyncEngine nor a GenerationBackend"):
        as_engine(object())


def test_closing_the_adapter_closes_its_backend_after_the_running_call():
    from sqlrl.policy.batched import BatchedEngine

    backend = Recorder()
    backend.held = True
    engine = BatchedEngine(backend, close_backend=lambda: backend.calls.append("closed"))

    async def main():
        running = asyncio.ensure_future(engine.generate([1], SAMPLING))
        await backend.reached.wait()
        closing = asyncio.ensure_future(engine.close())
        await asyncio.sleep(0)  # one event-loop step: close has refused new work and waits for the call
        with pytest.raises(EngineError, match="closed"):
            await engine.generate([2], SAMPLING)
        backend.opened.set()
        await closing
        return await running

    gen = asyncio.run(main())
    assert gen.token_ids == (7, 8) and backend.calls == [(1, SAMPLING.seed), "closed"]
