"""Traced calls -> training sequences (sqlrl.gateway.sequences): merging, mismatch causes, tag
selection, masks, token-exactness, one advantage per rollout, unfinished rollouts, length limits."""

from __future__ import annotations

import math

import pytest

from sqlrl.gateway.sequences import (SequenceConfig, TraceSequence, build_sequences, rollout_advantages,
                                     training_rows)
from sqlrl.gateway.trace import RolloutTrace, TracedCall
from sqlrl.learn.config import GRPOConfig

EOT = 99  # the end-of-turn id of these hand-made conversations
SYS_A = [1, 11, 12, EOT]  # a first (system) message
SYS_B = [1, 21, 22, EOT]


def call(rid: str, index: int, prompt, response, tag: str | None = "write", version: int = 0) -> TracedCall:
    response = list(response)
    return TracedCall(rollout_id=rid, index=index, tag=tag, prompt_ids=tuple(prompt), response_ids=tuple(response),
                      logprobs=tuple(-0.1 * (index + 1) - 0.01 * k for k in range(len(response))),
                      versions=(version,) * len(response), finish_reason="stop")


def trace(rid: str, calls, *, status="completed", reward=1.0, group="g", task="t") -> RolloutTrace:
    return RolloutTrace(rollout_id=rid, task_id=task, group_id=group, calls=tuple(calls), status=status,
                        reward=reward if status == "completed" else None,
                        reward_source="judge" if status == "completed" else "none")


def multi_turn(rid: str, tags=("write", "write", "write"), version: int = 0) -> list[TracedCall]:
    """Three calls, each prompt = previous prompt + response + an observation."""
    p0 = SYS_A + [2, 3, EOT, 5]
    r0 = [40, 41, EOT]
    p1 = p0 + r0 + [6, 7, 8, EOT, 5]
    r1 = [42, EOT]
    p2 = p1 + r1 + [6, 9, EOT, 5]
    r2 = [43, 44, 45, EOT]
    return [call(rid, 0, p0, r0, tags[0], version), call(rid, 1, p1, r1, tags[1], version + 1),
            call(rid, 2, p2, r2, tags[2], version + 2)]


def test_append_only_calls_merge_into_one_token_exact_sequence():
    calls = multi_turn("r")
    out = build_sequences(trace("r", calls), SequenceConfig(turn_end_ids=(EOT,)))
    (seq,) = out.sequences
    last = calls[-1]
    assert seq.token_ids == last.prompt_ids + last.response_ids  # exactly the engine's ids, in order
    assert seq.call_indices == (0, 1, 2) and out.n_merged == 2 and out.mismatches == {}
    assert seq.prompt_length == len(calls[0].prompt_ids)
    # the mask is 1 exactly on the sampled ids, with their sampling log-probs; 0 / 0.0 elsewhere
    trained = [(i, t) for i, t in enumerate(seq.token_ids) if seq.loss_mask[i]]
    expected_positions = []
    for c in calls:
        start = len(c.prompt_ids)
        expected_positions += list(range(start, start + len(c.response_ids)))
    assert [i for i, _ in trained] == expected_positions
    assert [t for _, t in trained] == [t for c in calls for t in c.response_ids]
    assert [seq.old_logprobs[i] for i, _ in trained] == [lp for c in calls for lp in c.logprobs]
    assert all(lp == 0.0 for m, lp in zip(seq.loss_mask, seq.old_logprobs) if not m)
    assert seq.policy_version == 0  # the oldest version among trained tokens


EDITS = {"repeat": "repeated_prompt", "rerender": "response_rerendered", "system": "different_first_message",
         "history": "history_edited"}  # how the second prompt differs -> the cause counted


@pytest.mark.parametrize("edit", EDITS)
def test_a_call_that_does_not_extend_starts_a_sequence_and_counts_its_cause(edit):
    cause = EDITS[edit]
    c0, c1, _ = multi_turn("r")
    p0, r0 = list(c0.prompt_ids), list(c0.response_ids)
    prompt = {
        "repeat": p0,
        "rerender": p0 + [40, 77, EOT] + [6, 7, 8, EOT, 5],  # the assistant turn came back as other ids
        "system": SYS_B + [2, 3, EOT, 5] + r0 + [6, EOT, 5],  # another system prompt (another role)
        "history": SYS_A + [2, 4, EOT, 5] + r0 + [6, EOT, 5],  # an earlier user turn edited
    }[edit]
    second = call("r", 1, prompt, [50, EOT])
    out = build_sequences(trace("r", [c0, second]), SequenceConfig(turn_end_ids=(EOT,)))
    assert out.mismatches == {cause: 1} and out.n_merged == 0
    assert [s.token_ids for s in out.sequences] == [tuple(p0 + r0), tuple(prompt) + (50, EOT)]
    assert [s.call_indices for s in out.sequences] == [(0,), (1,)]


def test_without_turn_end_ids_a_changed_first_message_counts_as_an_edited_history():
    c0 = multi_turn("r")[0]
    second = call("r", 1, SYS_B + [2, 3, EOT, 5], [50, EOT])
    assert build_sequences(trace("r", [c0, second]), SequenceConfig()).mismatches == {"history_edited": 1}


def test_a_call_merges_into_an_earlier_sequence_after_another_role_interleaves():
    w0, w1, _ = multi_turn("r")
    check = call("r", 1, SYS_B + [2, 3, EOT, 5], [60, EOT], tag="check")  # its own conversation
    rewrite = call("r", 2, w1.prompt_ids, w1.response_ids, tag="rewrite")  # continues the write conversation
    out = build_sequences(trace("r", [w0, check, rewrite]), SequenceConfig(train_tags=("write", "rewrite"),
                                                                            turn_end_ids=(EOT,)))
    assert out.mismatches == {"different_first_message": 1} and out.n_merged == 1
    assert [s.call_indices for s in out.sequences] == [(0, 2)]  # check's sequence trains nothing: not emitted
    assert out.untrained_sequences == 1 and out.n_trained_calls == 2 and out.n_calls == 3


def test_tags_select_the_trained_calls_and_untagged_calls_follow_the_config():
    calls = multi_turn("r", tags=("write", "check", None))
    def mask_runs(cfg):
        (seq,) = build_sequences(trace("r", calls), cfg).sequences
        return [sum(seq.loss_mask[len(c.prompt_ids):len(c.prompt_ids) + len(c.response_ids)]) for c in calls]
    lengths = [len(c.response_ids) for c in calls]
    assert mask_runs(SequenceConfig()) == lengths  # every call trains
    assert mask_runs(SequenceConfig(train_tags=("write",))) == [lengths[0], 0, lengths[2]]
    assert mask_runs(SequenceConfig(train_tags=("write",), untagged="skip")) == [lengths[0], 0, 0]
    assert mask_runs(SequenceConfig(train_tags=("check",), untagged="skip")) == [0, lengths[1], 0]
    out = build_sequences(trace("r", calls), SequenceConfig(train_tags=("rewrite",), untagged="skip"))
    assert out.sequences == () and out.untrained_sequences == 1 and out.n_trained_calls == 0


def test_untrained_context_keeps_zero_logprobs_and_the_version_is_the_oldest_trained():
    calls = multi_turn("r", tags=("check", "write", "write"), version=3)
    (seq,) = build_sequences(trace("r", calls), SequenceConfig(train_tags=("write",))).sequences
    assert seq.policy_version == 4  # call 0 (version 3) is context only
    assert all(lp == 0.0 for m, lp in zip(seq.loss_mask, seq.old_logprobs) if not m)


def test_max_length_keeps_the_calls_that_fit_and_counts_the_ones_that_do_not():
    calls = multi_turn("r")
    limit = len(calls[1].prompt_ids) + len(calls[1].response_ids)  # call 2 does not fit
    out = build_sequences(trace("r", calls), SequenceConfig(max_length=limit))
    assert [s.call_indices for s in out.sequences] == [(0, 1)]  # the calls before it still train
    assert out.length_splits == 1 and out.too_long_calls == 1 and out.mismatches == {}
    extra = call("r", 3, calls[2].prompt_ids + calls[2].response_ids + (6, EOT, 5), [46, EOT])
    out = build_sequences(trace("r", calls + [extra]), SequenceConfig(max_length=limit))
    assert [s.call_indices for s in out.sequences] == [(0, 1)] and out.n_merged == 2  # 3 joins 2's sequence
    assert out.length_splits == 1 and out.too_long_calls == 2
    out = build_sequences(trace("r", calls), SequenceConfig(max_length=len(calls[0].prompt_ids) + 1))
    assert out.sequences == () and out.too_long_calls == 3


def test_one_advantage_per_rollout_over_rollouts_not_sequences():
    # rollout a: two sequences (a mismatch), b: one; c: one -- the group's stats are over 3 rollouts
    a0, _, _ = multi_turn("a")
    a1 = call("a", 1, SYS_B + [2, EOT, 5], [70, EOT])
    traces = [trace("a", [a0, a1], reward=1.0), trace("b", multi_turn("b"), reward=0.0),
              trace("c", multi_turn("c")[:1], reward=0.5), trace("d", multi_turn("d"), reward=0.2, group="h"),
              trace("e", multi_turn("e")[:2], reward=0.8, group="h")]
    rows = training_rows(traces, SequenceConfig(), GRPOConfig())
    assert [s.rollout_id for s in rows.sequences] == ["a", "a", "b", "c", "d", "e"]
    by_rollout = {}
    for s, adv in zip(rows.sequences, rows.advantages):
        by_rollout.setdefault(s.rollout_id, set()).add(adv)
    assert all(len(v) == 1 for v in by_rollout.values())  # equal across a rollout's sequences
    rewards = [1.0, 0.0, 0.5]
    mean, std = sum(rewards) / 3, math.sqrt(sum((r - sum(rewards) / 3) ** 2 for r in rewards) / 2)  # torch.std: unbiased
    for rid, r in zip("abc", rewards):
        assert rows.rollout_advantage[rid] == pytest.approx((r - mean) / (std + 1e-6), abs=1e-5)
    assert rows.rollout_advantage["d"] == pytest.approx(-rows.rollout_advantage["e"], abs=1e-5)
    assert rows.rewards == (1.0, 1.0, 0.0, 0.5, 0.2, 0.8) and rows.group_ids == ("g",) * 4 + ("h",) * 2
    dr = training_rows(traces, SequenceConfig(), GRPOConfig(norm_adv_by_std_in_grpo=False))
    assert dr.rollout_advantage["a"] == pytest.approx(1.0 - mean, abs=1e-6)  # Dr.GRPO: centred only


def test_unfinished_rollouts_are_dropped_from_the_group_or_score_zero():
    traces = [trace("a", multi_turn("a"), reward=1.0), trace("b", multi_turn("b"), reward=0.0),
              trace("x", multi_turn("x"), status="expired"), trace("y", [], status="failed")]
    dropped = training_rows(traces, SequenceConfig(unfinished="drop"), GRPOConfig())
    assert {s.rollout_id for s in dropped.sequences} == {"a", "b"}
    assert set(dropped.rollout_advantage) == {"a", "b"}
    assert [r.in_group for r in dropped.rollouts] == [True, True, False, False]  # reported, not lost
    zero = training_rows(traces, SequenceConfig(unfinished="zero"), GRPOConfig())
    assert {s.rollout_id for s in zero.sequences} == {"a", "b", "x"}  # y has no call: no row, still in the group
    assert set(zero.rollout_advantage) == {"a", "b", "x", "y"}
    assert zero.rollout_advantage["x"] == pytest.approx(zero.rollout_advantage["y"])
    assert zero.rollout_advantage["x"] < 0 < zero.rollout_advantage["a"]
    assert rollout_advantages([1.0, 0.0, 0.0, 0.0], ["g"] * 4, GRPOConfig()) == \
        pytest.approx([zero.rollout_advantage[k] for k in "abxy"])


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="untagged"):
        SequenceConfig(untagged="maybe")
    with pytest.raises(ValueError, match="unfinished"):
        SequenceConfig(unfinished="retry")
    with pytest.raises(ValueError, match="train_tags"):
        SequenceConfig(train_tags=())
    with pytest.raises(ValueError, match="train_tags"):
        SequenceConfig(train_tags=["write"])
    with pytest.raises(ValueError, match="max_length"):
        SequenceConfig(max_length=1)
    with pytest.raises(ValueError, match="more than once"):
        training_rows([trace("a", []), trace("a", [])], SequenceConfig(), GRPOConfig())
    with pytest.raises(ValueError, match="prompt"):
        TraceSequence("r", "t", "g", (0,), (1, 2), (1, 1), (-0.1, -0.1), 1, 0)
