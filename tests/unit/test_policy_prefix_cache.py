"""The prefix KV cache: ``PrefixKVCache`` (lookup, budget, LRU, validation) and ``HFBackend`` with it
on the tiny model -- generations equal those without it over multi-turn conversations, batched and
alone, greedy and sampled; ``score`` agrees; weight changes invalidate it."""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from sqlrl.policy.hf_backend import HFBackend, _prefix_cache_unsupported  # noqa: E402
from sqlrl.policy.load import load_policy  # noqa: E402
from sqlrl.policy.prefix_cache import PrefixKVCache, common_prefix_length, kv_bytes_per_token  # noqa: E402
from sqlrl.policy.types import SamplingParams  # noqa: E402

GREEDY = SamplingParams(temperature=0, max_new_tokens=10)
QUESTIONS = ["hi", "How many books are in the library?", "List every flight from Paris to Rome after 2020."]


# ---------------------------------------------------------------------------- PrefixKVCache


def kv(ids, layers=2, heads=2, dim=3, salt=0.0):
    """Distinct, position-dependent fake KV for ``ids``: row j of layer l is f(ids[j], j, l)."""
    out = []
    for layer in range(layers):
        base = torch.tensor([[float(t) + 0.01 * j + 10 * layer + salt for j, t in enumerate(ids)]])
        k = base.unsqueeze(-1).expand(heads, len(ids), dim).clone()
        out.append((k, -k))
    return out


def test_lookup_finds_the_longest_common_prefix_capped_below_the_length():
    pc = PrefixKVCache(100)
    assert pc.lookup([1, 2, 3]).length == 0  # empty store
    pc.store([1, 2, 3, 4, 5], kv([1, 2, 3, 4, 5]))
    pc.store([1, 2, 7], kv([1, 2, 7]))
    hit = pc.lookup([1, 2, 3, 9, 9])  # common prefix 3 with the first, 2 with the second
    assert hit.length == 3 and len(hit.layers) == 2
    assert torch.equal(hit.layers[1][0], kv([1, 2, 3, 4, 5])[1][0][:, :3])
    assert torch.equal(hit.layers[1][1], -hit.layers[1][0])
    assert pc.lookup([1, 2, 3, 4, 5, 6, 7]).length == 5  # a stored sequence that is a prefix
    assert pc.lookup([1, 2, 3, 4, 5]).length == 4  # the whole sequence stored: one token left to run
    assert pc.lookup([1, 2]).length == 1
    assert pc.lookup([1]).length == 0 and pc.lookup([8, 2, 3]).length == 0
    assert pc.stats.hits == 4 and pc.stats.reused_tokens == 3 + 5 + 4 + 1


def test_common_prefix_length():
    assert common_prefix_length([], [1]) == 0
    assert common_prefix_length([1, 2, 3], [1, 2, 3]) == 3
    assert common_prefix_length([1, 2, 3], [1, 2]) == 2
    assert common_prefix_length([9, 2], [1, 2]) == 0
    long = list(range(1000))
    for k in (0, 1, 499, 998, 999):
        assert common_prefix_length(long, long[:k] + [-1] + long[k + 1:]) == k


def test_budget_evicts_least_recently_used_and_refuses_oversized():
    pc = PrefixKVCache(10)
    a, b, c = [1, 1, 1, 1], [2, 2, 2, 2], [3, 3, 3, 3]
    for ids in (a, b):
        assert pc.store(ids, kv(ids))
    assert pc.lookup(a + [9]).length == 4  # touches a: b is now the oldest
    assert pc.store(c, kv(c))
    assert pc.tokens == 8 <= pc.max_tokens and len(pc) == 2
    assert pc.lookup(b + [9]).length == 0 and pc.lookup(a + [9]).length == 4
    assert pc.lookup(c + [9]).length == 4 and pc.stats.evicted == 1
    assert not pc.store(list(range(1, 12)), kv(list(range(1, 12))))  # 11 > 10 tokens
    assert pc.tokens == 8
    pc.clear()
    assert len(pc) == 0 and pc.tokens == 0 and pc.lookup(a + [9]).length == 0


def test_prefixes_of_a_stored_sequence_are_not_kept_twice():
    pc = PrefixKVCache(100)
    pc.store([1, 2, 3], kv([1, 2, 3]))
    pc.store([1, 2, 3, 4, 5], kv([1, 2, 3, 4, 5]))  # the next turn of the same conversation
    assert len(pc) == 1 and pc.tokens == 5
    pc.store([1, 2], kv([1, 2]))  # already covered: nothing new stored
    assert len(pc) == 1 and pc.tokens == 5
    pc.store([1, 2, 9], kv([1, 2, 9]))  # a sibling that diverges: both kept
    assert len(pc) == 2 and pc.tokens == 8


def test_stored_tensors_do_not_alias_the_callers_batch():
    pc = PrefixKVCache(100)
    batch = torch.arange(2 * 2 * 6 * 3, dtype=torch.float32).reshape(2, 2, 6, 3)
    pc.store([4, 5, 6], [(batch[1, :, :3], batch[1, :, 3:])])
    expected = batch[1, :, :2].clone()
    batch.zero_()
    hit = pc.lookup([4, 5, 6, 7])
    assert hit.length == 3 and torch.equal(hit.layers[0][0][:, :2], expected)
    assert hit.layers[0][0].untyped_storage().nbytes() == 2 * 3 * 3 * 4  # its own compact storage


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="max_tokens"):
        PrefixKVCache(0)
    with pytest.raises(ValueError, match="max_tokens"):
        PrefixKVCache(True)
    pc = PrefixKVCache(100)
    with pytest.raises(ValueError, match="empty"):
        pc.store([], kv([1]))
    with pytest.raises(ValueError, match="no layers"):
        pc.store([1], [])
    with pytest.raises(ValueError, match=r"\[kv_heads, 3, head_dim\]"):
        pc.store([1, 2, 3], kv([1, 2]))
    k, v = kv([1, 2])[0]
    with pytest.raises(ValueError, match="layer 0"):
        pc.store([1, 2], [(k, v[:, :, :2])])
    assert len(pc) == 0


def test_kv_bytes_per_token_and_unsupported_models():
    from transformers import LlamaConfig, Qwen2Config

    smol = LlamaConfig(hidden_size=576, num_attention_heads=9, num_key_value_heads=3, head_dim=64,
                       num_hidden_layers=30)
    assert kv_bytes_per_token(smol) == 46_080  # SmolLM2-135M float32: 45 KiB per token
    assert _prefix_cache_unsupported(smol) is None
    sliding = Qwen2Config(num_hidden_layers=2, use_sliding_window=True, sliding_window=16,
                          max_window_layers=0)
    assert "non-full-attention" in _prefix_cache_unsupported(sliding)


# ---------------------------------------------------------------------------- HFBackend


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    return load_policy("tiny", cache_dir=tmp_path_factory.getbasetemp() / "policy-cache")


@pytest.fixture(scope="module")
def prompts(policy):
    tok = policy.tokenizer
    return [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                    tokenize=True, return_dict=False) for q in QUESTIONS]


def conversation(backend, firsts, params, turns=3, late=None, offset=0):
    """Run ``turns`` calls; each prompt grows by its generation + a continuation of varying length
    (``3 + 2 * (i + offset)`` tokens for conversation ``i``). ``late`` (a prompt) joins the batch at
    the second call, so that call mixes cached and uncached rows."""
    tok = backend.tokenizer
    cont = tok.encode(" <tool_response> 3 rows </tool_response> next", add_special_tokens=False)
    convs, out = [list(p) for p in firsts], []
    for turn in range(turns):
        if turn == 1 and late is not None:
            convs.append(list(late))
        gens = backend.generate(convs, params)
        out.append(gens)
        assert len(gens) == len(convs) * params.n
        if params.n == 1:
            convs = [c + list(g.token_ids) + cont[:3 + 2 * (i + offset)] for i, (c, g) in enumerate(zip(convs, gens))]
    return out, convs


def assert_same(a, b):
    for ga, gb in zip(a, b):
        assert [g.token_ids for g in ga] == [g.token_ids for g in gb]
        assert [g.finish_reason for g in ga] == [g.finish_reason for g in gb]
        for x, y in zip(ga, gb):
            assert len(x.logprobs) == len(y.logprobs)
            assert max((abs(p - q) for p, q in zip(x.logprobs, y.logprobs)), default=0.0) < 1e-4


def test_greedy_multi_turn_equals_no_cache_batched_and_alone(policy, prompts):
    firsts = [prompts[0], prompts[1], prompts[1], prompts[2]]  # a duplicated prompt, mixed lengths
    on, off = HFBackend(policy), HFBackend(policy, prefix_cache=False)
    got, convs = conversation(on, firsts[:3], GREEDY, late=firsts[3])
    want, _ = conversation(off, firsts[:3], GREEDY, late=firsts[3])
    assert_same(got, want)
    assert len({g.token_ids for g in got[2]}) >= 3  # outputs depend on the prompt
    # the cache did the work: later calls prefilled a fraction of their prompts, once per distinct prompt
    assert on.prefill_stats["deduped_prompts"] == 1
    assert on.prefill_stats["prefilled_tokens"] < 0.6 * on.prefill_stats["prompt_tokens"]
    assert off.prefill_stats["prefilled_tokens"] == off.prefill_stats["prompt_tokens"]
    assert on.prefix_cache.stats.hits >= 8 and off.prefix_cache is None
    # one at a time, each conversation alone on a fresh cached backend: the same tokens again
    for i, first in enumerate(firsts[:3]):
        alone, _ = conversation(HFBackend(policy), [first], GREEDY, offset=i)
        assert_same([[turn[0]] for turn in alone], [[turn[i]] for turn in got])
    # score (teacher-forced, no cache) agrees with the last cached call's log-probs
    last = got[2]
    prev = convs  # prompts of the third call + its generation + a continuation
    scored = on.score([(c[:len(c) - len(g.token_ids) - (3 + 2 * i)], g.token_ids)
                       for i, (c, g) in enumerate(zip(prev, last))], temperature=1.0)
    for g, s in zip(last, scored):
        assert max(abs(x - y) for x, y in zip(g.logprobs, s)) < 1e-4


def test_sampled_group_with_stops_equals_no_cache(policy, prompts):
    params = SamplingParams(temperature=0.9, top_p=0.95, n=3, max_new_tokens=8, seed=11)
    on, off = HFBackend(policy), HFBackend(policy, prefix_cache=False)
    for _ in range(2):  # the second round hits the entries the first stored
        a = on.generate(prompts, params)
        b = off.generate(prompts, params)
        assert_same([a], [b])
    assert on.prefix_cache.stats.hits >= 3
    greedy_text = off.generate([prompts[1]], GREEDY)[0].text
    stop = greedy_text[3:6]
    stopped = dataclasses.replace(GREEDY, stop=(stop,))
    for _ in range(2):
        assert_same([on.generate(prompts, stopped)], [off.generate(prompts, stopped)])


def test_prompts_sharing_a_long_prefix_prefill_it_once(policy):
    tok = policy.tokenizer
    system = "Tables: " + ", ".join(f"table_{i} (id, name, value_{i})" for i in range(12))
    firsts = [tok.apply_chat_template([{"role": "system", "content": system}, {"role": "user", "content": q}],
                                      add_generation_prompt=True, tokenize=True, return_dict=False)
              for q in QUESTIONS]
    shared = common_prefix_length(firsts[0], firsts[1])
    assert shared >= 64
    on, off = HFBackend(policy), HFBackend(policy, prefix_cache=False)
    got, _ = conversation(on, firsts, GREEDY, turns=2)
    want, _ = conversation(off, firsts, GREEDY, turns=2)
    assert_same(got, want)
    first_call = sum(len(p) for p in firsts)
    assert on.prefill_stats["prefilled_tokens"] <= first_call - 2 * (shared - 1) + 40 * len(firsts)


def test_weight_changes_invalidate_the_cache(tmp_path_factory, prompts):
    pol = load_policy("tiny", cache_dir=tmp_path_factory.getbasetemp() / "policy-cache")
    on, off = HFBackend(pol), HFBackend(pol, prefix_cache=False)
    conversation(on, prompts, GREEDY, turns=1)
    assert len(on.prefix_cache) > 0
    with torch.no_grad():  # an in-place update, as an optimizer step or load_state_dict does
        for p in pol.model.parameters():
            p.mul_(1.5)
    before = on.prefix_cache.stats.cleared
    got, _ = conversation(on, prompts, GREEDY, turns=2)
    want, _ = conversation(off, prompts, GREEDY, turns=2)
    assert on.prefix_cache.stats.cleared == before + 1
    assert_same(got, want)
    on.clear_cache()
    assert len(on.prefix_cache) == 0 and on.prefix_cache.tokens == 0


def test_rollout_worker_update_weights_clears_the_cache(policy, prompts):
    from actors.rollout import PolicySpec, RolloutConfig, RolloutWorker

    worker = RolloutWorker(0, RolloutConfig(PolicySpec(str(policy.path), backend="hf")))
    worker.backend.generate(prompts, GREEDY)
    assert len(worker.backend.prefix_cache) > 0
    assert worker.update_weights(policy.model.state_dict(), version=3) == 3
    assert len(worker.backend.prefix_cache) == 0


def test_cache_flags(policy):
    assert HFBackend(policy, prefix_cache=False).prefix_cache_off_reason == "disabled (prefix_cache=False)"
    assert HFBackend(policy, max_cached_tokens=123).prefix_cache.max_tokens == 123
    with pytest.raises(ValueError, match="max_tokens"):
        HFBackend(policy, max_cached_tokens=0)


def test_growing_cache_layer_matches_concatenation():
    from sqlrl.policy.hf_kv import growing_cache as _growing_cache

    cache = _growing_cache(1, capacity=3)
    parts = [torch.randn(2, 2, n, 4) for n in (2, 1, 4, 1)]  # outgrows the capacity once
    for p in parts:
        keys, values = cache.update(p, -p, 0)
    full = torch.cat(parts, dim=-2)
    assert torch.equal(keys, full) and torch.equal(values, -full) and cache.get_seq_length() == 8
    layer = cache.layers[0]
    layer.batch_select_indices(torch.tensor([1, 1, 0]))
    assert torch.equal(layer.keys, full[[1, 1, 0]])
    layer.batch_repeat_interleave(2)
    assert torch.equal(layer.keys, full[[1, 1, 1, 1, 0, 0]])
    layer.crop(-3)
    assert layer.get_seq_length() == 5
    extra = torch.randn(6, 2, 1, 4)
    keys, _ = cache.update(extra, extra, 0)
    assert torch.equal(keys, torch.cat([full[[1, 1, 1, 1, 0, 0]][..., :5, :], extra], dim=-2))
