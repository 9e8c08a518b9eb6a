"""A rollout's traced calls -> training sequences, and one GRPO advantage per rollout.

An external agent (``examples/``) makes its LLM calls through the gateway, which records each as a
``TracedCall`` (``sqlrl.gateway.trace``: the exact prompt ids, sampled ids, their log-probs). This
module turns a ``RolloutTrace`` into sequences the learner takes (``sqlrl.learn.batch.rl_batch``).

**Merging.** Calls are taken in the order the gateway received them. A call whose prompt ids start
with a sequence's ids so far (the previous call's prompt + response: the usual multi-turn case) is
appended to that sequence: the prompt ids after the sequence's end (the tool result, the next user
turn, the template's turn markers) with loss mask 0, then the call's response. Otherwise the call
starts a new sequence and the **mismatch is counted** with its cause (``MISMATCH_CAUSES``), judged
against the sequence sharing the longest prefix with the prompt (``ids`` = that sequence's ids,
``last`` = its last call's prompt):

- ``repeated_prompt``: the prompt is exactly ``last`` again (a retry, or a resample);
- ``response_rerendered``: the prompt starts with ``last`` but not with the sampled response (the
  agent's history re-renders the assistant turn as other ids: a non-append-only template, a
  re-tokenised or edited response, a tool call written back differently);
- ``different_first_message``: the prompt differs inside the first message (another system prompt:
  another agent role). Needs ``SequenceConfig.turn_end_ids`` (the chat format's end-of-turn ids)
  to find where the first message ends; without them this case is counted as ``history_edited``;
- ``history_edited``: the prompt differs later in the history (messages edited, dropped, reordered).

A merged sequence is as long as its last call (prompt + response). A call whose merge would make
the sequence longer than ``max_length`` is not merged: the sequence so far is kept (its calls still
train) and the call starts a new sequence (counted in ``length_splits``, not a mismatch), which is
itself too long; later calls extending it join it. Sequences longer than ``max_length`` are dropped
and their trained calls counted in ``too_long_calls``. Nothing is dropped without a count.

**Which calls train.** A call trains when its tag is selected (``SequenceConfig.train_tags``: None =
every tagged call; ``untagged``: what an untagged call does). A call that does not train still takes
part in merging (its tokens are context, mask 0); a sequence with no trained token is not emitted
(``untrained_sequences``).

**Token-exactness.** A sequence's ``token_ids`` are its last call's ``prompt_ids`` followed by that
call's ``response_ids``; its trained positions hold exactly the engine's sampled ids with their
sampling log-probs (``old_logprobs``), 0.0 elsewhere. Nothing is re-tokenised.

**Advantages.** One scalar per rollout, shared by all of its trained sequences: verl's GRPO outcome
estimator (``core_algos``, through ``sqlrl.learn.batch.grpo_advantages``) over the rollouts of each
group (``RolloutTrace.group_id``) -- not over sequences, so a rollout with more calls weighs no more
in its group's mean and std. A completed rollout's reward is its trace's. Expired / failed rollouts:
``unfinished="drop"`` leaves them out of their group (no reward, no rows: the group's mean and std are
over the completed rollouts); ``unfinished="zero"`` gives them reward 0.0 in the group and trains
their calls with that advantage. A rollout failed by its task's setup SQL (``RolloutTrace.setup_failed``:
no client ever had it) is out of its group either way. A rollout with no trained sequence (no calls, or none selected)
still counts in its group's mean and std, as ``rl_batch`` counts a trajectory with no generated
token. A group left with one rollout gets verl's group-of-one advantage (its raw reward); filter
such groups with ``sqlrl.learn.groups`` conventions before training if that is not wanted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

from sqlrl.learn.config import GRPOConfig

from .trace import RolloutTrace, TracedCall

MISMATCH_CAUSES = ("repeated_prompt", "response_rerendered", "different_first_message", "history_edited")
UNTAGGED = ("train", "skip")  # what an untagged call does
UNFINISHED = ("drop", "zero")  # what an expired / failed rollout does in its group

__all__ = ["MISMATCH_CAUSES", "UNFINISHED", "UNTAGGED", "RolloutSequences", "SequenceConfig", "TraceRows",
           "TraceSequence", "build_sequences", "rollout_advantages", "training_rows"]


@dataclass(frozen=True)
class SequenceConfig:
    """Which calls train, what unfinished rollouts do, the length limit (see the module doc)."""

    train_tags: tuple[str, ...] | None = None  # None: every tagged call trains; else only these tags
    untagged: str = "train"  # "train" | "skip"
    unfinished: str = "drop"  # "drop" | "zero"
    max_length: int | None = None  # longest sequence (tokens) the learner takes
    turn_end_ids: tuple[int, ...] = ()  # the chat format's end-of-turn ids (finer mismatch causes)

    def __post_init__(self) -> None:
        if self.train_tags is not None and (not isinstance(self.train_tags, tuple) or not self.train_tags
                                            or not all(isinstance(t, str) and t for t in self.train_tags)):
            raise ValueError(f"SequenceConfig.train_tags must be None or a non-empty tuple of tag names, "
                             f"got {self.train_tags!r}")
        if self.untagged not in UNTAGGED:
            raise ValueError(f"SequenceConfig.untagged {self.untagged!r} is not one of {', '.join(UNTAGGED)}")
        if self.unfinished not in UNFINISHED:
            raise ValueError(f"SequenceConfig.unfinished {self.unfinished!r} is not one of {', '.join(UNFINISHED)}")
        if self.max_length is not None and (isinstance(self.max_length, bool) or not isinstance(self.max_length, int)
                                            or self.max_length < 2):
            raise ValueError(f"SequenceConfig.max_length must be an int >= 2 or None, got {self.max_length!r}")
        if not isinstance(self.turn_end_ids, tuple) or not all(isinstance(i, int) for i in self.turn_end_ids):
            raise ValueError(f"SequenceConfig.turn_end_ids must be a tuple of ints, got {self.turn_end_ids!r}")

    def trains(self, tag: str | None) -> bool:
        """Whether a call with this tag trains."""
        if tag is None:
            return self.untagged == "train"
        return self.train_tags is None or tag in self.train_tags


@dataclass(frozen=True)
class TraceSequence:
    """One training row: the fields ``rl_batch`` reads (``token_ids``, ``loss_mask``, ``old_logprobs``,
    ``task_id``, ``policy_version``), and where it came from. Construction checks the layout."""

    rollout_id: str
    task_id: str
    group_id: str
    call_indices: tuple[int, ...]  # the calls merged into it, in order
    token_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]
    old_logprobs: tuple[float, ...]
    prompt_length: int  # the first call's prompt: never trained
    policy_version: int  # the oldest policy version among the trained tokens

    def __post_init__(self) -> None:
        n = len(self.token_ids)
        if not (len(self.loss_mask) == len(self.old_logprobs) == n) or not 0 < self.prompt_length < n:
            raise ValueError("token_ids, loss_mask and old_logprobs need one length, longer than prompt_length > 0")
        if set(self.loss_mask) - {0, 1} or any(self.loss_mask[:self.prompt_length]) or not any(self.loss_mask):
            raise ValueError("loss_mask is 0/1, 0 on the prompt, with at least one trained token")
        if any(lp != 0.0 for m, lp in zip(self.loss_mask, self.old_logprobs) if not m):
            raise ValueError("old_logprobs must be 0.0 where loss_mask is 0")

    @property
    def n_generated(self) -> int:
        return sum(self.loss_mask)


@dataclass(frozen=True)
class RolloutSequences:
    """One rollout's sequences and the counts that say what became of each of its calls."""

    rollout_id: str
    task_id: str
    group_id: str
    status: str
    reward: float | None  # the reward its group uses; None when ``unfinished="drop"`` left it out
    sequences: tuple[TraceSequence, ...]
    n_calls: int
    n_trained_calls: int  # calls whose tag is selected
    n_merged: int  # calls appended to an earlier sequence
    mismatches: Mapping[str, int] = field(default_factory=dict)  # cause -> calls that started a sequence
    length_splits: int = 0  # calls that started a sequence because merging would pass max_length
    too_long_calls: int = 0  # trained calls in sequences dropped for being longer than max_length
    untrained_sequences: int = 0  # sequences with no trained call: not emitted
    n_incomplete: int = 0  # the trace's calls that never finished (not recorded)

    @property
    def in_group(self) -> bool:
        return self.reward is not None


@dataclass(frozen=True)
class TraceRows:
    """One step's learner input: ``rl_batch(sequences, rewards, group_ids, cfg, advantages=advantages)``."""

    sequences: tuple[TraceSequence, ...]
    rewards: tuple[float, ...]  # each sequence's rollout reward
    group_ids: tuple[str, ...]
    advantages: tuple[float, ...]  # each sequence's rollout advantage (equal within a rollout)
    rollouts: tuple[RolloutSequences, ...]  # every trace given, in order (dropped ones too)
    rollout_advantage: Mapping[str, float]  # rollout id -> advantage, for the rollouts in a group


class _Open:
    """A sequence being built."""

    def __init__(self, call: TracedCall, trained: bool) -> None:
        self.ids = list(call.prompt_ids)
        self.mask = [0] * len(self.ids)
        self.logprobs = [0.0] * len(self.ids)
        self.versions: list[int] = []
        self.calls: list[int] = []
        self.prompt_length = len(call.prompt_ids)
        self.last_prompt = len(call.prompt_ids)
        self.trained_calls = 0
        self._respond(call, trained)

    def _respond(self, call: TracedCall, trained: bool) -> None:
        self.ids += call.response_ids
        self.mask += [int(trained)] * len(call.response_ids)
        self.logprobs += list(call.logprobs) if trained else [0.0] * len(call.response_ids)
        if trained:
            self.versions += call.versions
            self.trained_calls += 1
        self.calls.append(call.index)

    def extend(self, call: TracedCall, trained: bool) -> None:
        gap = len(call.prompt_ids) - len(self.ids)
        self.ids += call.prompt_ids[len(self.ids):]
        self.mask += [0] * gap
        self.logprobs += [0.0] * gap
        self.last_prompt = len(call.prompt_ids)
        self._respond(call, trained)


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def _first_message_end(ids: Sequence[int], pattern: tuple[int, ...]) -> int | None:
    """The index just past the first occurrence of ``pattern`` in ``ids`` (None: not found / no pattern)."""
    k = len(pattern)
    if not k:
        return None
    for i in range(len(ids) - k + 1):
        if tuple(ids[i:i + k]) == pattern:
            return i + k
    return None


def _cause(seq: _Open, prompt: Sequence[int], shared: int, turn_end_ids: tuple[int, ...]) -> str:
    """Why ``prompt`` does not extend ``seq`` (``shared`` = their common prefix length)."""
    if tuple(prompt) == tuple(seq.ids[:seq.last_prompt]):
        return "repeated_prompt"
    if shared >= seq.last_prompt:
        return "response_rerendered"
    end = _first_message_end(seq.ids, turn_end_ids)
    if end is not None and shared < end:
        return "different_first_message"
    return "history_edited"


def build_sequences(trace: RolloutTrace, cfg: SequenceConfig, reward: float | None = None) -> RolloutSequences:
    """A rollout's calls -> its sequences and counts (module doc); ``reward`` is recorded as given."""
    open_: list[_Open] = []
    merged = splits = 0
    mismatches: dict[str, int] = {}
    for call in trace.calls:
        trained = cfg.trains(call.tag)
        prompt, limit = call.prompt_ids, cfg.max_length
        shared = [_common_prefix(seq.ids, prompt) for seq in open_]
        extendable = [(n, i) for i, (seq, n) in enumerate(zip(open_, shared)) if n == len(seq.ids)]
        if extendable:  # the longest sequence the prompt extends (the latest on a tie)
            seq = open_[max(extendable)[1]]
            if limit is None or len(prompt) + len(call.response_ids) <= limit or len(seq.ids) > limit:
                seq.extend(call, trained)
                merged += 1
                continue
            splits += 1
        elif open_:  # a mismatch, judged against the sequence sharing the longest prefix (the latest on a tie)
            n, i = max((n, i) for i, n in enumerate(shared))
            cause = _cause(open_[i], prompt, n, cfg.turn_end_ids)
            mismatches[cause] = mismatches.get(cause, 0) + 1
        open_.append(_Open(call, trained))
    sequences, too_long, untrained = [], 0, 0
    for seq in open_:
        if not seq.trained_calls:
            untrained += 1
        elif cfg.max_length is not None and len(seq.ids) > cfg.max_length:
            too_long += seq.trained_calls
        else:
            sequences.append(TraceSequence(
                rollout_id=trace.rollout_id, task_id=trace.task_id, group_id=trace.group_id,
                call_indices=tuple(seq.calls), token_ids=tuple(seq.ids), loss_mask=tuple(seq.mask),
                old_logprobs=tuple(seq.logprobs), prompt_length=seq.prompt_length,
                policy_version=min(seq.versions) if seq.versions else 0))
    return RolloutSequences(
        rollout_id=trace.rollout_id, task_id=trace.task_id, group_id=trace.group_id, status=trace.status,
        reward=reward, sequences=tuple(sequences), n_calls=len(trace.calls),
        n_trained_calls=sum(cfg.trains(c.tag) for c in trace.calls), n_merged=merged,
        mismatches=dict(sorted(mismatches.items())), length_splits=splits, too_long_calls=too_long,
        untrained_sequences=untrained, n_incomplete=trace.n_incomplete)


def _group_reward(trace: RolloutTrace, cfg: SequenceConfig) -> float | None:
    if trace.status == "completed":
        return float(trace.reward)
    if trace.setup_failed:  # no client ever had it: nobody's outcome, out of its group whatever ``unfinished``
        return None
    return 0.0 if cfg.unfinished == "zero" else None


def rollout_advantages(rewards: Sequence[float], group_ids: Sequence[str], loss: GRPOConfig) -> list[float]:
    """verl's GRPO outcome advantage of each rollout against its group."""
    import torch

    from sqlrl.learn.batch import grpo_advantages

    n = len(rewards)
    if not n:
        return []
    adv = grpo_advantages(torch.ones((n, 1)), [1] * n, list(rewards), list(group_ids), loss)
    return [float(a) for a in adv[:, 0]]


def training_rows(traces: Sequence[RolloutTrace], cfg: SequenceConfig, loss: GRPOConfig) -> TraceRows:
    """A step's traces -> learner rows with one advantage per rollout (module doc). Rollout ids must
    be distinct. ``loss`` is the ``GRPOConfig`` (``norm_adv_by_std_in_grpo``)."""
    ids = [t.rollout_id for t in traces]
    if len(set(ids)) != len(ids):
        raise ValueError(f"training_rows got a rollout more than once: {sorted({i for i in ids if ids.count(i) > 1})}")
    rollouts = [build_sequences(t, cfg, _group_reward(t, cfg)) for t in traces]
    grouped = [r for r in rollouts if r.in_group]
    advantages = rollout_advantages([r.reward for r in grouped], [r.group_id for r in grouped], loss)
    by_rollout = {r.rollout_id: a for r, a in zip(grouped, advantages)}
    rows = [(s, r) for r in grouped for s in r.sequences]
    return TraceRows(sequences=tuple(s for s, _ in rows), rewards=tuple(float(r.reward) for _, r in rows),
                     group_ids=tuple(r.group_id for _, r in rows),
                     advantages=tuple(by_rollout[r.rollout_id] for _, r in rows),
                     rollouts=tuple(rollouts), rollout_advantage=by_rollout)
