"""The gateway's journal: what a restarted gateway needs so that no completed rollout is lost (Ray-free).

``Rollouts`` (``sqlrl.gateway.rollouts``) keeps its state in its process. With a ``Journal`` it
also appends one JSON line per state change to a file (``<run_dir>/gateway_journal.jsonl`` in the
host), each written and ``fsync``'d before the change is answered:

- ``offer``  ``{group_id, task, n, token}`` (the task's record, of any kind: ``Task.to_dict``, read back
  with ``sqlrl.tasks.kinds.task_from_dict``, so a critic task stays one; ``token``: the
  driver's idempotency key, or None -- an offer repeated with a token already journalled is a no-op)
- ``claim``  ``{rollout_id, group_id, task_id, key, session}`` (``key``: the API key's SHA-256, never
  the key; ``session``: the session's record when the source is ``DurableSessions`` -- a pool lease --
  else None)
- ``end``    ``{trace, key}`` (the whole ``RolloutTrace``: calls, token ids, log-probs, reward); for a
  rollout lost at a restart also ``session_released`` (True / False, None: no record); for a
  rollout never claimed -- its task's setup SQL failed (``failure: setup-failed``) -- ``key`` None
  and ``unclaimed: true``: it takes one waiting rollout of its group and task off, as a claim does
- ``drain``  ``{ids, token}`` (traces handed to the job: not handed out again; a drain repeated with
  the last drain's ``token`` gets the same traces again, so a reply lost with a dead process is not)
- ``weights`` ``{version}`` (the policy version the engine serves after an update: a restarted
  gateway whose journal names a version > 0 has only the start weights and holds its calls until the
  job restores them)
- ``finish`` ``{}``
- ``serve``  ``{port}`` (the port the gateway serves on: a restarted gateway binds it again)

``replay(path)`` reads it back as a ``Replayed`` state. Guarantees:
- Any record can be written: lines are ASCII JSON (non-ASCII text escaped), so a string no UTF-8
  can encode (a client's lone surrogate) is journalled and replayed as it was, never an error that
  would leave a rollout half ended.
- Every rollout that ended (completed, expired, failed) before the crash and was not drained comes
  back whole, in the order it ended: its trace is the one recorded, byte for byte the same ids.
- Rollouts offered and neither claimed nor ended unclaimed wait again, in offer order. Rollouts claimed and not ended
  (their client was mid-rollout when the gateway died) are ``lost``: the restarted gateway ends
  them ``expired`` with the cause ``RESTART_CAUSE`` and ``lost=LostReason.GATEWAY_RESTART`` (their
  calls were in the dead process's memory; their clients get 409, as for any ended rollout), and
  releases their sessions where the claim named one (``Replayed.lost`` keeps the claim records;
  ``lost_ends`` gives their traces and what was released: ``Rollouts.restored_released`` counts
  those it ended). A lease granted and not yet journalled when the process died is left to the
  pool's lease TTL.
- ``Replayed.offer_tokens`` / ``last_drain`` / ``version``: the offers' idempotency keys, the last
  drain (its token and traces) and the last ``weights`` version (0: never updated).
- ``Replayed.port`` is the last ``serve`` record's port (None before any): the address clients
  hold stays the gateway's across restarts.
- A crash in the middle of a write leaves at most a torn last line: it is skipped and counted
  (``Replayed.torn``), and cut off when a ``Journal`` reopens the file to append. A line that does not parse anywhere else is corruption: ``JournalError``
  naming the line, nothing restored.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlrl.tasks.kinds import task_from_dict

from .trace import LostReason, RolloutTrace

__all__ = ["JOURNAL_FILE", "RESTART_CAUSE", "Journal", "JournalError", "Replayed", "key_digest", "lost_ends", "replay"]

JOURNAL_FILE = "gateway_journal.jsonl"
RESTART_CAUSE = "the gateway restarted while this rollout was live: its calls in flight were lost"


def key_digest(key: str) -> str:
    """What the journal (and the rollouts' record of ended rollouts) keeps of an API key."""
    return hashlib.sha256(key.encode()).hexdigest()


class JournalError(ValueError):
    """The journal is corrupt (a bad line that is not the torn last one)."""


class Journal:
    """Append-only JSONL at ``path``, one ``fsync``'d line per record; thread-safe (one writer process)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        if self.path.is_file():  # a torn last line (a crash mid-write) is cut before appending after it
            data = self.path.read_bytes()
            if data and not data.endswith(b"\n"):
                with open(self.path, "r+b") as f:
                    f.truncate(data.rfind(b"\n") + 1)

    def append(self, kind: str, **fields: Any) -> None:
        """One record, on disk (``fsync``) when this returns. The file is opened per record, so a
        journal holds no handle between records and never needs closing."""
        # ASCII: text a client sent (a final SQL, an error quoting it) may hold a lone surrogate, which
        # UTF-8 cannot write -- escaped (``\\ud800``), it reads back as the same string
        line = json.dumps({"kind": kind, **fields}, ensure_ascii=True, separators=(",", ":"))
        with self._lock, open(self.path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())


@dataclass
class Replayed:
    """A journal's state (module docstring)."""

    waiting: deque = field(default_factory=deque)  # (group_id, task record), in offer order
    lost: list[dict[str, Any]] = field(default_factory=list)  # claim records never ended
    ended: list[RolloutTrace] = field(default_factory=list)  # not drained, in the order they ended
    done: dict[str, str] = field(default_factory=dict)  # every ended rollout id -> its key's digest
    counts: dict[str, int] = field(default_factory=dict)  # claimed / completed / expired / failed / lost / setup_failed
    finished: bool = False
    torn: int = 0  # a torn last line, skipped
    port: int | None = None  # the port the last gateway on this journal served on
    offer_tokens: set[str] = field(default_factory=set)  # idempotency keys of the offers journalled
    last_drain: tuple[str | None, list[RolloutTrace]] = field(default_factory=lambda: (None, []))  # token, traces
    version: int = 0  # the policy version of the last ``weights`` record (0: the start weights)


def _records(path: Path) -> tuple[list[dict[str, Any]], int]:
    lines = path.read_text(encoding="utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    out, torn = [], 0
    for i, line in enumerate(lines):
        try:
            rec = json.loads(line)
            if not isinstance(rec, dict) or "kind" not in rec:
                raise ValueError("not a record")
        except ValueError as exc:
            if i == len(lines) - 1:
                torn += 1  # the write the crash interrupted
                continue
            raise JournalError(f"{path}: line {i + 1} is not a journal record ({exc})") from None
        out.append(rec)
    return out, torn


def _take_waiting(state: Replayed, path: Path, group_id: str, task_id: str, rollout_id: str) -> None:
    """The first waiting rollout of ``group_id`` and ``task_id`` off ``state.waiting``."""
    for i, (group, task) in enumerate(state.waiting):
        if group == group_id and task_from_dict(task).task_id == task_id:  # any kind's record
            del state.waiting[i]
            return
    raise JournalError(f"{path}: {rollout_id} matches no offered rollout waiting")


def replay(path: str | os.PathLike) -> Replayed:
    """The state recorded in ``path`` (an absent file: the empty state)."""
    path = Path(path)
    state = Replayed(counts=dict.fromkeys(("claimed", "completed", "expired", "failed", "lost", "setup_failed"), 0))
    if not path.is_file():
        return state
    records, state.torn = _records(path)
    live: dict[str, dict[str, Any]] = {}
    ended: dict[str, RolloutTrace] = {}
    for rec in records:
        kind = rec["kind"]
        if kind == "offer":
            state.waiting.extend([(rec["group_id"], rec["task"])] * int(rec["n"]))
            if rec.get("token") is not None:
                state.offer_tokens.add(rec["token"])
        elif kind == "claim":
            _take_waiting(state, path, rec["group_id"], rec["task_id"], rec["rollout_id"])
            live[rec["rollout_id"]] = rec
            state.counts["claimed"] += 1
        elif kind == "end":
            trace = RolloutTrace.from_dict(rec["trace"])
            if rec.get("unclaimed"):  # never claimed (its task's setup failed): off the waiting list
                _take_waiting(state, path, trace.group_id, trace.task_id, trace.rollout_id)
            live.pop(trace.rollout_id, None)
            ended[trace.rollout_id] = trace
            state.done[trace.rollout_id] = rec["key"]
            state.counts[trace.status] += 1
            state.counts["lost"] += trace.lost is not None
            state.counts["setup_failed"] += trace.setup_failed
        elif kind == "drain":
            state.last_drain = (rec.get("token"), [ended.pop(rid) for rid in rec["ids"] if rid in ended])
        elif kind == "weights":
            state.version = int(rec["version"])
        elif kind == "finish":
            state.finished = True
        elif kind == "serve":
            state.port = int(rec["port"])
        else:
            raise JournalError(f"{path}: unknown record kind {kind!r}")
    state.ended, state.lost = list(ended.values()), list(live.values())
    return state


def lost_ends(state: Replayed, durable: Any) -> list[tuple[RolloutTrace, str, bool | None]]:
    """The rollouts live when the journal's gateway died (``state.lost``), each ended ``expired``
    with ``RESTART_CAUSE`` and ``lost=LostReason.GATEWAY_RESTART``: ``(trace, key digest, released)``,
    ``released`` whether this call released its session (``durable.release_records`` on the
    sessions the claims name; None: the claim named none, or ``durable`` is None)."""
    held = [rec for rec in state.lost if rec.get("session") is not None]
    ended = durable.release_records([r["session"] for r in held]) if held and durable is not None else []
    released = {r["rollout_id"]: bool(e) for r, e in zip(held, ended)}
    return [(RolloutTrace(rollout_id=rec["rollout_id"], task_id=rec["task_id"], group_id=rec["group_id"], calls=(),
                          status="expired", error=RESTART_CAUSE, lost=LostReason.GATEWAY_RESTART),
             rec["key"], released.get(rec["rollout_id"])) for rec in state.lost]
