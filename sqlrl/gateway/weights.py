"""The policy version a gateway records its calls under, across restarts of its process (Ray-free).

An engine counts its policy versions from 0 in every process; the job counts on across restarts of
its gateway. ``PolicyWeights(version)`` is built with the version the gateway's journal last
recorded (0 on a first start) and reads the engine's versions as the job's.

Guarantees:
- ``awaiting`` is True from a start at ``version > 0`` (the new engine holds the start weights under
  a later number) until ``loaded``; the gateway refuses or holds calls meanwhile (``Rollouts``).
- ``loaded(engine_version, version)`` after an engine update returns the job's version of what the
  engine now serves: ``version`` when given (the offset is set so that ``engine_version`` reads as
  it), else ``engine_version`` plus the offset; it ends ``awaiting`` and calls every
  ``when_ready`` waiter once.
- ``job_generation(g)``: ``g`` with its per-token ``versions`` read as the job's (unchanged at
  offset 0). The offset changes only at a restore, when no call runs (calls are held).
- ``release()`` (the gateway stops) calls the waiters too; ``when_ready`` then answers True.
- ``check_call(reject, retry_after_s)``: ``Busy`` (429 + ``Retry-After``) for a call that may not
  begin now -- while ``awaiting``, or while ``updating`` (set by the owner around an engine update)
  when ``reject`` (``during_update: reject``); otherwise it returns and the call proceeds (with
  ``wait`` the engine's update policy holds it).
Thread-safe.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Callable

from sqlrl.policy.types import Generation

from .contract import Busy


class PolicyWeights:
    def __init__(self, version: int = 0) -> None:
        self._lock = threading.Lock()
        self.base = version  # the job's version minus the engine's (the engine starts at 0)
        self.awaiting = version > 0
        self.updating = False  # an engine update is in progress (the owner sets it, under its lock)
        self._released = False
        self._waiters: list[Callable[[], None]] = []

    def check_call(self, reject: bool, retry_after_s: int) -> None:
        if self.awaiting:
            raise Busy("the gateway restarted and waits for the job to restore the policy's weights; "
                       "retry shortly", retry_after_s)
        if self.updating and reject:
            raise Busy("the policy's weights are being updated; retry shortly", retry_after_s)

    def job_generation(self, generation: Generation) -> Generation:
        base = self.base
        if not base or not generation.versions:
            return generation
        return dataclasses.replace(generation, versions=tuple(v + base for v in generation.versions))

    def loaded(self, engine_version: int, version: int | None = None) -> int:
        with self._lock:
            if version is not None:
                self.base = version - engine_version
            self.awaiting = False
            waiters, self._waiters = self._waiters, []
            new = engine_version + self.base
        for wake in waiters:
            wake()
        return new

    def when_ready(self, wake: Callable[[], None]) -> bool:
        """True when the engine serves the job's weights; else ``wake`` (thread-safe) is kept and
        called once when they are loaded or on ``release``."""
        with self._lock:
            if not self.awaiting or self._released:
                return True
            self._waiters.append(wake)
            return False

    def release(self) -> None:
        with self._lock:
            self._released = True
            waiters, self._waiters = self._waiters, []
        for wake in waiters:
            wake()
