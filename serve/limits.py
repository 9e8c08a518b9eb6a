"""What a public endpoint needs before any model work: API keys, per-key rate limits, clamps.

- ``check_api_key(authorization, keys, required)``: ``Authorization: Bearer <key>`` against the
  configured keys (constant-time compare); returns the key (the rate-limit bucket) or raises
  ``APIError(401)``. With ``required=False`` every caller shares the bucket ``"anonymous"``.
- ``RateLimiter(per_minute, burst)``: a token bucket per key; ``take(key)`` raises
  ``APIError(429)`` with a ``Retry-After`` header (whole seconds until a token is back).
  State is per ingress replica (N replicas allow N times the rate; say so when you scale out).
- ``Admission(capacity)``: per model, the requests an ingress replica has in flight (generating,
  or waiting for a slot); ``enter(name)`` raises ``APIError(503, code="queue_full")`` once a model
  holds ``capacity[name]`` of them, else returns the request's ``release`` (idempotent: a second
  call frees nothing, so a stream may release from its end and from its collection). Exact, unlike Ray Serve's own
  ``max_queued_requests``: Serve's router counts a request as queued only while it picks a replica,
  not while a full replica is rejecting it, so a burst can find the count low and never be
  refused (seen in CI) -- or find it high and be refused while slots are free. Per ingress replica,
  like the rate limit.
- ``clamp(value, maximum)``: client numbers are clamped to the configured maxima, never trusted.

Guarantees: pure Python, injectable clock, no Ray.
"""

from __future__ import annotations

import hmac
import math
import threading
import time
from typing import Callable

from .openai_chat import APIError


def check_api_key(authorization: str | None, keys: frozenset[str], required: bool = True) -> str:
    if not required:
        return "anonymous"
    scheme, _, token = (authorization or "").partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise APIError(401, "missing API key: send 'Authorization: Bearer <key>'",
                       code="invalid_api_key")
    if not any(hmac.compare_digest(token.encode(), k.encode()) for k in keys):
        raise APIError(401, "invalid API key", code="invalid_api_key")
    return token


class RateLimiter:
    def __init__(self, per_minute: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = per_minute / 60.0
        self.burst = max(1, int(burst))
        self.clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, last time)
        self._lock = threading.Lock()

    def take(self, key: str) -> None:
        if self.rate <= 0:
            return
        with self._lock:
            now = self.clock()
            tokens, last = self._buckets.get(key, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - last) * self.rate)
            if tokens < 1.0:
                self._buckets[key] = (tokens, now)
                wait = math.ceil((1.0 - tokens) / self.rate)
                raise APIError(429, f"rate limit reached for this API key; retry after {wait} s",
                               code="rate_limit_exceeded", headers={"Retry-After": str(wait)})
            self._buckets[key] = (tokens - 1.0, now)


class Admission:
    def __init__(self, capacity: dict[str, int | None]) -> None:
        self.capacity = dict(capacity)  # name -> most requests in flight; None = no limit
        self.inflight = {name: 0 for name in capacity}
        self._lock = threading.Lock()

    def enter(self, name: str) -> Callable[[], None]:
        with self._lock:
            limit = self.capacity.get(name)
            if limit is not None and self.inflight.get(name, 0) >= limit:
                raise APIError(503, f"the model {name!r} has {limit} requests in flight (its "
                               "replicas' slots and queue are full); retry later", code="queue_full")
            self.inflight[name] = self.inflight.get(name, 0) + 1
        released = False

        def release() -> None:
            nonlocal released
            with self._lock:
                if not released:
                    released = True
                    self.inflight[name] -= 1
        return release


def clamp(value: int | None, maximum: int, default: int | None = None) -> int:
    if value is None:
        value = default if default is not None else maximum
    return max(1, min(int(value), int(maximum)))
