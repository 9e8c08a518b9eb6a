"""The job driver's side of the gateway actor: ``ActorGateway``, the actor as the job's
``sqlrl.gateway.job.StepGateway``, across restarts of the actor (``start_gateway(..., max_restarts)``).

    handle, url = start_gateway(spec, sessions=..., max_restarts=3)
    gateway = ActorGateway(handle, max_restarts=3)     # run_steps(cfg, tasks, gateway, learner, ...)

Guarantees:
- Each call is one actor method, ``ray.get`` of it (blocking).
- **A restart is noticed** when a call fails with ``RayActorError`` (it was in flight, or sent, when
  the process died) or when ``wait_step`` comes back without the step done and the actor answers
  ``incarnation()`` with a token the driver has not seen (the actor died between two calls: a
  restarted gateway whose journal names a policy version > 0 returns from ``wait_step`` at once,
  since it holds its clients' calls until its weights are restored). Either way the driver
  **recovers**: it waits for the new incarnation to answer (``restart_timeout_s``) and to serve
  again on its URL (``ready()``: a restart that cannot rebind its port is a ``GatewayLost`` naming
  that error), restores **the weights pushed last, under their version** (the engine rebuilt from
  ``model`` has the start weights; the weights are kept in Ray's object store from the last push,
  one copy, until the next push replaces them), prints what the restart lost, and repeats the call.
- **Every call is safe to repeat, so each is repeated after a recovery** (never silently: the
  recovery prints one line): ``offer`` carries a token (repeated: a no-op when the dead process
  journalled it), ``drain`` a token (repeated: the same traces again when the dead process had
  journalled handing them out, so no trace is lost with a reply), ``update_weights`` the version
  the weights are (repeated: the same weights as the same version), and ``finish``, ``wait_step``,
  ``stats``, ``stop`` read or set state idempotently.
- **The step's accounting**: rollouts that were live when the process died come back from the
  next ``drain`` as ``expired`` with ``lost == LostReason.GATEWAY_RESTART`` and the cause (the
  journal's replay; their DB-pool leases released by the new incarnation); the step goes on with
  them as unfinished rollouts, like a dead client's (``redraws`` re-offers them, ``unfinished``
  says how they count). Offers not yet claimed wait again. ``restarts`` and ``lost`` count them.
- **Bounded**: at most ``max_restarts`` recoveries (as many as Ray restarts the actor) and
  ``max_restarts + 2`` tries of one call; then, or when the actor does not come back within
  ``restart_timeout_s`` or is dead for good, ``GatewayLost`` names the call, the restarts used and
  the cause.
"""

from __future__ import annotations

import secrets
import threading
import time
from typing import Any, Callable, Mapping

from sqlrl.gateway.rollouts import GatewayStats
from sqlrl.gateway.trace import RolloutTrace


class GatewayLost(RuntimeError):
    """The gateway actor is gone: restarts exhausted, dead for good, not back in time, or not serving."""


class ActorGateway:
    """A gateway actor seen from the job's driver (module docstring). ``jobs.train_agent`` with
    ``gateway_host: actor``; ``jobs.train_agent.GatewayHost`` is the same interface in-process."""

    def __init__(self, handle: Any, *, max_restarts: int = 0, restart_timeout_s: float = 300.0,
                 log: Callable[[str], None] = lambda line: print(line, flush=True)) -> None:
        import ray

        if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
            raise ValueError(f"max_restarts must be an int >= 0, got {max_restarts!r}")
        if not restart_timeout_s > 0:
            raise ValueError(f"restart_timeout_s must be > 0, got {restart_timeout_s!r}")
        self.handle, self._ray, self.log = handle, ray, log
        self.max_restarts, self.restart_timeout_s = max_restarts, restart_timeout_s
        self.restarts = 0  # restarts recovered from
        self.lost = 0  # rollouts those restarts lost
        self.version = 0  # the policy version the gateway serves (the last push's)
        self._weights: Any = None  # ObjectRef of the last weights pushed (what a restart gets back)
        self._prefix, self._n = secrets.token_hex(6), 0
        self._incarnation = self._call("incarnation", lambda: handle.incarnation.remote()).token

    # -- StepGateway --------------------------------------------------------------------------------

    def offer(self, group_id: str, task: Any, n: int) -> None:
        token = self._token()
        self._call("offer", lambda: self.handle.offer.remote(group_id, task, n, token))

    def finish(self) -> None:
        self._call("finish", lambda: self.handle.finish.remote())

    def wait_step(self, timeout: float | None) -> bool:
        """Until every offered rollout ended (True) or ``timeout`` (False; a recovery restarts it)."""
        while True:
            if self._call("wait_step", lambda: self.handle.wait_step.remote(timeout)):
                return True
            now = self._call("incarnation", lambda: self.handle.incarnation.remote())
            if now.token == self._incarnation and not now.awaiting_weights:
                return False
            self._recover("wait_step", None)  # restarted between calls: restore it, wait again

    def drain(self) -> list[RolloutTrace]:
        token = self._token()
        return self._call("drain", lambda: self.handle.drain.remote(token))

    def stats(self) -> GatewayStats:
        return self._call("stats", lambda: self.handle.stats.remote())

    def update_weights(self, weights: Mapping[str, Any], policy: str, version: int | None = None) -> int:
        """``version``: the job's number for these weights (a resumed job's restore), else the last + 1."""
        ref, version = self._ray.put(dict(weights)), self.version + 1 if version is None else version
        got = self._call("update_weights", lambda: self.handle.update_weights.remote(ref, policy, version))
        self._weights, self.version = ref, got
        return got

    def close(self) -> int:
        """Stop the actor's server (live rollouts failed, sessions released), then the actor."""
        try:
            return self._call("stop", lambda: self.handle.stop.remote())
        finally:
            self._ray.kill(self.handle)

    # -- restarts -----------------------------------------------------------------------------------

    def _token(self) -> str:
        self._n += 1
        return f"{self._prefix}-{self._n}"

    def _call(self, what: str, submit: Callable[[], Any]) -> Any:
        from ray.exceptions import RayActorError

        for _ in range(self.max_restarts + 2):
            try:
                return self._ray.get(submit())
            except RayActorError as exc:
                self._recover(what, exc)
        raise GatewayLost(f"the gateway's {what} failed {self.max_restarts + 2} times across restarts")

    def _recover(self, what: str, error: BaseException | None) -> None:
        """Wait for the restarted actor, restore its weights; ``GatewayLost`` when it cannot be."""
        from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError

        used = f"{self.restarts} of max_restarts={self.max_restarts} used"
        if self.restarts >= self.max_restarts and error is not None:
            raise GatewayLost(f"the gateway actor died during {what} and is not restarted again ({used}): "
                              f"{error}") from error
        deadline = time.monotonic() + self.restart_timeout_s
        delay = 0.05
        while True:  # calls sent before Ray knew the process dead fail; the restarted one answers
            try:
                left = max(deadline - time.monotonic(), 0.001)
                now = self._ray.get(self.handle.incarnation.remote(), timeout=left)
                self._ray.get(self.handle.ready.remote(), timeout=max(deadline - time.monotonic(), 0.001))
                break
            except GetTimeoutError:
                raise GatewayLost(f"the gateway actor did not come back within restart_timeout_s="
                                  f"{self.restart_timeout_s:g} after {what} ({used})") from error
            except RayActorError as exc:  # Ray's "restarting" is ActorUnavailableError; else ask if it is DEAD
                gone = not isinstance(exc, ActorUnavailableError) and self._dead_for_good()
                if gone or time.monotonic() + delay > deadline:
                    raise GatewayLost(f"the gateway actor died during {what} and did not come back ({used}): "
                                      f"{exc}") from exc
            except Exception as exc:  # ready(): the restart could not serve on its port again
                raise GatewayLost(f"the gateway actor restarted after {what} but cannot serve: {exc}") from exc
            threading.Event().wait(delay)  # between asks while Ray restarts the process
            delay = min(delay * 2, 1.0)
        restarted = now.token != self._incarnation  # else the same process: the call failed on the way
        if restarted:
            if self.restarts >= self.max_restarts:
                raise GatewayLost(f"the gateway actor restarted more often than max_restarts={self.max_restarts}")
            self.restarts += 1
            self._incarnation = now.token
            self.lost += now.lost
        restored = "the start weights (none pushed yet)"
        if self._weights is not None and (restarted or now.awaiting_weights):
            try:
                v = self._ray.get(self.handle.update_weights.remote(self._weights, "drain", self.version))
            except RayActorError as exc:  # died again: the next incarnation gets them
                return self._recover("restoring the weights", exc)
            restored = f"the weights of policy version {v} restored"
        elif now.awaiting_weights:
            raise GatewayLost("the restarted gateway waits for policy weights this driver never pushed "
                              "(its journal is another job's?)")
        if restarted:
            self.log(f"sqlrl gateway: the actor restarted (process {now.pid}; restart {self.restarts} of "
                     f"{self.max_restarts}) during {what}: {now.lost} live rollout(s) lost (expired, "
                     f"'gateway-restart'; {now.released} DB session(s) released); {restored}; repeating {what}")

    def _dead_for_good(self) -> bool:
        """Whether Ray says the actor is DEAD (no restart left); False when it cannot tell."""
        try:
            from ray.util.state import get_actor

            info = get_actor(self.handle._actor_id.hex(), timeout=10)
            return info is not None and info.state == "DEAD"
        except Exception:
            return False
