"""The tiny model factory (determinism, vocabulary, reload) and ``load_policy`` (registry, paths, errors)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")

from sqlrl.policy.chat import TOOL_TAGS  # noqa: E402
from sqlrl.policy.load import MODELS, load_policy, resolve_path  # noqa: E402
from sqlrl.policy.tiny import build_tiny_model, default_corpus  # noqa: E402

SAMPLES = ["SELECT count(*) FROM books WHERE year > 1990;", "héllo wörld 😀  x\n\n  y", "<|im_start|>user\nhi<|im_end|>",
           '<tool_call>\n{"name": "execute_sql", "arguments": {"sql": "SELECT 1"}}\n</tool_call>']


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.getbasetemp() / "policy-cache"


@pytest.fixture(scope="module")
def policy(cache):
    return load_policy("tiny", cache_dir=cache)


def files(path):
    return {p.name: p.read_bytes() for p in path.iterdir()}


def test_same_seed_gives_identical_files_other_seed_other_weights(tmp_path, policy):
    a = build_tiny_model(tmp_path / "a", seed=0)
    b = build_tiny_model(tmp_path / "b", seed=0)
    c = build_tiny_model(tmp_path / "c", seed=1)
    fa, fb, fc = files(a), files(b), files(c)
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= set(fa)
    assert fa == fb
    assert fc["tokenizer.json"] == fa["tokenizer.json"] and fc["model.safetensors"] != fa["model.safetensors"]
    assert files(policy.path) == fa  # the registry's "tiny" is build_tiny_model(seed=0)


def test_building_leaves_the_callers_rng_alone(tmp_path):
    import torch

    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_tiny_model(tmp_path / "m", seed=5, corpus=default_corpus()[:200], vocab_size=400)
    assert torch.equal(torch.rand(3), expected)


def test_vocabulary_and_special_tokens(policy):
    tok, model = policy.tokenizer, policy.model
    assert tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [0, 1, 2]
    assert policy.eos_token_ids == (2,) and policy.pad_token_id == 0 and tok.padding_side == "left"
    assert model.config.vocab_size == len(tok) and model.config.model_type == "qwen2"
    for tag in TOOL_TAGS:
        (tid,) = tok.encode(tag, add_special_tokens=False)
        assert tok.decode([tid], skip_special_tokens=True) == tag  # not special: survives skipping
    text = '<tool_call>\n{"a": 1}\n</tool_call><|im_end|>'
    assert tok.decode(tok.encode(text), skip_special_tokens=True) == text.replace("<|im_end|>", "")
    for s in SAMPLES:  # byte-level: any text round-trips
        assert tok.decode(tok.encode(s)) == s


def test_autotokenizer_encodes_like_the_saved_tokenizer(policy):
    from transformers import AutoTokenizer

    auto = AutoTokenizer.from_pretrained(policy.path, local_files_only=True)
    for s in list(SAMPLES) + list(default_corpus()[:300]):
        assert auto.encode(s) == policy.tokenizer.encode(s)


def test_model_reloads_with_the_same_weights(policy):
    import torch
    from transformers import AutoModelForCausalLM

    again = AutoModelForCausalLM.from_pretrained(policy.path, local_files_only=True)
    for (n1, p1), (n2, p2) in zip(policy.model.state_dict().items(), again.state_dict().items()):
        assert n1 == n2 and torch.equal(p1, p2)
    assert not policy.model.training


def test_bad_sizes_and_existing_folder(tmp_path):
    with pytest.raises(ValueError, match="divisible"):
        build_tiny_model(tmp_path / "x", hidden_size=30, heads=4)
    with pytest.raises(ValueError, match="vocab_size"):
        build_tiny_model(tmp_path / "x", vocab_size=10)
    with pytest.raises(ValueError, match="corpus"):
        build_tiny_model(tmp_path / "x", corpus=[])
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError):
        build_tiny_model(tmp_path / "full")
    assert (tmp_path / "full" / "keep.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full"]  # no temp folders left behind


def test_load_policy_errors(tmp_path, cache):
    assert set(MODELS) == {"tiny", "smollm2-135m"}
    with pytest.raises(FileNotFoundError, match="no model folder.*tiny"):
        load_policy(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="not one of the named models"):
        load_policy("no-such-model")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_policy(tmp_path / "empty")
    with pytest.raises(ValueError, match="dtype"):
        load_policy("tiny", dtype="float8", cache_dir=cache)


def test_load_by_path_and_dtype(policy):
    import torch

    p = load_policy(str(policy.path), dtype="bfloat16")
    assert p.path == policy.path == resolve_path(policy.path)
    assert next(p.model.parameters()).dtype == torch.bfloat16
    assert json.loads((policy.path / "config.json").read_text())["eos_token_id"] == 2


def test_folder_without_chat_template_is_refused(tmp_path, policy):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(policy.path, copy)
    (copy / "chat_template.jinja").unlink()
    cfg = json.loads((copy / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (copy / "tokenizer_config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="chat template"):
        load_policy(copy)
