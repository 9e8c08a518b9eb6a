"""vLLM backend: the output conversion and the head-size check (run everywhere, with stand-in
objects). The real engine is tests/integration/test_vllm_backend.py."""

from __future__ import annotations

from types import SimpleNamespace as NS

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
