"""sqlrl.learn.batch: SFT examples tokenised exactly as the agent loop builds trajectories,
TokenBatch invariants and slicing, and GRPO advantages from verl checked by hand."""

from __future__ import annotations

import json
import math

import pytest
import torch

from sqlrl.agent import AgentLoop, HFChatFormat, Trajectory, tools_for
from sqlrl.db import open_session
from sqlrl.learn.batch import (SFTExample, SFTLengthWarning, TokenBatch, read_sft_jsonl, rl_batch, sft_batch,
                               tokenize_sft)
from sqlrl.learn.config import GRPOConfig
from tests.unit.test_agent_chat_format import FakeTokenizer
from tests.unit.test_agent_loop import CFG, IM_END, ScriptedBackend, task, tc

TOOLS = tools_for("agentic")


@pytest.fixture(scope="module")
def tiny():
    from sqlrl.policy.load import load_policy

    return load_policy("tiny")


@pytest.fixture()
def sessions(demo_db_path):
    opened = []

    def make(n: int):
        opened.extend(open_session(f"sqlite:///{demo_db_path}") for _ in range(n))
        return opened[-n:]

    yield make
    for s in opened:
        s.close()


def run_loop(tok, script, sessions, eot_id=IM_END) -> Trajectory:
    backend = ScriptedBackend(tok, {"Q-sft": script}, eot_id=eot_id)
    (t,) = AgentLoop([task("Q-sft")], sessions(1), backend, HFChatFormat(tok), CFG).run()
    return t


# ------------------------------------------------------------------------------------------------
# SFT: the same ids as the loop


SCRIPT = ["plain words, no call",  # malformed: an error observation
          tc("SELECT name FROM products ORDER BY product_id LIMIT 2"),
          tc("SELECT 1", "submit_solution", reason="").lstrip("\n")]  # a call with no text before it


@pytest.mark.parametrize("which", ["fake-qwen2.5", "tiny"])
def test_sft_example_from_a_trajectory_gives_the_trajectory_ids(which, sessions, request):
    tok = FakeTokenizer() if which == "fake-qwen2.5" else request.getfixturevalue("tiny").tokenizer
    eot = IM_END if which == "fake-qwen2.5" else tok.convert_tokens_to_ids("<|im_end|>")
    t = run_loop(tok, SCRIPT, sessions, eot_id=eot)
    assert t.stop_reason == "submitted" and t.n_malformed == 1 and t.n_tool_calls == 2
    assert any(m.get("tool_calls") for m in t.messages) and any(m["role"] == "tool" for m in t.messages)
    ex = SFTExample(messages=t.messages, tools=tuple(TOOLS))
    ids, mask = tokenize_sft(ex, HFChatFormat(tok))
    assert ids == list(t.token_ids)
    assert mask == list(t.loss_mask)


def test_a_turn_not_closed_by_the_model_has_its_end_of_turn_trained(sessions):
    tok = FakeTokenizer()
    script = [("stop", tc("SELECT 1")), ("length", "Hmm, let me think about"), tc("SELECT 1", "submit_solution")]
    t = run_loop(tok, script, sessions)
    ids, mask = tokenize_sft(SFTExample(messages=t.messages, tools=tuple(TOOLS)), HFChatFormat(tok))
    assert ids == list(t.token_ids)  # the continuation closed the turn with the same token
    diff = [k for k in range(len(ids)) if mask[k] != t.loss_mask[k]]
    assert len(diff) == 2 and all(ids[k] == IM_END and mask[k] == 1 and t.loss_mask[k] == 0 for k in diff)


def test_messages_after_the_last_assistant_turn_are_not_tokenised():
    fmt = HFChatFormat(FakeTokenizer())
    base = ({"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"})
    tail = base + ({"role": "user", "content": "More?"},)
    assert tokenize_sft(SFTExample(tail), fmt) == tokenize_sft(SFTExample(base), fmt)
    ids, mask = tokenize_sft(SFTExample(base), fmt)
    trained = [i for i, m in zip(ids, mask) if m]
    assert fmt.decode(trained) == "Hello<|im_end|>"
    assert fmt.decode(ids[:mask.index(1)]).endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize("messages, message", [
    (({"role": "system", "content": "s"}, {"role": "user", "content": "u"}), "no assistant message"),
    (({"role": "assistant", "content": "a"},), "needs a prompt"),
    (({"role": "user", "content": "u"}, {"role": "assistant", "content": "x<|im_end|>y"}),
     "contains the end-of-turn"),
])
def test_untrainable_examples_are_clear_errors(messages, message):
    with pytest.raises(ValueError, match=message):
        tokenize_sft(SFTExample(messages), HFChatFormat(FakeTokenizer()))


def test_sft_batch_needs_a_tokenizer():
    class NoTokenizer:
        end_of_turn, turn_end_ids = "<|im_end|>", (2,)

    with pytest.raises(ValueError, match="tokenizer"):
        sft_batch([SFTExample(({"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}))],
                  NoTokenizer(), max_length=100, pad_id=0)


def _conv(answer: str) -> SFTExample:
    return SFTExample(({"role": "user", "content": "Q"}, {"role": "assistant", "content": answer}))


def test_sft_batch_right_pads_and_drops_too_long_examples_with_one_warning():
    fmt = HFChatFormat(FakeTokenizer())
    short, mid, long = _conv("ab"), _conv("abcdef"), _conv("x" * 200)
    n_short, n_mid = len(tokenize_sft(short, fmt)[0]), len(tokenize_sft(mid, fmt)[0])
    b = sft_batch([short, mid], fmt, max_length=n_mid, pad_id=3)
    assert len(b) == 2 and b.input_ids.shape == (2, n_mid) and b.old_logprobs is None and b.advantages is None
    assert b.attention_mask[0].tolist() == [1] * n_short + [0] * (n_mid - n_short)
    assert b.input_ids[0, n_short:].tolist() == [3] * (n_mid - n_short)
    assert b.n_tokens == 3 + 7  # "ab" + <|im_end|>, "abcdef" + <|im_end|>
    with pytest.warns(SFTLengthWarning, match="dropped 2 of 3 SFT examples longer than max_length=" + str(n_short)):
        b = sft_batch([mid, short, long], fmt, max_length=n_short, pad_id=3)
    assert len(b) == 1 and b.input_ids[0].tolist() == tokenize_sft(short, fmt)[0]
    with pytest.raises(ValueError, match="every one of the 1 SFT examples is longer"):
        sft_batch([long], fmt, max_length=n_short, pad_id=3)
    with pytest.raises(ValueError, match="at least one example"):
        sft_batch([], fmt, max_length=10, pad_id=3)
    with pytest.raises(ValueError, match="max_length"):
        sft_batch([short], fmt, max_length=0, pad_id=3)


# ------------------------------------------------------------------------------------------------
# SFT examples as data


def test_sft_example_round_trips_and_reads_jsonl(tmp_path):
    rows = [{"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}], "tools": None},
            {"messages": [{"role": "user", "content": "Q"},
                          {"role": "assistant", "content": None, "tool_calls": [{"name": "f", "arguments": {}}]}],
             "tools": [{"type": "function", "function": {"name": "f"}}], "meta": {"task_id": "t1"}}]
    path = tmp_path / "sft.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    examples = read_sft_jsonl(path)
    assert [e.to_dict() for e in examples] == rows
    assert examples[1].meta == {"task_id": "t1"} and examples[1].tools[0]["function"]["name"] == "f"
    assert SFTExample.from_dict(examples[0].to_dict()) == examples[0]


@pytest.mark.parametrize("line, message", [
    ('{"messages": [{"role": "user", "content": "Q"}], "task": 1}', "unknown key"),
    ('{"messages": "hi"}', "needs 'messages'"),
    ('{"messages": []}', "non-empty"),
    ('{"messages": [{"role": "robot", "content": "x"}]}', "role 'robot'"),
    ('{"messages": [{"role": "user"}]}', "string 'content'"),
    ('{"messages": [{"role": "user", "content": "Q"}], "tools": {"a": 1}}', "'tools' must be a list"),
    ('{"messages": [{"role": "user", "content": "Q"}], "meta": [1]}', "'meta' must be an object"),
    ('[1, 2]', "must be a JSON object"),
    ('{"messages": [', "line 2"),
])
def test_bad_jsonl_lines_name_the_line(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"messages": [{"role": "user", "content": "Q"}]}\n' + line + "\n")
    with pytest.raises(ValueError, match="line 2") as err:
        read_sft_jsonl(path)
    assert message in str(err.value)


# ------------------------------------------------------------------------------------------------
# TokenBatch


def _batch(lengths=(4, 2, 3), **extra) -> TokenBatch:
    width = max(lengths)
    ids = torch.arange(len(lengths) * width).view(len(lengths), width) + 10
    am = torch.tensor([[1] * n + [0] * (width - n) for n in lengths])
    lm = torch.tensor([[0] + [1] * (n - 1) + [0] * (width - n) for n in lengths], dtype=torch.float32)
    return TokenBatch(input_ids=ids, attention_mask=am, loss_mask=lm, **extra)


def test_token_batch_select_micro_batches_and_shard_keep_rows_aligned():
    b = _batch(old_logprobs=torch.randn(3, 4), advantages=torch.randn(3, 4), versions=torch.tensor([5, 6, 7]))
    assert len(b) == 3 and b.n_tokens == 3 + 1 + 2 and b.n_sequences == 3
    s = b.select([2, 1])
    assert s.input_ids.shape == (2, 3)  # trimmed to the longest selected row
    assert s.input_ids.tolist() == b.input_ids[[2, 1], :3].tolist()
    assert s.old_logprobs.tolist() == b.old_logprobs[[2, 1], :3].tolist()
    assert s.advantages.tolist() == b.advantages[[2, 1], :3].tolist() and s.versions.tolist() == [7, 6]
    mbs = b.micro_batches(2)
    assert [len(m) for m in mbs] == [2, 1] and mbs[1].input_ids.tolist() == b.input_ids[2:, :3].tolist()
    assert sum(m.n_tokens for m in mbs) == b.n_tokens
    assert b.shard(0, 2).versions.tolist() == [5, 7] and b.shard(1, 2).versions.tolist() == [6]
    assert b.shard(1, 2).input_ids.shape == (1, 2)
    assert b.to("cpu").input_ids.tolist() == b.input_ids.tolist()
    ref = torch.full((3, 4), -1.0)
    assert b.with_ref_logprobs(ref).ref_logprobs is ref and b.ref_logprobs is None


def test_token_batch_slicing_errors():
    b = _batch()
    with pytest.raises(ValueError, match="3 rows over 4 ranks"):
        b.shard(0, 4)
    with pytest.raises(ValueError, match="rank must be"):
        b.shard(2, 2)
    with pytest.raises(ValueError, match="world_size"):
        b.shard(0, 0)
    with pytest.raises(ValueError, match="positive int"):
        b.micro_batches(0)
    with pytest.raises(ValueError, match="out of range"):
        b.select([3])
    with pytest.raises(ValueError, match="at least one row"):
        b.select([])
    with pytest.raises(ValueError, match="ref_logprobs"):
        b.with_ref_logprobs(torch.zeros(3, 5))


def test_token_batch_validates_its_invariants():
    good = _batch()
    ids, am, lm = good.input_ids, good.attention_mask, good.loss_mask

    def bad(message, **kw):
        fields = dict(input_ids=ids, attention_mask=am, loss_mask=lm) | kw
        with pytest.raises(ValueError, match=message):
            TokenBatch(**fields)

    bad("column 0", loss_mask=torch.ones_like(lm) * am)
    lm2 = lm.clone()
    lm2[1, 3] = 1.0
    bad("1 on padding", loss_mask=lm2)
    bad("only 0 and 1", loss_mask=lm * 0.5)
    left = am.flip(-1)
    bad("right padding", attention_mask=left, loss_mask=torch.zeros_like(lm))
    bad("must be long", input_ids=ids.float())
    bad(r"\[B, T\]", input_ids=ids[0])
    bad("attention_mask", attention_mask=am.float())
    bad("old_logprobs", old_logprobs=torch.zeros(3, 5))
    bad("versions", versions=torch.tensor([1, 2]))
    bad("float tensor", advantages=torch.zeros(3, 4, dtype=torch.long))


# ------------------------------------------------------------------------------------------------
# rl_batch


def traj(prompt: int, gen: int, version: int = 0, task_id: str = "t", tail: int = 0) -> Trajectory:
    """``prompt`` prompt tokens, ``gen`` generated ones (logprob -0.1 * k), then ``tail`` unmasked ones."""
    n = prompt + gen + tail
    mask = [0] * prompt + [1] * gen + [0] * tail
    lps = [0.0] * prompt + [-0.1 * (k + 1) for k in range(gen)] + [0.0] * tail
    return Trajectory(task_id=task_id, mode="agentic", messages=(), token_ids=tuple(range(100, 100 + n)),
                      loss_mask=tuple(mask), old_logprobs=tuple(lps), prompt_length=prompt, turns=(),
                      n_tool_calls=0, n_tool_errors=0, n_malformed=0, submitted_sql=None,
                      stop_reason="submitted", policy_version=version)


def test_rl_batch_grpo_advantages_by_hand():
    trajs = [traj(3, 2, version=4), traj(2, 3, tail=2, version=5), traj(4, 1), traj(2, 2), traj(3, 3)]
    rewards = [1.0, 0.0, 2.0, 0.0, 1.0]
    groups = ["a", "a", "b", "b", "b"]
    b = rl_batch(trajs, rewards, groups, GRPOConfig(), pad_id=0)
    eps = 1e-6
    # group a: mean 0.5, unbiased std sqrt(0.5); group b: mean 1, std 1
    sa, sb = math.sqrt(0.5), 1.0
    expected = [(1 - 0.5) / (sa + eps), (0 - 0.5) / (sa + eps), (2 - 1) / (sb + eps), (0 - 1) / (sb + eps), 0.0]
    assert b.input_ids.shape == (5, 7)
    for r, (t, a) in enumerate(zip(trajs, expected)):
        n = len(t.token_ids)
        assert b.input_ids[r, :n].tolist() == list(t.token_ids) and b.input_ids[r, n:].tolist() == [0] * (7 - n)
        assert b.loss_mask[r, :n].tolist() == list(t.loss_mask)
        assert b.old_logprobs[r, :n].tolist() == pytest.approx(list(t.old_logprobs))
        want = [a if m else 0.0 for m in t.loss_mask] + [0.0] * (7 - n)
        assert b.advantages[r].tolist() == pytest.approx(want, abs=1e-6)
    assert b.versions.tolist() == [4, 5, 0, 0, 0]
    # Dr.GRPO: mean-centred only.
    b2 = rl_batch(trajs, rewards, groups, GRPOConfig(norm_adv_by_std_in_grpo=False), pad_id=0)
    assert b2.advantages[0, 3].item() == pytest.approx(0.5) and b2.advantages[3, 2].item() == pytest.approx(-1.0)


def test_a_trajectory_without_generated_tokens_still_counts_in_its_group():
    trajs = [traj(3, 2), traj(4, 0), traj(3, 1)]
    b = rl_batch(trajs, [1.0, 0.0, 0.0], ["g", "g", "g"], GRPOConfig(norm_adv_by_std_in_grpo=False), pad_id=0)
    assert b.advantages[0, 3].item() == pytest.approx(2 / 3)  # mean of (1, 0, 0) is 1/3
    assert b.advantages[1].abs().sum().item() == 0 and b.loss_mask[1].sum().item() == 0
    assert b.advantages[2, 3].item() == pytest.approx(-1 / 3)


@pytest.mark.parametrize("kwargs, message", [
    (dict(rewards=[1.0]), "2 trajectories, 1 rewards and 2 group ids"),
    (dict(group_ids=["a"]), "must match one to one"),
    (dict(rewards=[1.0, float("nan")]), "reward 1 must be a finite number"),
    (dict(rewards=[1.0, True]), "reward 1"),
    (dict(group_ids=["a", 3]), "group id 1 must be a str"),
    (dict(max_length=5), "trajectory 1 .* 6 tokens, more than max_length=5"),
    (dict(trajectories=[]), "at least one trajectory"),
])
def test_rl_batch_bad_inputs(kwargs, message):
    args = dict(trajectories=[traj(2, 2), traj(3, 3)], rewards=[1.0, 0.0], group_ids=["a", "a"]) | kwargs
    with pytest.raises(ValueError, match=message):
        rl_batch(args["trajectories"], args["rewards"], args["group_ids"], GRPOConfig(), pad_id=0,
                 max_length=kwargs.get("max_length"))
