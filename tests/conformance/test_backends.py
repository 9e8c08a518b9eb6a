"""Conformance over every registered generation backend (``sqlrl.policy.backends.BACKENDS``, read at
collection) on the tiny test model: each builds through ``make_backend``, implements the
``GenerationBackend`` protocol (``generate(prompts, params) -> list[Generation]``), and generates one
sequence for one prompt with its logprobs, within ``max_new_tokens``, ending for a stated reason;
``len(prompts) * n`` generations for a batch, a grammar refused, and -- where it says
``streams_tokens`` -- every token streamed to ``on_token`` (``batch_problems``). A
backend that cannot run here says why (vLLM's CPU build has no kernel for the tiny model's head
size): skipped with that reason, unverified here. Aborting a request is the async engines' contract
(``AsyncEngine.abort``), run on every registered engine by tests/unit/test_async_engine_contract.py."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from sqlrl.policy.backends import BACKENDS, make_backend, vllm_unavailable
from sqlrl.policy.types import Generation, GenerationBackend, SamplingParams

pytest.importorskip("transformers")

NAMES = list(BACKENDS)
PARAMS = SamplingParams(temperature=0.0, max_new_tokens=6, seed=3)
FINISH = {"stop", "length", "eos"}


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    from sqlrl.policy.load import load_policy

    return load_policy("tiny", cache_dir=tmp_path_factory.getbasetemp() / "policy-cache")


# the backends that may not run on a machine, with the registry's own check of why (None: it can)
AVAILABILITY = {"vllm": vllm_unavailable}


def _why_not_here(name, policy) -> str | None:
    check = AVAILABILITY.get(name)
    return check(policy) if check else None


@pytest.mark.parametrize("name", NAMES)
def test_the_backend_builds_and_generates_one_sequence(name, policy):
    reason = _why_not_here(name, policy)
    if reason:
        pytest.skip(f"backend {name!r} cannot run here (unverified): {reason}")
    backend = make_backend(name, policy, seed=3)
    for method, proto in inspect.getmembers(GenerationBackend, inspect.isfunction):
        if not method.startswith("_"):
            assert callable(getattr(type(backend), method, None)), \
                f"backend {name!r} ({type(backend).__name__}) lacks GenerationBackend.{method}"
            assert list(inspect.signature(getattr(type(backend), method)).parameters)[:3] == \
                list(inspect.signature(proto).parameters)[:3], f"backend {name!r}: {method}'s signature"
    prompt = policy.tokenizer.encode("<|im_start|>user\nHow many customers?<|im_end|>\n<|im_start|>assistant\n",
                                     add_special_tokens=False)
    gens = backend.generate([prompt], PARAMS)
    assert len(gens) == 1 and isinstance(gens[0], Generation), f"backend {name!r}: one prompt, n=1 -> one Generation"
    g = gens[0]
    assert 1 <= len(g.token_ids) <= PARAMS.max_new_tokens, (name, g)
    assert len(g.logprobs) == len(g.token_ids) and all(lp <= 0.0 for lp in g.logprobs), (name, g)
    assert g.finish_reason in FINISH, f"backend {name!r}: finish_reason {g.finish_reason!r}"
    problems = batch_problems(backend, [prompt, prompt[:-1]])
    assert not problems, f"backend {name!r}: " + "; ".join(problems)
    if hasattr(backend, "close"):
        backend.close()


def batch_problems(backend, prompts) -> list[str]:
    """What ``backend`` breaks of the rest of the ``GenerationBackend`` contract
    (``sqlrl.policy.types``, ``sqlrl.policy.backends``): ``len(prompts) * n`` generations, prompt-major
    (the callers pair them with their rows by position); a grammar (``SamplingParams.structured``)
    refused with ``ValueError`` before any token (only the engines honour one); and, for a backend
    that says ``streams_tokens``, ``generate(..., on_token=)`` called with ``(row, token_id)`` for
    every token it returns, in order (``generate_streaming``)."""
    from sqlrl.policy.backends import generate_streaming
    from sqlrl.policy.constraints import StructuredOutput

    problems = []
    two = dataclasses.replace(PARAMS, n=2)
    gens = backend.generate(prompts, two)
    if len(gens) != len(prompts) * 2:
        problems.append(f"{len(prompts)} prompts with n=2 gave {len(gens)} generations, not {len(prompts) * 2} "
                        "(len(prompts) * params.n, prompt-major)")
    try:
        backend.generate(prompts[:1], dataclasses.replace(PARAMS, structured=StructuredOutput('root ::= "a"')))
        problems.append("generated under a grammar (SamplingParams.structured) instead of refusing it "
                        "(ValueError: only the engines honour one; sqlrl.policy.constraints.refuse_structured)")
    except ValueError:
        pass
    if getattr(backend, "streams_tokens", False):
        seen: list[tuple[int, int]] = []
        try:
            gens = generate_streaming(backend, prompts, two, lambda row, tok: seen.append((row, tok)))
        except TypeError as exc:
            return problems + [f"says streams_tokens but generate takes no on_token: {exc}"]
        want = [(row, tok) for row, g in enumerate(gens) for tok in g.token_ids]
        if sorted(seen, key=lambda x: x[0]) != want:
            problems.append("says streams_tokens but on_token did not see each returned token, by row, in order")
    return problems


class _Echo:
    """A planted backend: one generation a prompt whatever n is, and streams_tokens without on_token."""

    streams_tokens = True

    def generate(self, prompts, params):
        return [Generation(tuple(p[-2:]), (0.0, 0.0), "", "length") for p in prompts]


class _Careless(_Echo):
    """A planted backend: n generations a prompt, but a grammar generates like anything else."""

    streams_tokens = False

    def generate(self, prompts, params):
        return [g for g in super().generate(prompts, params) for _ in range(params.n)]


def test_the_suite_names_what_a_planted_backend_breaks():
    problems = batch_problems(_Echo(), [[1, 2, 3], [4, 5, 6]])
    assert problems[0] == "2 prompts with n=2 gave 2 generations, not 4 (len(prompts) * params.n, prompt-major)"
    assert problems[2].startswith("says streams_tokens but generate takes no on_token")
    assert batch_problems(_Careless(), [[1, 2, 3]]) == [
        "generated under a grammar (SamplingParams.structured) instead of refusing it "
        "(ValueError: only the engines honour one; sqlrl.policy.constraints.refuse_structured)"]
