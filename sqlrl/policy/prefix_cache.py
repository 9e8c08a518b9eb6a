"""A bounded LRU store of per-sequence KV caches, looked up by longest common token prefix.

In the agent loop a trajectory's next prompt is exactly its previous prompt + the generated ids
+ the continuation ids, and the ``n`` samples of a GRPO group (and tasks on the same database)
share long prompt prefixes. ``PrefixKVCache`` keeps, per stored token sequence, the key/value
tensors of every layer (``[kv_heads, len(ids), head_dim]``, as the attention layers cache them,
i.e. keys after RoPE at positions ``0 .. len(ids) - 1``), so ``HFBackend`` only prefills what is new.

Guarantees:
- ``lookup(ids)`` returns the longest common prefix of ``ids`` with any stored sequence, capped at
  ``len(ids) - 1`` (at least one token is always left to run, so the caller gets fresh logits),
  and per-layer views of the stored tensors cut to that length. Causality makes this exact: the
  KV at position ``j`` depends only on tokens ``0 .. j``, so any common prefix of a stored
  sequence is valid for ``ids``. Equal to the stored tensors bit for bit (they are views).
- Capacity is a token budget: the total stored length never exceeds ``max_tokens``; least recently
  used (stored or hit) entries are evicted first, a sequence longer than the budget is not stored.
- A stored sequence that is a prefix of a newly stored one is dropped (the new one answers every
  lookup at least as well), and storing a prefix of an existing entry only refreshes that entry.
- ``store`` validates shapes (``ValueError``); stored tensors own their memory (a view of a larger
  tensor is copied, so an entry never keeps a whole batch alive). ``clear()`` empties the store;
  the owner must call it whenever the weights change.
- No model code, no ray: tensors are only sliced, copied and shape-checked.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Sequence


@dataclass(frozen=True)
class PrefixHit:
    """``length`` tokens of the looked-up sequence are covered by ``layers`` (``()`` on a miss)."""

    length: int
    layers: tuple[tuple[Any, Any], ...] = ()  # per layer (keys, values): [kv_heads, length, head_dim]


@dataclass
class _Entry:
    ids: tuple[int, ...]
    layers: tuple[tuple[Any, Any], ...]


@dataclass
class CacheStats:
    """Counters since construction (not reset by ``clear``)."""

    lookups: int = 0
    hits: int = 0
    reused_tokens: int = 0
    stored: int = 0
    evicted: int = 0
    cleared: int = 0


def _owned(t: Any) -> Any:
    """``t`` itself if it owns exactly its storage, else a compact copy."""
    t = t.detach()
    if t.is_contiguous() and t.storage_offset() == 0 and \
            t.untyped_storage().nbytes() == t.numel() * t.element_size():
        return t
    return t.contiguous().clone()


class PrefixKVCache:
    def __init__(self, max_tokens: int) -> None:
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive int, got {max_tokens!r}")
        self.max_tokens = max_tokens
        self._entries: OrderedDict[tuple[int, ...], _Entry] = OrderedDict()
        self._tokens = 0
        self.stats = CacheStats()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def tokens(self) -> int:
        """Total stored sequence length (the budget's unit)."""
        return self._tokens

    def clear(self) -> None:
        self._entries.clear()
        self._tokens = 0
        self.stats.cleared += 1

    # ------------------------------------------------------------------ lookup
    def lookup(self, ids: Sequence[int]) -> PrefixHit:
        self.stats.lookups += 1
        q = tuple(int(i) for i in ids)
        cap = len(q) - 1
        if cap < 1 or not self._entries:
            return PrefixHit(0)
        best, best_len = None, 0
        for key, entry in self._entries.items():
            if key[0] != q[0] or min(len(key), cap) <= best_len:
                continue
            common = min(common_prefix_length(key, q), cap)
            if common > best_len:
                best, best_len = entry, common
        if best is None:
            return PrefixHit(0)
        self._entries.move_to_end(best.ids)
        self.stats.hits += 1
        self.stats.reused_tokens += best_len
        return PrefixHit(best_len, tuple((k[:, :best_len], v[:, :best_len]) for k, v in best.layers))

    # ------------------------------------------------------------------ store
    def store(self, ids: Sequence[int], layers: Sequence[tuple[Any, Any]]) -> bool:
        """Keep ``layers`` (per layer ``(keys, values)``, ``[kv_heads, len(ids), head_dim]``) for ``ids``.

        Returns whether the sequence is now answered by the store (False only when it exceeds the budget).
        """
        key = tuple(int(i) for i in ids)
        if not key:
            raise ValueError("cannot store an empty sequence")
        if not layers:
            raise ValueError("no layers to store")
        for i, (k, v) in enumerate(layers):
            if k.dim() != 3 or k.shape != v.shape or k.shape[1] != len(key):
                raise ValueError(f"layer {i}: keys {tuple(k.shape)} and values {tuple(v.shape)} must both be "
                                 f"[kv_heads, {len(key)}, head_dim]")
        if len(key) > self.max_tokens:
            return False
        for other in self._entries:  # already covered by a longer entry: refresh it
            if len(other) >= len(key) and other[:len(key)] == key:
                self._entries.move_to_end(other)
                return True
        for other in [o for o in self._entries if len(o) < len(key) and key[:len(o)] == o]:
            self._drop(other)
        self._entries[key] = _Entry(key, tuple((_owned(k), _owned(v)) for k, v in layers))
        self._tokens += len(key)
        self.stats.stored += 1
        while self._tokens > self.max_tokens:
            self._drop(next(iter(self._entries)))
            self.stats.evicted += 1
        return True

    def _drop(self, key: tuple[int, ...]) -> None:
        del self._entries[key]
        self._tokens -= len(key)


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading items ``a`` and ``b`` share (binary search over C-level slice comparisons)."""
    a, b = tuple(a), tuple(b)
    lo, hi = 0, min(len(a), len(b))  # a[:lo] == b[:lo] holds; the answer is in [lo, hi]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def kv_bytes_per_token(config: Any, dtype_bytes: int = 4) -> int:
    """Bytes one cached token costs for a decoder ``config``: 2 (K, V) x layers x kv heads x head dim x dtype."""
    heads = getattr(config, "num_attention_heads")
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return 2 * config.num_hidden_layers * kv_heads * head_dim * dtype_bytes
