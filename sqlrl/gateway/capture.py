"""What the gateway takes from one OpenAI call: its tag, and the engine's tokens copied into a
``TracedCall`` (Ray-free, model-free).

- ``call_tag(body, header)``: the agent role that made a call. Precedence (first that is set wins):
  1. ``metadata.tag`` in the request body (OpenAI's ``metadata``: a map of strings; per call),
  2. the header ``X-Sqlrl-Tag`` (often set once per client: ``default_headers``),
  3. the OpenAI ``user`` field (a general-purpose field many clients fill with an end-user id, so
     it comes last).
  None when none is set. A tag is 1..64 characters of letters, digits and ``_ . : / -``;
  anything else (and a ``metadata`` that is not a map of strings) is a ``ValueError`` naming the
  field (the app answers 400).
- ``CapturedCall``: one finished call as the gateway stores it until its rollout ends: the
  prompt ids the engine generated from and the engine's ``Generation``, kept as given.
  ``traced(rollout_id, index)`` copies the ids, log-probs and versions into a ``TracedCall``:
  nothing is decoded or re-tokenised.
- ``extends(previous, prompt_ids)``: whether a call's prompt starts with the previous call's prompt
  + response ids (the append-only multi-turn case); the gateway counts the calls for which it does
  not (``prefix_mismatches``), the training side splits sequences there (``trace.py``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from sqlrl.policy.types import Generation

from .trace import TracedCall

TAG_HEADER = "x-sqlrl-tag"
_TAG = re.compile(r"^[A-Za-z0-9_.:/-]{1,64}$")


def _checked(value: Any, where: str) -> str:
    if not isinstance(value, str) or not _TAG.match(value):
        raise ValueError(f"{where}: a tag is 1-64 characters of letters, digits and _ . : / -, "
                         f"got {value!r}")
    return value


def call_tag(body: Mapping[str, Any], header: str | None) -> str | None:
    """The call's tag (module docstring: precedence and rules)."""
    metadata = body.get("metadata")
    if metadata is not None:
        if not isinstance(metadata, Mapping) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise ValueError("metadata: must be an object of string values")
        if "tag" in metadata:
            return _checked(metadata["tag"], "metadata.tag")
    if header is not None:
        return _checked(header.strip(), "X-Sqlrl-Tag")
    user = body.get("user")
    if user is not None:
        return _checked(user, "user")
    return None


@dataclass(frozen=True)
class CapturedCall:
    """A finished call: ``seq`` is the order the gateway received it in its rollout."""

    seq: int
    tag: str | None
    prompt_ids: tuple[int, ...]
    generation: Generation

    def traced(self, rollout_id: str, index: int) -> TracedCall:
        g = self.generation
        return TracedCall(rollout_id=rollout_id, index=index, tag=self.tag, prompt_ids=self.prompt_ids,
                          response_ids=tuple(g.token_ids), logprobs=tuple(g.logprobs),
                          versions=tuple(g.versions), finish_reason=g.finish_reason)


def extends(previous: CapturedCall | None, prompt_ids: Sequence[int]) -> bool:
    """True when ``prompt_ids`` starts with ``previous``'s prompt + response ids (or there is no
    previous call)."""
    if previous is None:
        return True
    head = previous.prompt_ids + tuple(previous.generation.token_ids)
    return len(prompt_ids) >= len(head) and tuple(prompt_ids[:len(head)]) == head
