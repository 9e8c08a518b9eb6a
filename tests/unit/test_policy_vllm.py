"""vLLM backend: the output conversion (runs everywhere, with stand-in objects) and the real engine
(skips here: vLLM is the GPU path)."""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace as NS

import pytest

from sqlrl.policy.types import SamplingParams
from sqlrl.policy.vllm_backend import VLLMBackend, to_generation


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


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm not importable (GPU path; see docs)")
def test_real_engine_greedy(tmp_path):
    try:
        import vllm  # noqa: F401
    except Exception as exc:  # installed but unusable (no CUDA)
        pytest.skip(f"vllm not importable (GPU path; see docs): {exc}")
    from sqlrl.policy.load import load_policy

    policy = load_policy("tiny", cache_dir=tmp_path)
    backend = VLLMBackend(policy.path, enforce_eager=True)
    prompt = policy.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                                  return_dict=False)
    (g,) = backend.generate([prompt], SamplingParams(temperature=0, max_new_tokens=8))
    assert len(g.token_ids) == len(g.logprobs) <= 8
