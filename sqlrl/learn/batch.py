"""Training batches: SFT conversations and RL trajectories -> right-padded token tensors.

``TokenBatch`` holds ``[B, T]`` tensors, right-padded. Column ``t`` of ``loss_mask`` is 1 when
token ``t`` is a trained target, its log-prob predicted from position ``t - 1`` (so column 0 is
always 0); ``old_logprobs``/``advantages``/``ref_logprobs`` use the same alignment as
``Trajectory.old_logprobs`` (the value *for* token ``t`` sits at column ``t``).

Guarantees:
- Construction checks shapes ([B, T], B >= 1, T >= 1), dtypes (long ids/attention, float masks and
  values, long ``versions [B]``), right padding (every row has a real token, then only padding),
  ``loss_mask`` in {0, 1}, 0 on column 0 and on padding — ``ValueError`` otherwise.
- ``select`` / ``micro_batches`` / ``shard`` keep every field row-aligned and trim the columns
  that are padding in every selected row (values on real tokens never change).
- ``sft_batch`` tokenises a conversation exactly as ``sqlrl.agent.loop`` builds a trajectory:
  ``prompt_ids(messages before the first assistant)``, then per assistant turn the ids of the text
  the chat template writes for it (``tokenizer.encode(text, add_special_tokens=False)``; for a plain
  message that text is its ``content``, for one with ``tool_calls`` it includes the rendered call)
  followed by ``chat_format.turn_end_ids`` — the trained tokens — then ``continuation_ids`` for the
  tool/user messages up to the next assistant turn (not trained). Messages after the last
  assistant turn hold nothing to train and are not tokenised. So an example made from a
  trajectory's messages gives the trajectory's ids whenever its turns ended with the end-of-turn
  ids and were tokenised canonically.
- Too long (``> max_length`` tokens): the example is **dropped** (never cut mid-turn) and one
  ``SFTLengthWarning`` says how many of how many were dropped; ``ValueError`` if none is left.
  ``rl_batch`` never drops: a trajectory longer than ``max_length`` is a ``ValueError``.
- ``rl_batch``'s advantages come from verl's GRPO estimator
  (``core_algos.get_adv_estimator_fn("grpo")``) applied to the full-sequence layout: the
  trajectory's ``loss_mask`` is verl's ``response_mask`` and the scalar reward sits on the last
  generated token, so each sequence's advantage is constant on its generated tokens and 0 elsewhere.
  A trajectory with no generated token still counts in its group's mean and std.
  With ``advantages=`` (one finite number per row, computed by the caller -- e.g. one GRPO advantage
  per traced rollout, shared by all of its sequences: ``sqlrl.gateway.sequences``) that number is the
  row's advantage on its generated tokens (0 elsewhere) and GRPO over the rows is not computed.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Sequence

import torch

from .config import GRPOConfig

ROLES = ("system", "user", "assistant", "tool")
_FLOAT_FIELDS = ("loss_mask", "old_logprobs", "advantages", "ref_logprobs")


class SFTLengthWarning(UserWarning):
    """SFT examples longer than ``max_length`` were dropped from a batch."""


# ------------------------------------------------------------------------------------------------
# SFT examples


@dataclass(frozen=True)
class SFTExample:
    """One conversation to imitate; ``meta`` is carried along untouched (ids, sources)."""

    messages: tuple[dict, ...]
    tools: tuple[dict, ...] | None = None
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.messages, tuple) or not self.messages:
            raise ValueError("SFTExample.messages must be a non-empty tuple of message dicts")
        for i, m in enumerate(self.messages):
            if not isinstance(m, Mapping):
                raise ValueError(f"SFTExample message {i} is {type(m).__name__}, not a dict")
            role = m.get("role")
            if role not in ROLES:
                raise ValueError(f"SFTExample message {i} has role {role!r}; expected one of {', '.join(ROLES)}")
            content = m.get("content")
            if not (isinstance(content, str) or content is None and role == "assistant" and m.get("tool_calls")):
                raise ValueError(f"SFTExample message {i} ({role}) needs a string 'content'")
        if self.tools is not None and (not isinstance(self.tools, tuple)
                                       or not all(isinstance(t, Mapping) for t in self.tools)):
            raise ValueError("SFTExample.tools must be None or a tuple of tool-schema dicts")
        if not isinstance(self.meta, Mapping):
            raise ValueError("SFTExample.meta must be a dict")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "SFTExample":
        if not isinstance(d, Mapping):
            raise ValueError(f"an SFT example must be a JSON object, got {type(d).__name__}")
        unknown = sorted(set(d) - {"messages", "tools", "meta"})
        if unknown:
            raise ValueError(f"an SFT example has unknown key(s) {', '.join(map(repr, unknown))}; "
                             "allowed: 'messages', 'tools', 'meta' (put extra information in 'meta')")
        messages, tools = d.get("messages"), d.get("tools")
        if not isinstance(messages, list):
            raise ValueError("an SFT example needs 'messages': a list of {'role', 'content'} objects")
        if tools is not None and not isinstance(tools, list):
            raise ValueError("an SFT example's 'tools' must be a list of tool schemas or null")
        meta = d.get("meta")
        if meta is not None and not isinstance(meta, Mapping):
            raise ValueError("an SFT example's 'meta' must be an object or null")
        return cls(messages=tuple(dict(m) if isinstance(m, Mapping) else m for m in messages),
                   tools=None if tools is None else tuple(dict(t) if isinstance(t, Mapping) else t for t in tools),
                   meta=dict(meta or {}))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"messages": [dict(m) for m in self.messages],
                               "tools": None if self.tools is None else [dict(t) for t in self.tools]}
        if self.meta:
            out["meta"] = dict(self.meta)
        return out


def read_sft_jsonl(path: str | os.PathLike) -> list[SFTExample]:
    """Every non-blank line of a JSONL file as an ``SFTExample``; a bad line is a ``ValueError`` naming it."""
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                out.append(SFTExample.from_dict(json.loads(line)))
            except ValueError as exc:  # json.JSONDecodeError is a ValueError
                raise ValueError(f"{Path(path)} line {n}: {exc}") from None
    return out


def _assistant_text(chat_format: Any, messages: Sequence[dict], i: int, tools: list | None) -> str:
    """The text the template writes for assistant message ``i`` (before its end-of-turn token)."""
    m = messages[i]
    eot = chat_format.end_of_turn
    if not m.get("tool_calls"):
        text = m["content"]
    else:
        tok = chat_format.tokenizer
        before = tok.apply_chat_template(list(messages[:i]), tools=tools, add_generation_prompt=True,
                                         tokenize=False)
        full = tok.apply_chat_template(list(messages[:i + 1]), tools=tools, add_generation_prompt=False,
                                       tokenize=False)
        if not full.startswith(before):
            raise ValueError(f"message {i}: the chat template does not render the assistant turn after its "
                             "generation prompt, so its text cannot be recovered")
        tail = full[len(before):]
        end = tail.find(eot)
        if end < 0:
            raise ValueError(f"message {i}: the chat template renders the assistant turn without {eot!r}")
        text = tail[:end]
    if eot in text:
        raise ValueError(f"message {i}: the assistant text contains the end-of-turn text {eot!r}")
    return text


def tokenize_sft(example: SFTExample, chat_format: Any) -> tuple[list[int], list[int]]:
    """``(ids, loss_mask)`` of one conversation, built as the agent loop builds a trajectory."""
    tokenizer = getattr(chat_format, "tokenizer", None)
    if tokenizer is None:
        raise ValueError("sft_batch needs a chat format with a .tokenizer (e.g. HFChatFormat)")
    messages = [dict(m) for m in example.messages]
    tools = None if example.tools is None else [dict(t) for t in example.tools]
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    if not turns:
        raise ValueError("an SFT example has no assistant message: nothing to train on")
    if turns[0] == 0:
        raise ValueError("an SFT example starts with an assistant message: it needs a prompt (system/user) first")
    ids = [int(t) for t in chat_format.prompt_ids(messages[:turns[0]], tools)]
    mask = [0] * len(ids)
    for k, i in enumerate(turns):
        text = _assistant_text(chat_format, messages, i, tools)
        target = [int(t) for t in tokenizer.encode(text, add_special_tokens=False)] + list(chat_format.turn_end_ids)
        ids += target
        mask += [1] * len(target)
        if k + 1 < len(turns):
            cont = [int(t) for t in chat_format.continuation_ids(messages[:i + 1], messages[i + 1:turns[k + 1]],
                                                                 tools)]
            ids += cont
            mask += [0] * len(cont)
    return ids, mask


# ------------------------------------------------------------------------------------------------
# The batch


@dataclass(frozen=True, eq=False)
class TokenBatch:
    input_ids: torch.Tensor  # long [B, T]
    attention_mask: torch.Tensor  # long [B, T], 1 on real tokens (a prefix of each row)
    loss_mask: torch.Tensor  # float [B, T]
    old_logprobs: torch.Tensor | None = None  # float [B, T]
    advantages: torch.Tensor | None = None  # float [B, T]
    ref_logprobs: torch.Tensor | None = None  # float [B, T]
    versions: torch.Tensor | None = None  # long [B]: the policy version that generated each row

    def __post_init__(self) -> None:
        ids = self.input_ids
        if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.shape[0] < 1 or ids.shape[1] < 1:
            raise ValueError("TokenBatch.input_ids must be a [B, T] tensor with B >= 1 and T >= 1")
        if ids.dtype != torch.long:
            raise ValueError(f"TokenBatch.input_ids must be long, got {ids.dtype}")
        am = self.attention_mask
        if not isinstance(am, torch.Tensor) or am.shape != ids.shape or am.dtype != torch.long:
            raise ValueError("TokenBatch.attention_mask must be a long tensor shaped like input_ids")
        if ((am != 0) & (am != 1)).any() or not bool(am[:, 0].all()) or bool((am[:, 1:] > am[:, :-1]).any()):
            raise ValueError("TokenBatch.attention_mask must be right padding: 1s (at least one) then 0s")
        for name in _FLOAT_FIELDS:
            t = getattr(self, name)
            if t is None and name != "loss_mask":
                continue
            if not isinstance(t, torch.Tensor) or t.shape != ids.shape or not t.is_floating_point():
                raise ValueError(f"TokenBatch.{name} must be a float tensor shaped like input_ids [B, T]")
        lm = self.loss_mask
        if ((lm != 0) & (lm != 1)).any():
            raise ValueError("TokenBatch.loss_mask holds only 0 and 1")
        if bool(lm[:, 0].any()):
            raise ValueError("TokenBatch.loss_mask column 0 must be 0: the first token has no prediction")
        if bool((lm.bool() & (am == 0)).any()):
            raise ValueError("TokenBatch.loss_mask is 1 on padding")
        v = self.versions
        if v is not None and (not isinstance(v, torch.Tensor) or v.shape != (ids.shape[0],) or v.dtype != torch.long):
            raise ValueError("TokenBatch.versions must be a long tensor of shape [B]")

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def n_tokens(self) -> float:
        """The number of trained tokens."""
        return float(self.loss_mask.sum().item())

    @property
    def n_sequences(self) -> float:
        """The number of rows with at least one trained token."""
        return float((self.loss_mask.sum(-1) > 0).sum().item())

    def _tensors(self) -> dict[str, torch.Tensor | None]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def select(self, rows: Sequence[int]) -> "TokenBatch":
        rows = [int(r) for r in rows]
        if not rows:
            raise ValueError("TokenBatch.select needs at least one row")
        bad = [r for r in rows if not 0 <= r < len(self)]
        if bad:
            raise ValueError(f"TokenBatch.select: row(s) {bad} out of range for a batch of {len(self)}")
        index = torch.tensor(rows, dtype=torch.long, device=self.input_ids.device)
        width = int(self.attention_mask.index_select(0, index).sum(-1).max().item())
        out = {}
        for name, t in self._tensors().items():
            if t is None:
                out[name] = None
            elif name == "versions":
                out[name] = t.index_select(0, index)
            else:
                out[name] = t.index_select(0, index)[:, :width]
        return TokenBatch(**out)

    def micro_batches(self, size: int) -> list["TokenBatch"]:
        """Consecutive chunks of ``size`` rows (the last may be smaller)."""
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"micro-batch size must be a positive int, got {size!r}")
        return [self.select(range(i, min(i + size, len(self)))) for i in range(0, len(self), size)]

    def shard(self, rank: int, world_size: int) -> "TokenBatch":
        """Rows ``rank::world_size``. Every rank must get a row: ``len(self) >= world_size``."""
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size must be a positive int, got {world_size!r}")
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
            raise ValueError(f"rank must be an int in [0, {world_size}), got {rank!r}")
        if len(self) < world_size:
            raise ValueError(f"cannot shard a batch of {len(self)} rows over {world_size} ranks: every rank "
                             "needs at least one row (collect more trajectories per step)")
        return self.select(range(rank, len(self), world_size))

    def with_ref_logprobs(self, ref_logprobs: torch.Tensor) -> "TokenBatch":
        return replace(self, ref_logprobs=ref_logprobs)

    def to(self, device: Any) -> "TokenBatch":
        return TokenBatch(**{k: None if t is None else t.to(device) for k, t in self._tensors().items()})


def _pad(rows: Sequence[Sequence[Any]], width: int, value: Any, dtype: torch.dtype) -> torch.Tensor:
    out = torch.full((len(rows), width), value, dtype=dtype)
    for r, row in enumerate(rows):
        if len(row):
            out[r, :len(row)] = torch.tensor(list(row), dtype=dtype)
    return out


def _check_length(max_length: int | None) -> None:
    if max_length is not None and (isinstance(max_length, bool) or not isinstance(max_length, int)
                                   or max_length < 2):
        raise ValueError(f"max_length must be an int >= 2 or None, got {max_length!r}")


def sft_batch(examples: Sequence[SFTExample], chat_format: Any, *, max_length: int, pad_id: int) -> TokenBatch:
    """Tokenise, drop the examples longer than ``max_length`` (one ``SFTLengthWarning``), right-pad."""
    _check_length(max_length)
    if max_length is None:
        raise ValueError("sft_batch needs max_length")
    examples = list(examples)
    if not examples:
        raise ValueError("sft_batch needs at least one example")
    seqs = [tokenize_sft(e, chat_format) for e in examples]
    kept = [(ids, mask) for ids, mask in seqs if len(ids) <= max_length]
    dropped = len(seqs) - len(kept)
    if not kept:
        raise ValueError(f"every one of the {len(seqs)} SFT examples is longer than max_length={max_length} "
                         f"tokens (shortest: {min(len(s[0]) for s in seqs)})")
    if dropped:
        warnings.warn(f"dropped {dropped} of {len(seqs)} SFT examples longer than max_length={max_length} tokens",
                      SFTLengthWarning, stacklevel=2)
    width = max(len(ids) for ids, _ in kept)
    return TokenBatch(input_ids=_pad([i for i, _ in kept], width, pad_id, torch.long),
                      attention_mask=_pad([[1] * len(i) for i, _ in kept], width, 0, torch.long),
                      loss_mask=_pad([m for _, m in kept], width, 0.0, torch.float32))


def grpo_advantages(loss_mask: torch.Tensor, lengths: Sequence[int], rewards: Sequence[float],
                    group_ids: Sequence[str], cfg: GRPOConfig) -> torch.Tensor:
    """verl's GRPO outcome advantages over the full-sequence layout ``[B, T]`` (see the module doc)."""
    import numpy as np
    from verl.trainer.ppo import core_algos

    token_rewards = torch.zeros_like(loss_mask, dtype=torch.float32)
    for r, (reward, n) in enumerate(zip(rewards, lengths)):
        generated = loss_mask[r].nonzero()
        last = int(generated[-1].item()) if len(generated) else n - 1
        token_rewards[r, last] = float(reward)
    estimator = core_algos.get_adv_estimator_fn("grpo")
    advantages, _ = estimator(token_level_rewards=token_rewards, response_mask=loss_mask,
                              index=np.array(list(group_ids), dtype=object),
                              norm_adv_by_std_in_grpo=cfg.norm_adv_by_std_in_grpo)
    return advantages.float()


def rl_batch(trajectories: Sequence[Any], rewards: Sequence[float], group_ids: Sequence[str], cfg: GRPOConfig, *,
             pad_id: int, max_length: int | None = None,
             advantages: Sequence[float] | None = None) -> TokenBatch:
    """Trajectories (``sqlrl.agent.Trajectory``) + their rewards and GRPO groups -> a batch with advantages
    (GRPO over the rows, or the per-row ``advantages`` given)."""
    _check_length(max_length)
    trajectories, rewards, group_ids = list(trajectories), list(rewards), list(group_ids)
    if not trajectories:
        raise ValueError("rl_batch needs at least one trajectory")
    if not len(trajectories) == len(rewards) == len(group_ids):
        raise ValueError(f"rl_batch got {len(trajectories)} trajectories, {len(rewards)} rewards and "
                         f"{len(group_ids)} group ids; they must match one to one")
    for i, (t, reward, g) in enumerate(zip(trajectories, rewards, group_ids)):
        if not t.token_ids:
            raise ValueError(f"trajectory {i} ({t.task_id}) has no tokens")
        if max_length is not None and len(t.token_ids) > max_length:
            raise ValueError(f"trajectory {i} ({t.task_id}) has {len(t.token_ids)} tokens, more than "
                             f"max_length={max_length}")
        if isinstance(reward, bool) or not isinstance(reward, numbers.Real) or not math.isfinite(reward):
            raise ValueError(f"reward {i} must be a finite number, got {reward!r}")
        if not isinstance(g, str):
            raise ValueError(f"group id {i} must be a str, got {g!r}")
    if advantages is not None:
        advantages = list(advantages)
        if len(advantages) != len(trajectories) or any(
                isinstance(a, bool) or not isinstance(a, numbers.Real) or not math.isfinite(a) for a in advantages):
            raise ValueError(f"rl_batch's advantages must be {len(trajectories)} finite numbers, one per "
                             f"trajectory, got {advantages!r}")
    width = max(len(t.token_ids) for t in trajectories)
    loss_mask = _pad([t.loss_mask for t in trajectories], width, 0.0, torch.float32)
    lengths = [len(t.token_ids) for t in trajectories]
    return TokenBatch(
        input_ids=_pad([t.token_ids for t in trajectories], width, pad_id, torch.long),
        attention_mask=_pad([[1] * n for n in lengths], width, 0, torch.long),
        loss_mask=loss_mask,
        old_logprobs=_pad([t.old_logprobs for t in trajectories], width, 0.0, torch.float32),
        advantages=(grpo_advantages(loss_mask, lengths, rewards, group_ids, cfg) if advantages is None
                    else loss_mask * torch.tensor([float(a) for a in advantages]).unsqueeze(-1)),
        versions=torch.tensor([int(t.policy_version) for t in trajectories], dtype=torch.long))
