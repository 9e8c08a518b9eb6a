"""A batch backend called directly never ignores a grammar (``SamplingParams.structured``): its
``generate`` refuses the call with a ``ValueError`` naming the engines that honour one, before any
work -- only the async engines (HFEngine, VLLMEngine) constrain generation."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers", reason="the policy stack (transformers) is not installed")

from sqlrl.policy.constraints import StructuredOutput  # noqa: E402
from sqlrl.policy.load import load_policy  # noqa: E402
from sqlrl.policy.types import SamplingParams  # noqa: E402

GRAMMAR = StructuredOutput(grammar='root ::= "SELECT 1"')
CONSTRAINED = SamplingParams(max_new_tokens=4, temperature=0.0, structured=GRAMMAR)
FREE = SamplingParams(max_new_tokens=4, temperature=0.0)


@pytest.fixture(scope="module")
def policy():
    return load_policy("tiny")


def prompt(policy):
    return policy.tokenizer("How many customers?")["input_ids"]


def test_hf_backend_refuses_a_grammar_and_generates_without_one(policy):
    from sqlrl.policy.hf_backend import HFBackend

    backend = HFBackend(policy)
    with pytest.raises(ValueError, match=r"HFBackend.generate .* cannot constrain .* use the hf or vllm engine"):
        backend.generate([prompt(policy)], CONSTRAINED)
    assert len(backend.generate([prompt(policy)], FREE)[0].token_ids) >= 1  # the same call without one runs


def test_scripted_backend_refuses_a_grammar_before_its_script_runs(policy):
    from sqlrl.policy.scripted import ScriptedBackend

    backend = ScriptedBackend(policy.tokenizer, policy.eos_token_ids)
    with pytest.raises(ValueError, match="ScriptedBackend.generate .* cannot constrain"):
        backend.generate([prompt(policy)], CONSTRAINED)
    assert backend.calls == []  # refused at the entry: nothing was generated


def test_vllm_backend_refuses_a_grammar_before_the_engine_sees_it(policy):
    from sqlrl.policy.vllm_backend import VLLMBackend

    class Untouchable:
        def __getattr__(self, name):
            raise AssertionError(f"the engine was reached ({name})")

    backend = VLLMBackend.__new__(VLLMBackend)  # no engine process: the refusal comes first
    backend.llm = Untouchable()
    with pytest.raises(ValueError, match="VLLMBackend.generate .* cannot constrain"):
        backend.generate([prompt(policy)], CONSTRAINED)
