"""The gateway's ledger of ended rollouts and its counters (Ray-free; ``Rollouts`` owns one, under its lock).

``Ended`` keeps what the job has not yet drained and what a client may still be told. Guarantees:

- ``add(trace, owner)``: an ended rollout's trace is kept until a ``drain`` hands it out, in the
  order they ended; ``owner`` (the API key's digest, None for a rollout no client ever had -- a
  setup failure) is remembered for good, so the owner's later requests get 409 and anyone else's
  404 (``owned``). The counters follow from the trace alone: ``completed`` / ``expired`` /
  ``failed`` by its status, ``lost`` (a restart ended it), ``setup_failed`` (its task's setup SQL
  failed), ``prefix_mismatches`` as given -- the same counts a journal replay gives.
- ``drain(token)`` hands each kept trace out once; the same ``token`` as the last drain's gets
  that drain's traces again (a driver repeating a call whose answer it lost) and nothing new.
- ``call(captured)`` counts a call settled: ``calls`` and its tokens when recorded whole,
  ``incomplete`` when abandoned (None); ``incomplete(n)`` counts calls cut off by their rollout's end.
- ``counts`` has every ``COUNTS`` key, as ``GatewayStats`` fields.

Not thread-safe by itself.
"""

from __future__ import annotations

from typing import Any

from .capture import CapturedCall
from .trace import RolloutTrace

__all__ = ["COUNTS", "Ended"]

COUNTS = ("claimed", "completed", "expired", "failed", "calls", "incomplete", "prompt_tokens",
          "generated_tokens", "prefix_mismatches", "lost", "setup_failed")


class Ended:
    def __init__(self) -> None:
        self.traces: list[RolloutTrace] = []  # ended, not yet drained
        self.owners: dict[str, str | None] = {}  # every ended rollout id -> its key's digest
        self.counts: dict[str, int] = dict.fromkeys(COUNTS, 0)
        self.last_drain: tuple[str | None, list[RolloutTrace]] = (None, [])

    def restore(self, state: Any) -> None:
        """A journal's ``Replayed`` state: its traces not drained, owners, counts, last drain."""
        self.traces, self.owners, self.last_drain = list(state.ended), dict(state.done), state.last_drain
        self.counts.update(state.counts)

    def add(self, trace: RolloutTrace, owner: str | None, mismatches: int = 0) -> None:
        self.traces.append(trace)
        self.owners[trace.rollout_id] = owner
        self.counts[trace.status] += 1
        self.counts["lost"] += trace.lost is not None
        self.counts["setup_failed"] += trace.setup_failed
        self.counts["prefix_mismatches"] += mismatches

    def owned(self, rollout_id: str, owner: str) -> bool:
        """Whether ``rollout_id`` ended and belonged to ``owner``."""
        return rollout_id in self.owners and self.owners[rollout_id] == owner

    def drain(self, token: str | None) -> tuple[list[RolloutTrace], bool]:
        """``(traces, new)``: ``new`` is False for a repeat of the last drain (nothing to journal)."""
        if token is not None and self.last_drain[0] == token:
            return list(self.last_drain[1]), False
        out, self.traces = self.traces, []
        self.last_drain = (token, out)
        return list(out), bool(out)

    def call(self, captured: CapturedCall | None) -> None:
        if captured is None:
            self.counts["incomplete"] += 1
            return
        self.counts["calls"] += 1
        self.counts["prompt_tokens"] += len(captured.prompt_ids)
        self.counts["generated_tokens"] += len(captured.generation.token_ids)

    def incomplete(self, n: int) -> None:
        self.counts["incomplete"] += n
