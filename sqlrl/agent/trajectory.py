"""A finished rollout as a value: messages, exact token ids, loss mask, behaviour log-probs, timings.

Guarantees:
- ``Trajectory`` and ``Turn`` are frozen dataclasses of plain values (tuples, str, int, float,
  JSON-ready message dicts): picklable, safe across Ray boundaries; ``to_dict``/``from_dict``
  round-trip exactly (JSON-serialisable).
- ``token_ids == prompt ids + gen_1 + cont_1 + gen_2 + ...`` (see ``chat_format``): ``loss_mask``
  is 1 exactly on the model-generated ids, ``old_logprobs[i]`` is the backend's log-probability
  for ``token_ids[i]`` there and 0.0 elsewhere; the three have the same length and the first
  ``prompt_length`` entries are the prompt (mask 0). Construction checks this.
- ``messages`` is the conversation the ids represent: the prompt, then per turn the assistant
  message and (unless the trajectory ended on that turn) the tool message the model read next.
- ``token_versions`` (set when some generated token is not of ``policy_version``) holds, per token, the policy version whose
  weights generated it (-1 where the model did not generate): under a ``continue`` weight update a
  trajectory can mix versions, and the learner masks the stale ones (``sqlrl.rl.staleness``).
- ``stop_reason`` is one of ``STOP_REASONS``; ``error`` holds the message when it is ``"error"``
  or ``"timeout"``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from .chat_format import ChatFormat

STOP_REASONS = ("submitted", "max_turns", "token_budget", "single_turn", "timeout", "error")


@dataclass(frozen=True)
class Turn:
    gen_ms: float  # the batched generation call's wall time (shared by every trajectory in it)
    tool_ms: float  # this turn's tool call (0.0 when nothing ran)
    gen_tokens: int
    call: str | None  # the tool called, None when the turn was malformed (or single-turn)
    error: str | None  # the parser's / tool's error message, None when the turn went fine
    finish_reason: str = ""  # the backend's: "stop" | "length" | "eos"


@dataclass(frozen=True)
class Trajectory:
    task_id: str
    mode: str
    messages: tuple[dict[str, Any], ...]
    token_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]
    old_logprobs: tuple[float, ...]
    prompt_length: int
    turns: tuple[Turn, ...]
    n_tool_calls: int  # valid calls run (execute_sql and submit_solution)
    n_tool_errors: int  # valid execute_sql calls whose SQL failed
    n_malformed: int  # turns the parser (or the single-turn format check) rejected
    submitted_sql: str | None
    stop_reason: str
    policy_version: int = 0
    error: str | None = None
    # per token: the policy version whose weights generated it (-1 on ids the model did not
    # generate); () when every generated token is of ``policy_version`` (the usual case)
    token_versions: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        n = len(self.token_ids)
        if len(self.loss_mask) != n or len(self.old_logprobs) != n:
            raise ValueError(f"token_ids ({n}), loss_mask ({len(self.loss_mask)}) and old_logprobs "
                             f"({len(self.old_logprobs)}) must have the same length")
        if not 0 <= self.prompt_length <= n or any(self.loss_mask[:self.prompt_length]):
            raise ValueError("the first prompt_length tokens must exist and be masked out")
        if any(m not in (0, 1) for m in self.loss_mask):
            raise ValueError("loss_mask holds only 0 and 1")
        if any(lp != 0.0 for m, lp in zip(self.loss_mask, self.old_logprobs) if not m):
            raise ValueError("old_logprobs must be 0.0 where loss_mask is 0")
        if self.token_versions and len(self.token_versions) != n:
            raise ValueError(f"token_versions ({len(self.token_versions)}) must be empty or as long as "
                             f"token_ids ({n})")
        if self.stop_reason not in STOP_REASONS:
            raise ValueError(f"stop_reason {self.stop_reason!r} is not one of {STOP_REASONS}")

    @property
    def n_generated(self) -> int:
        return sum(self.loss_mask)

    def versions(self) -> tuple[int, ...]:
        """The policy version of every token (``token_versions``, or ``policy_version`` on every
        generated token when the engine reported none; -1 on the others)."""
        if self.token_versions:
            return self.token_versions
        return tuple(self.policy_version if m else -1 for m in self.loss_mask)

    def tool_calls(self) -> list[dict[str, Any]]:
        """The valid tool calls, in order, as ``{"name", "arguments"}`` dicts (agentic rewards' input)."""
        return [tc["function"] for m in self.messages if m.get("role") == "assistant"
                for tc in m.get("tool_calls", ()) or ()]

    def final_text(self) -> str:
        """The last assistant message's text (single-turn rewards' input; "" when there is none)."""
        for m in reversed(self.messages):
            if m.get("role") == "assistant":
                return str(m.get("content") or "")
        return ""

    def response(self) -> Any:
        """What a reward of this trajectory's mode scores: tool calls (agentic) or the text (single)."""
        return self.tool_calls() if self.mode == "agentic" else self.final_text()

    def render(self, chat_format: ChatFormat) -> str:
        """The whole trajectory as the model saw and wrote it (decoded ids)."""
        return chat_format.decode(self.token_ids)

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["messages"] = [dict(m) for m in self.messages]
        d["turns"] = [asdict(t) for t in self.turns]
        for key in ("token_ids", "loss_mask", "old_logprobs", "token_versions"):
            d[key] = list(d[key])
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Trajectory":
        d = dict(d)
        d["messages"] = tuple(dict(m) for m in d["messages"])
        d["turns"] = tuple(Turn(**t) for t in d["turns"])
        d["token_ids"] = tuple(int(i) for i in d["token_ids"])
        d["loss_mask"] = tuple(int(i) for i in d["loss_mask"])
        d["old_logprobs"] = tuple(float(x) for x in d["old_logprobs"])
        d["token_versions"] = tuple(int(v) for v in d.get("token_versions", ()))
        return cls(**d)
