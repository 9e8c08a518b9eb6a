"""Conformance over every registered generation backend (``sqlrl.policy.backends.BACKENDS``, read at
collection) on the tiny test model: each builds through ``make_backend``, implements the
``GenerationBackend`` protocol (``generate(prompts, params) -> list[Generation]``), and generates one
sequence for one prompt with its logprobs, within ``max_new_tokens``, ending for a stated reason. A
backend that cannot run here says why (vLLM's CPU build has no kernel for the tiny model's head
size): skipped with that reason, unverified here. Aborting a request is the async engines' contract
(``AsyncEngine.abort``), run on every registered engine by tests/unit/test_async_engine_contract.py."""

from __future__ import annotations

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
    if hasattr(backend, "close"):
        backend.close()
