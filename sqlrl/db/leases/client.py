"""PoolClient: what a rollout worker or the reward actors hold to lease sessions from the DB-session
pool's shards (Ray-free; the shards are reached through a ``Transport``).

The client owns every rule of the caller's side of the lease protocol (docs/pool.md):

- **One request type**: every lease call takes the caller's ``SessionRequest`` and sends it on
  unchanged but for ``key`` (a fresh one when None) and ``worker_id`` (this client's when None).
- **Routing**: a request goes to one of this caller's own shards, ``PartitionPlan.pick`` (crc32
  of the key, e.g. the trajectory id, over the caller's shards of the dialect's group).
- **Retry with back-off**: ``lease`` retries a shard that refused as full (``capacity``) or did
  not answer (``shard-unavailable``: dead, restarting) until ``lease_wait_s``; nothing was granted
  by a refused attempt, so retrying cannot leak. Any other refusal is raised at once.
- **Batches**: ``lease_many`` / ``execute_many`` / ``release_many`` send one call per shard
  involved; results keep call order. ``lease_many`` is all or nothing: when any request is refused
  for a reason other than the retried ones, everything granted is released and the error raised.
- **Never raises where the protocol says so**: ``execute``/``execute_many`` return a typed
  ``session-lost`` result for a shard that does not answer within ``call_timeout_s`` or a lease
  of a shard this caller does not route to; ``release``/``release_many`` return False.

A ``Transport`` starts a call on a shard and resolves it. Calls are typed: the operation is a
``ShardCore`` method (``ShardCore.submit_many``), not a name string. ``LocalTransport`` (here)
runs ShardCores in this process and returns completed Futures; ``actors/db_pool.py`` supplies
the Ray transport (actor handles, ObjectRefs). Nothing here imports Ray.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterator, Mapping, Protocol, Sequence

from .protocol import ExecuteRequest, Lease, LeaseError, LeaseErrorKind
from .partition import PartitionPlan
from .shard import ShardCore
from ..types import ErrorKind, QueryResult, SessionRequest
from ..url import dialect_name, parse_url

# Lease refusals that pass: a full shard, or one that died and is being restarted (nothing was
# granted, so retrying cannot leak). lease() retries them until lease_wait_s.
RETRIED = (LeaseErrorKind.CAPACITY, LeaseErrorKind.SHARD_UNAVAILABLE)
Op = Callable[..., Any]  # a ShardCore method, called as op(shard, *args)


class ShardUnreachable(Exception):
    """A transport's answer when a shard gave no value: it died, is restarting, did not answer
    in time, or the call failed inside it for a reason that is not a ``LeaseError``."""


class Transport(Protocol):
    """How a client reaches its shards."""

    def send(self, shard_id: str, op: Op, *args: Any) -> Any:
        """Start ``op(shard, *args)`` on shard ``shard_id``; return a handle at once."""

    def result(self, handle: Any, timeout_s: float) -> Any:
        """The call's value. Re-raises a ``LeaseError`` the call raised; raises
        ``ShardUnreachable`` when the shard gave no value within ``timeout_s``."""


class LocalTransport:
    """ShardCores in this process: the call runs at once; the handle is a completed Future."""

    def __init__(self, shards: Mapping[str, ShardCore]) -> None:
        self.shards = dict(shards)

    def send(self, shard_id: str, op: Op, *args: Any) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        try:
            future.set_result(op(self.shards[shard_id], *args))
        except Exception as exc:  # a LeaseError, delivered by result() as a remote call would
            future.set_exception(exc)
        return future

    def result(self, handle: concurrent.futures.Future, timeout_s: float) -> Any:
        return handle.result(timeout_s)


class PoolClient:
    """Routes one caller's lease protocol calls to its own shards (see the module doc).

    Picklable when its transport is (the Ray transport is: actor handles), so a job creates it
    and passes it to a rollout worker or reward actor. ``on_lease_wait(role, ms)`` is told how
    long each granted ``lease``/``lease_many`` took, retries included (a metric)."""

    def __init__(self, plan: PartitionPlan, shards: Sequence[str], role: str, worker: int | None,
                 transport: Transport, *, call_timeout_s: float = 60.0, lease_wait_s: float = 30.0,
                 on_lease_wait: Callable[[str, float], None] | None = None) -> None:
        self.plan = plan
        self.shards = tuple(shards)
        self.role = role
        self.worker = worker
        self.worker_id = f"{role}-{worker}" if role == "rollout" else role
        self.transport = transport
        self.call_timeout_s = call_timeout_s
        self.lease_wait_s = lease_wait_s
        self.on_lease_wait = on_lease_wait
        self._keys = 0

    # -- blocking ----------------------------------------------------------------------------------

    def lease(self, request: SessionRequest) -> Lease:
        """Lease a session on ``request.db`` (catalog id or URL). ``request.key`` (e.g. the
        trajectory id) picks among this caller's shards. Retries a full or restarting shard until
        ``lease_wait_s``; raises ``LeaseError`` otherwise."""
        since = time.monotonic()
        lease = self._lease_retrying(self._route(request))
        self._waited(since)
        return lease

    def execute(self, lease: Lease, sql: str) -> QueryResult:
        """Never raises: a dead shard or lease is a ``session-lost``/``lease-expired`` result."""
        return self._get(self.execute_async(lease, sql), lease_error=False)

    def renew(self, lease: Lease) -> Lease:
        return self._get(self.renew_async(lease), lease_error=True)

    def release(self, lease: Lease) -> bool:
        """Idempotent; never raises. False when the lease had already ended (or died with its
        shard)."""
        try:
            return bool(self._get(self.release_async(lease), lease_error=True))
        except LeaseError:
            return False

    @contextlib.contextmanager
    def session(self, request: SessionRequest) -> Iterator["LeasedSession"]:
        """``with client.session(SessionRequest("concert_singer", "sqlite", key=traj_id)) as s:``"""
        lease = self.lease(request)
        try:
            yield LeasedSession(self, lease)
        finally:
            self.release(lease)

    def lease_many(self, requests: Sequence[SessionRequest]) -> list[Lease]:
        """Lease sessions for a batch of trajectories, one per request, with one call per shard;
        requests refused as full or restarting are retried one by one (``lease``). Raises
        ``LeaseError`` for any other refusal, after releasing what was granted."""
        since = time.monotonic()
        routed = [self._route(request) for request in requests]
        by_shard: dict[str, list[int]] = {}
        for i, (_, shard) in enumerate(routed):
            by_shard.setdefault(shard, []).append(i)
        sent = [(self.transport.send(shard, ShardCore.lease_many,
                                     tuple(routed[i][0] for i in idx)), idx)
                for shard, idx in by_shard.items()]
        out: list[Any] = [None] * len(requests)
        for handle, idx in sent:
            try:
                values = self._get(handle, lease_error=True)
            except LeaseError as exc:  # the shard did not answer
                values = [exc] * len(idx)
            for i, v in zip(idx, values):
                out[i] = v
        try:
            for i, v in enumerate(out):
                if isinstance(v, LeaseError):
                    if v.kind not in RETRIED:
                        raise LeaseError(v.kind, v.message)
                    out[i] = self._lease_retrying(routed[i])
        except LeaseError:
            self.release_many([v for v in out if isinstance(v, Lease)])
            raise
        self._waited(since)
        return out

    def execute_many(self, calls: Sequence[tuple[Lease, str]]) -> list[QueryResult]:
        """Run ``(lease, sql)`` calls of many trajectories with one call per shard (a rollout
        worker's turn). Results in call order; never raises (as ``execute``)."""
        return self.resolve_many(self.execute_many_async(calls))

    def release_many(self, leases: Sequence[Lease]) -> list[bool]:
        """``release`` for many leases, one call per shard; never raises."""
        out = [False] * len(leases)
        for handle, idx in self._per_shard(leases, ShardCore.release_many, lambda lease: lease):
            try:
                values = self._get(handle, lease_error=True)
            except LeaseError:
                continue  # a dead shard took the sessions with it
            for i, v in zip(idx, values):
                out[i] = bool(v)
        return out

    # -- handle-returning (an ObjectRef with the Ray transport, a completed Future in-process) -----

    def lease_async(self, request: SessionRequest) -> Any:
        """One attempt (no capacity retry); a refusal is raised by ``resolve``."""
        request, shard = self._route(request)
        return self.transport.send(shard, ShardCore.lease, request)

    def execute_async(self, lease: Lease, sql: str) -> Any:
        return self._send(lease, ShardCore.submit, ExecuteRequest(lease, sql))

    def renew_async(self, lease: Lease) -> Any:
        return self._send(lease, ShardCore.renew, lease)

    def release_async(self, lease: Lease) -> Any:
        return self._send(lease, ShardCore.release, lease)

    def execute_many_async(self, calls: Sequence[tuple[Lease, str]]) -> "PendingBatch":
        """One ``submit_many`` call per shard involved; ``PendingBatch.refs`` are the handles
        (ObjectRefs for ``ray.wait``), ``resolve_many`` assembles the results in call order."""
        parts = self._per_shard([lease for lease, _ in calls], ShardCore.submit_many,
                                lambda i: ExecuteRequest(*calls[i]), by_index=True)
        return PendingBatch(len(calls), tuple(parts))

    def resolve_many(self, pending: "PendingBatch") -> list[QueryResult]:
        out: list[QueryResult | None] = [None] * pending.size
        for handle, idx in pending.parts:
            results = self._get(handle, lease_error=False)
            if isinstance(results, QueryResult):  # the shard did not answer: every call is lost
                results = (results,) * len(idx)
            for i, r in zip(idx, results):
                out[i] = r
        return out  # type: ignore[return-value]

    def resolve(self, handle: Any, timeout_s: float | None = None) -> Any:
        """The value behind an ``*_async`` result. A dead or silent shard raises
        ``LeaseError(shard-unavailable)``; a refused lease raises its ``LeaseError``."""
        return self._get(handle, lease_error=True, timeout_s=timeout_s)

    # -- internals ---------------------------------------------------------------------------------

    def _lease_retrying(self, routed: tuple[SessionRequest, str]) -> Lease:
        request, shard = routed
        deadline = time.monotonic() + self.lease_wait_s
        delay = 0.01
        while True:
            try:
                return self._get(self.transport.send(shard, ShardCore.lease, request),
                                 lease_error=True)
            except LeaseError as exc:
                if exc.kind not in RETRIED or time.monotonic() + delay > deadline:
                    raise
            time.sleep(delay)
            delay = min(delay * 2, 0.5)

    def _route(self, request: SessionRequest) -> tuple[SessionRequest, str]:
        """The request as sent (``key`` and ``worker_id`` filled in) and the shard it goes to."""
        if not isinstance(request, SessionRequest):
            raise LeaseError(LeaseErrorKind.BAD_REQUEST,
                             f"expected a SessionRequest, got {type(request).__name__}")
        key = request.key
        if key is None:
            self._keys += 1
            key = f"{self.worker_id}:{self._keys}"
        request = replace(request, key=key, worker_id=request.worker_id or self.worker_id)
        dialect = request.dialect or self._dialect_of(request.db)
        return request, self.plan.pick(self.role, self.worker, dialect, key)

    def _dialect_of(self, db: str) -> str:
        """The dialect of a URL, or the only dialect this caller's shards serve."""
        if "://" in db:
            try:
                return dialect_name(parse_url(db))
            except Exception as exc:
                raise LeaseError(LeaseErrorKind.BAD_REQUEST, f"not a database URL: {exc}") from None
        served = sorted({d for s in self.plan.shards_for(self.role, self.worker) for d in s.dialects})
        if len(served) != 1:
            raise LeaseError(LeaseErrorKind.BAD_REQUEST,
                             f"name the dialect for database {db!r} (this pool serves {served})")
        return served[0]

    def _send(self, lease: Lease, op: Op, arg: Any) -> Any:
        shard = getattr(lease, "shard", None)
        if shard not in self.shards:
            return _not_mine(lease, op)
        return self.transport.send(shard, op, arg)

    def _per_shard(self, leases: Sequence[Lease], op: Op, arg: Callable[[Any], Any],
                   by_index: bool = False) -> list[tuple[Any, list[int]]]:
        """One ``op(shard, tuple of arg(...))`` call per shard the leases name, with the positions
        of its items; leases of shards this caller does not route to get lost-results."""
        by_shard: dict[Any, list[int]] = {}
        for i, lease in enumerate(leases):
            by_shard.setdefault(getattr(lease, "shard", None), []).append(i)
        parts = []
        for shard, idx in by_shard.items():
            batch = tuple(arg(i) if by_index else arg(leases[i]) for i in idx)
            if shard in self.shards:
                parts.append((self.transport.send(shard, op, batch), idx))
            else:
                parts.append((_not_mine(leases[idx[0]], op, len(idx)), idx))
        return parts

    def _get(self, handle: Any, *, lease_error: bool, timeout_s: float | None = None) -> Any:
        timeout = self.call_timeout_s if timeout_s is None else timeout_s
        try:
            if isinstance(handle, concurrent.futures.Future):
                return handle.result(timeout)
            return self.transport.result(handle, timeout)
        except ShardUnreachable as exc:
            why = str(exc)
        except concurrent.futures.TimeoutError:
            why = "the DB shard did not answer in time; its sessions are gone"
        if lease_error:
            raise LeaseError(LeaseErrorKind.SHARD_UNAVAILABLE, why)
        return QueryResult.failure(ErrorKind.SESSION_LOST, why)

    def _waited(self, since: float) -> None:
        if self.on_lease_wait is not None:
            self.on_lease_wait(self.role, (time.monotonic() - since) * 1e3)


@dataclass(frozen=True)
class PendingBatch:
    """What ``execute_many_async`` returns: per shard, a handle and the positions of its calls
    in the batch."""

    size: int
    parts: tuple[tuple[Any, list[int]], ...]

    @property
    def refs(self) -> list[Any]:
        return [handle for handle, _ in self.parts]


class LeasedSession:
    """A lease plus its client: the object a trajectory holds inside ``client.session()``."""

    def __init__(self, client: PoolClient, lease: Lease) -> None:
        self.client = client
        self.lease = lease

    def execute(self, sql: str) -> QueryResult:
        return self.client.execute(self.lease, sql)

    def renew(self) -> None:
        self.lease = self.client.renew(self.lease)


def _not_mine(lease: Any, op: Op, n: int = 1) -> concurrent.futures.Future:
    """The answer for a lease naming a shard this caller does not route to (another worker's,
    or rebalanced away), as a completed Future: lost results, False releases, or a bad-request
    ``LeaseError`` for ``renew``."""
    future: concurrent.futures.Future = concurrent.futures.Future()
    lost = QueryResult.failure(
        ErrorKind.SESSION_LOST, f"lease for shard {getattr(lease, 'shard', '?')!r}, "
        "which is not one of this caller's shards")
    answers = {ShardCore.submit: lost, ShardCore.submit_many: (lost,) * n,
               ShardCore.release: False, ShardCore.release_many: (False,) * n}
    if op in answers:
        future.set_result(answers[op])
    else:
        future.set_exception(LeaseError(LeaseErrorKind.BAD_REQUEST,
                                        "the lease belongs to a shard this caller does not use"))
    return future


__all__ = ["LeasedSession", "LocalTransport", "PendingBatch", "PoolClient", "RETRIED",
           "ShardUnreachable", "Transport"]
