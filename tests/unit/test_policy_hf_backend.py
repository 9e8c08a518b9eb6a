"""``HFBackend`` on the tiny model: batching/padding invariance, stop strings, EOS, max_new_tokens,
n > 1, seeding, and log-probs against teacher-forced ``score``."""

from __future__ import annotations

import dataclasses
import math

import pytest

pytest.importorskip("transformers")

from sqlrl.policy.hf_backend import HFBackend, processed_logprobs  # noqa: E402
from sqlrl.policy.load import load_policy  # noqa: E402
from sqlrl.policy.types import SamplingParams  # noqa: E402

QUESTIONS = ["hi", "How many books are in the library?", "List every flight from Paris to Rome after 2020.",
             "SELECT name FROM"]
GREEDY = SamplingParams(temperature=0, max_new_tokens=24)


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    return load_policy("tiny", cache_dir=tmp_path_factory.getbasetemp() / "policy-cache")


@pytest.fixture(scope="module")
def backend(policy):
    return HFBackend(policy)


@pytest.fixture(scope="module")
def prompts(policy):
    tok = policy.tokenizer
    return [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                    tokenize=True, return_dict=False) for q in QUESTIONS]


def test_batch_gives_the_same_greedy_outputs_as_one_at_a_time(backend, prompts):
    assert len({len(p) for p in prompts}) == 4  # different lengths: real left padding
    batched = backend.generate(prompts, GREEDY)
    alone = [backend.generate([p], GREEDY)[0] for p in prompts]
    assert [g.token_ids for g in batched] == [g.token_ids for g in alone]
    for a, b in zip(batched, alone):
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4
    assert len({g.token_ids for g in batched}) >= 3  # outputs depend on the prompt (the test can fail)
    assert all(g.finish_reason == "length" and len(g.token_ids) == 24 for g in batched)


def test_greedy_logprobs_equal_score(backend, prompts):
    gens = backend.generate(prompts, GREEDY)
    scored = backend.score([(p, g.token_ids) for p, g in zip(prompts, gens)], temperature=1.0)
    for g, s in zip(gens, scored):
        assert len(s) == len(g.logprobs)
        assert max(abs(x - y) for x, y in zip(g.logprobs, s)) < 1e-4
        assert all(x < 0 for x in g.logprobs)


def test_sampled_logprobs_equal_score_with_temperature_and_top_p(backend, prompts):
    params = SamplingParams(temperature=0.7, top_p=0.9, n=2, max_new_tokens=20, seed=3)
    gens = backend.generate(prompts, params)
    scored = backend.score([(prompts[g.meta["prompt_index"]], g.token_ids) for g in gens], temperature=0.7, top_p=0.9)
    for g, s in zip(gens, scored):
        assert max(abs(x - y) for x, y in zip(g.logprobs, s)) < 1e-4
        assert all(math.isfinite(x) and x <= 0 for x in g.logprobs)
    plain = backend.score([(prompts[g.meta["prompt_index"]], g.token_ids) for g in gens], temperature=1.0)
    assert any(abs(x - y) > 1e-3 for g, s in zip(gens, plain) for x, y in zip(g.logprobs, s))


def test_n_samples_are_prompt_major_seeded_and_independent_of_other_prompts(backend, prompts):
    params = SamplingParams(temperature=1.0, n=3, max_new_tokens=12, seed=7)
    gens = backend.generate(prompts[:2], params)
    assert [(g.meta["prompt_index"], g.meta["sample_index"]) for g in gens] == [(i, j) for i in range(2) for j in range(3)]
    assert len({g.token_ids for g in gens}) == 6
    again = backend.generate(prompts[:2], params)
    assert [g.token_ids for g in again] == [g.token_ids for g in gens]
    other = backend.generate([prompts[0], prompts[3]], params)
    assert [g.token_ids for g in other[:3]] == [g.token_ids for g in gens[:3]]
    reseeded = backend.generate(prompts[:2], dataclasses.replace(params, seed=8))
    assert [g.token_ids for g in reseeded] != [g.token_ids for g in gens]


def test_tiny_top_p_is_greedy(backend, prompts):
    greedy = backend.generate(prompts, GREEDY)
    nucleus = backend.generate(prompts, SamplingParams(temperature=1.0, top_p=1e-6, max_new_tokens=24, seed=0))
    assert [g.token_ids for g in nucleus] == [g.token_ids for g in greedy]
    assert all(x == 0.0 for g in nucleus for x in g.logprobs)


def test_stop_string_ends_only_its_row(backend, prompts):
    full = backend.generate(prompts, GREEDY)
    tok = backend.tokenizer
    target = 1  # stop prompt 1 at a string its greedy text contains after a few tokens
    ids = full[target].token_ids
    texts = [tok.decode(ids[:k], skip_special_tokens=True) for k in range(len(ids) + 1)]
    k = next(k for k in range(6, len(ids)) if len(texts[k]) > len(texts[k - 1]))
    stop = texts[k][len(texts[k - 1]) - 1:]  # the chars token k adds, plus one before them
    gens = backend.generate(prompts, dataclasses.replace(GREEDY, stop=(stop,)))
    g = gens[target]
    assert g.finish_reason == "stop" and stop in g.text
    assert ids[:len(g.token_ids)] == g.token_ids
    assert stop not in tok.decode(g.token_ids[:-1], skip_special_tokens=True)  # stopped at the first hit
    for i, (a, b) in enumerate(zip(gens, full)):
        if stop not in b.text:
            assert a.token_ids == b.token_ids and a.finish_reason == "length", i


def test_eos_ends_a_row_and_is_kept(policy, prompts):
    full = HFBackend(policy).generate(prompts, GREEDY)
    eos = full[2].token_ids[4]
    backend = HFBackend(dataclasses.replace(policy, eos_token_ids=(eos,)))
    gens = backend.generate(prompts, GREEDY)
    g = gens[2]
    assert g.finish_reason == "eos" and g.token_ids[-1] == eos
    assert g.token_ids == full[2].token_ids[:full[2].token_ids.index(eos) + 1]
    assert len(g.logprobs) == len(g.token_ids)


def test_max_new_tokens(backend, prompts):
    for m in (1, 5):
        gens = backend.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=m, seed=0))
        assert all(len(g.token_ids) == m == len(g.logprobs) and g.finish_reason == "length" for g in gens)
        assert all(g.text == backend.tokenizer.decode(g.token_ids, skip_special_tokens=True) for g in gens)


def test_bad_input_is_refused(backend, prompts):
    assert backend.generate([], GREEDY) == []
    with pytest.raises(ValueError, match="empty"):
        backend.generate([prompts[0], []], GREEDY)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        backend.generate([[1, 10**6]], GREEDY)
    with pytest.raises(ValueError, match="non-integer"):
        backend.generate([[1, "a"]], GREEDY)
    with pytest.raises(ValueError, match="positions"):
        backend.generate([prompts[0]], SamplingParams(max_new_tokens=10**6))
    with pytest.raises(ValueError, match="top_p"):
        backend.score([(prompts[0], [5])], top_p=0)
    with pytest.raises(ValueError):
        SamplingParams(n=0)


def test_completion_logprobs_keep_the_graph_for_the_learner(backend, prompts):
    out = backend.completion_logprobs([(prompts[0], [5, 6, 7]), (prompts[1], [])])
    assert out[0].shape == (3,) and out[0].requires_grad and out[1].numel() == 0
    out[0].sum().backward()
    grads = [p.grad for p in backend.model.parameters() if p.grad is not None]
    assert grads and any(float(g.abs().sum()) > 0 for g in grads)
    backend.model.zero_grad(set_to_none=True)


def test_processed_logprobs_top_p_keeps_the_smallest_nucleus():
    import torch

    lp = processed_logprobs(torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])), 1.0, 0.8)
    assert torch.isinf(lp[0, 2:]).all()  # 0.5 + 0.3 reaches 0.8
    assert torch.allclose(lp[0, :2].exp(), torch.tensor([0.625, 0.375]))
    lp = processed_logprobs(torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])), 1.0, 0.81)
    assert torch.isfinite(lp[0, :3]).all() and torch.isinf(lp[0, 3])
