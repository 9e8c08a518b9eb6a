"""ActorGroup: the members of one kind of actor (rollout workers, reward scorers, learner ranks,
DB shards) and the one way to call them all — used by every group in actors/.

- **In-process or Ray, one switch**: ``in_process=True`` builds each member as a plain object in
  this process (no Ray is imported); otherwise each is a Ray actor with the given placement
  (``num_cpus``, ``num_gpus``, custom ``resources``), ``max_concurrency``, ``max_restarts`` and
  no task retries. Members are keyed (``0..n-1``, or shard ids) and can be added and removed.
- **Typed calls**: a call names a method of the member class (``RolloutWorker.rollout``), not a
  string.
- **Fan-out with a deadline**: ``fan_out(method, {key: args})`` sends every call at once and
  returns ``{key: value or Failed}`` in the order asked. Nothing waits past ``timeout_s``;
  a member that died, is restarting or cannot start, or that raised, or that did not answer in
  time, gets a ``Failed`` placeholder with its kind and a message. ``restart_late=True`` kills
  (and lets Ray restart) members that did not answer in time; ``settle_s`` bounds how long the
  others are waited for after a first failure (a collective: the rest cannot finish alone).
- **Restart-aware** (``incarnations=True``; members then implement ``incarnation_id()``, a new id
  in every process): ``restart`` notes the incarnation it kills, and with ``fan_out(...,
  live_only=True)`` a member that was killed, died or has not answered yet is waited for (at
  most ``start_timeout_s``) until it answers from an incarnation that was never killed, before a
  call is sent to it — ``ray.kill`` is asynchronous, and a call made right after it can still
  reach the old process. So a hung process never gets (or answers) another call.
- In-process, calls run at once, one after another; an exception is a ``Failed`` of kind
  ``raised`` as with Ray.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Iterable, Iterator, Mapping, Sequence

DIED = "died"  # the actor process is gone, restarting or unreachable
TIMEOUT = "timeout"  # no answer by the deadline
RAISED = "raised"  # the method raised ``error``
NOT_STARTED = "not-started"  # it cannot start, or did not come back within start_timeout_s


@dataclass(frozen=True)
class Failed:
    """The placeholder for a member's call that gave no value."""

    member: Hashable
    kind: str  # DIED | TIMEOUT | RAISED | NOT_STARTED
    message: str
    error: BaseException | None = None  # RAISED: the exception the method raised


class ActorGroup:
    """Members of one class, as Ray actors or (``in_process``) as objects in this process."""

    def __init__(self, cls: type, *, in_process: bool, num_cpus: float = 1.0, num_gpus: float = 0.0,
                 resources: Mapping[str, float] | None = None, max_concurrency: int | None = None,
                 max_restarts: int = -1, incarnations: bool = False,
                 start_timeout_s: float = 300.0) -> None:
        self.cls = cls
        self.in_process = in_process
        self.incarnations = incarnations
        self.start_timeout_s = start_timeout_s
        self.members: dict[Hashable, Any] = {}
        self._incarnation: dict[Hashable, str | None] = {}  # what each last answered with
        self._killed: dict[Hashable, set[str]] = {}  # incarnations that hung: never used again
        self._options = {"num_cpus": num_cpus, "num_gpus": num_gpus, "resources": dict(resources or {}) or None,
                         "max_restarts": max_restarts, "max_task_retries": 0}
        if max_concurrency is not None:
            self._options["max_concurrency"] = max_concurrency

    # -- members -----------------------------------------------------------------------------------

    def add(self, args: Mapping[Hashable, tuple]) -> None:
        """Create one member per key with ``cls(*args[key])`` (an actor, or an object here)."""
        if not self.in_process:
            import ray

            remote = ray.remote(self.cls).options(**self._options)
        for key, a in args.items():
            self.members[key] = self.cls(*a) if self.in_process else remote.remote(*a)
            self._incarnation[key], self._killed[key] = None, set()

    def pop(self, key: Hashable) -> Any:
        self._incarnation.pop(key, None)
        self._killed.pop(key, None)
        return self.members.pop(key)

    def __getitem__(self, key: Hashable) -> Any:
        return self.members[key]

    def __len__(self) -> int:
        return len(self.members)

    def __iter__(self) -> Iterator[Hashable]:
        return iter(list(self.members))

    def __contains__(self, key: object) -> bool:
        return key in self.members

    def keys(self) -> list[Hashable]:
        return list(self.members)

    def values(self) -> list[Any]:
        return list(self.members.values())

    # -- calls -------------------------------------------------------------------------------------

    def send(self, key: Hashable, method: Callable, *args: Any) -> Any:
        """Start ``method(member, *args)``: an ObjectRef (Ray) or the value itself (in-process)."""
        member = self.members[key]
        if self.in_process:
            return method(member, *args)
        return getattr(member, method.__name__).remote(*args)

    def call_all(self, method: Callable, *args: Any, timeout_s: float,
                 keys: Iterable[Hashable] | None = None) -> dict[Hashable, Any]:
        """``fan_out`` with the same arguments for every member (or ``keys``)."""
        return self.fan_out(method, {k: args for k in (self.keys() if keys is None else keys)},
                            timeout_s=timeout_s)

    def fan_out(self, method: Callable, args: Mapping[Hashable, tuple], *, timeout_s: float,
                restart_late: bool = False, settle_s: float | None = None,
                live_only: bool = False) -> dict[Hashable, Any]:
        """Call ``method`` on the members named by ``args``; see the module doc. ``live_only``
        (with ``incarnations``): first wait for each member's live incarnation (``await_live``);
        the deadline is counted from when the calls are sent."""
        if self.in_process:
            return {k: self._local(k, method, a) for k, a in args.items()}
        import ray

        out: dict[Hashable, Any] = dict(self.await_live(args) if live_only else {})
        refs = {self.send(k, method, *a): k for k, a in args.items() if k not in out}
        deadline = time.monotonic() + timeout_s
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1,
                                      timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            key = refs[ready[0]]
            out[key] = self._value(key, ready[0])
            if settle_s is not None and isinstance(out[key], Failed):
                settle = 0.0 if out[key].kind == DIED else settle_s
                deadline = min(deadline, time.monotonic() + settle)
        late = [refs[ref] for ref in pending]
        for key in late:
            out[key] = Failed(key, TIMEOUT, f"no answer within {timeout_s} s")
        if restart_late:
            self.restart(late)
        return {k: out[k] for k in args}

    def _local(self, key: Hashable, method: Callable, args: tuple) -> Any:
        try:
            return method(self.members[key], *args)
        except Exception as exc:
            return Failed(key, RAISED, f"{type(exc).__name__}: {exc}", exc)

    def _value(self, key: Hashable, ref: Any) -> Any:
        import ray
        from ray.exceptions import RayActorError, RayTaskError

        try:
            return ray.get(ref)
        except RayActorError as exc:
            self._incarnation[key] = None  # dying, restarting or unreachable: wait for an answer
            return Failed(key, DIED, f"{type(exc).__name__}: {exc}", exc)
        except RayTaskError as exc:
            cause = getattr(exc, "cause", None) or exc
            return Failed(key, RAISED, f"{type(cause).__name__}: {cause}", cause)

    # -- restarts ----------------------------------------------------------------------------------

    def await_live(self, keys: Iterable[Hashable]) -> dict[Hashable, Failed]:
        """Wait (at most ``start_timeout_s``) until each member of ``keys`` whose incarnation is
        not known answers ``incarnation_id()`` with an id that was never killed. An answer from a
        killed incarnation (the kill has not landed yet) or an actor error is asked again after a
        short pause. Returns ``NOT_STARTED`` failures for members not back (one whose constructor
        failed is not waited for: Ray does not restart it)."""
        if self.in_process:
            return {}
        import ray
        from ray.exceptions import RayActorError, RayError

        deadline = time.monotonic() + self.start_timeout_s
        ask = lambda k: self.members[k].incarnation_id.remote()  # noqa: E731
        asks = {ask(k): k for k in dict.fromkeys(keys) if self._incarnation.get(k) is None}
        cannot_start: dict[Hashable, Failed] = {}
        pause = 0.02
        while asks:
            ready, _ = ray.wait(list(asks), num_returns=1,
                                timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            key = asks.pop(ready[0])
            try:
                incarnation = ray.get(ready[0])
            except RayActorError as exc:
                if exc.actor_init_failed:
                    cause = (str(exc).strip().splitlines() or [type(exc).__name__])[-1]
                    cannot_start[key] = Failed(key, NOT_STARTED, f"cannot start: {cause}", exc)
                    continue
                incarnation = None
            except RayError:
                incarnation = None
            if incarnation is not None and incarnation not in self._killed[key]:
                self._incarnation[key] = incarnation
                continue
            if time.monotonic() >= deadline:
                asks[ready[0]] = key  # keep it counted as not back
                break
            time.sleep(pause)  # the old process still answers, or the member is in between
            pause = min(0.5, pause * 2)
            asks[ask(key)] = key
        late = {k: Failed(k, NOT_STARTED, f"did not (re)start within {self.start_timeout_s} s")
                for k in asks.values()}
        return {**late, **cannot_start}

    def restart(self, keys: Sequence[Hashable]) -> None:
        """Kill members (Ray restarts them). With ``incarnations``, first note which incarnation
        hung so it is never used again: the hung process still answers ``incarnation_id()`` (a
        second concurrency slot); if it cannot within a few seconds, the last id it answered
        with is used."""
        if self.in_process or not keys:
            return
        import ray

        if self.incarnations:
            asks = {self.members[k].incarnation_id.remote(): k for k in keys}
            ready, _ = ray.wait(list(asks), num_returns=len(asks),
                                timeout=min(10.0, self.start_timeout_s))
            for ref in ready:
                with contextlib.suppress(Exception):
                    self._incarnation[asks[ref]] = ray.get(ref)
            for k in keys:
                if self._incarnation[k] is not None:
                    self._killed[k].add(self._incarnation[k])  # type: ignore[arg-type]
        for k in keys:
            self._incarnation[k] = None
            ray.kill(self.members[k], no_restart=False)

    def known_incarnations(self) -> list[str | None]:
        return [self._incarnation[k] for k in self.members]

    def stop(self, keys: Iterable[Hashable] | None = None) -> None:
        """Kill members for good (all by default) and forget them. An in-process member with a
        ``close()`` method is closed first (e.g. a rollout worker's vLLM engine processes, which
        would otherwise live until garbage collection); a Ray member's process is killed, and
        child processes it started (vLLM's engine) exit when they see their parent gone."""
        for k in list(self.members if keys is None else keys):
            member = self.pop(k)
            if self.in_process:
                getattr(member, "close", lambda: None)()
            else:
                import ray

                ray.kill(member, no_restart=True)


__all__ = ["ActorGroup", "DIED", "Failed", "NOT_STARTED", "RAISED", "TIMEOUT"]
