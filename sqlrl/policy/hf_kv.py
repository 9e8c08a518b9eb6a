"""KV-cache and attention pieces of the transformers decode loop (``HFBackend``, ``HFEngine``).

- ``use_gqa_attention(model)``: transformers' SDPA attention without repeating grouped K/V heads
  under a padding mask (same numbers; ``_sdpa_gqa_forward``).
- ``growing_cache(n_layers, capacity)``: a transformers ``Cache`` whose layers append into
  preallocated buffers (no per-step ``torch.cat`` of the whole cache).
- ``stack_rows(parts, capacity)``: one growing cache + mask from several ``(cache, mask)`` batches
  of different widths, each left-padded to the widest (padded keys/values are zeros and masked,
  so a row's attention is unchanged: positions are passed per row by the caller). This is how the
  engine adds newly prefilled requests to its running batch.
- ``trim_left(cache, mask)``: drops leading columns that no row attends to (after rows leave),
  so a long-gone request's width is not paid for by every later step.
Every function keeps ``mask.shape[1] == cache length`` (the invariant the decode loop relies on).
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

GQA_ATTENTION = "sqlrl_sdpa_gqa"


def _sdpa_gqa_forward(module: Any, query: Any, key: Any, value: Any, attention_mask: Any,
                      dropout: float = 0.0, scaling: float | None = None, is_causal: bool | None = None,
                      **kwargs: Any) -> tuple[Any, None]:
    """transformers' SDPA attention, except that grouped-query heads are left to SDPA
    (``enable_gqa``) even with a padding mask; transformers repeats K/V to every query head then
    (a copy of the whole cache per layer and step: ~90% of a padded 16-row SmolLM2 step here).
    The same numbers (tested against teacher-forced scoring)."""
    import torch

    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal = bool(query.shape[2] > 1 and attention_mask is None and causal)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, is_causal=causal,
        enable_gqa=getattr(module, "num_key_value_groups", 1) > 1)
    return out.transpose(1, 2).contiguous(), None


@functools.lru_cache(maxsize=None)
def _register_gqa_attention() -> str:
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(GQA_ATTENTION, _sdpa_gqa_forward)
    AttentionMaskInterface.register(GQA_ATTENTION, sdpa_mask)
    return GQA_ATTENTION


def use_gqa_attention(model: Any) -> bool:
    """Switch a model that runs transformers' ``"sdpa"`` attention to ``_sdpa_gqa_forward``."""
    if getattr(model.config, "_attn_implementation", None) != "sdpa":
        return model.config._attn_implementation == GQA_ATTENTION
    model.set_attn_implementation(_register_gqa_attention())
    return True


@functools.lru_cache(maxsize=None)
def _growing_layer_class() -> type:
    from transformers.cache_utils import DynamicLayer

    class _GrowingLayer(DynamicLayer):
        """``DynamicLayer`` without the per-step ``torch.cat`` of the whole cache: new keys/values are
        written into a buffer of ``capacity`` positions (grown only if exceeded) and ``keys``/``values``
        are views of its filled part. The concatenation cost batch x context per step and layer --
        most of a 16-row SmolLM2 decode step (measured: 65%) -- so batching gained nothing."""

        def __init__(self, capacity: int) -> None:
            super().__init__()
            self.capacity = capacity
            self._len = 0
            self._kbuf: Any = None
            self._vbuf: Any = None

        def _views(self) -> None:
            self.keys, self.values = self._kbuf[..., :self._len, :], self._vbuf[..., :self._len, :]

        def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            n, add = self._len, key_states.shape[-2]
            if self._kbuf is None or n + add > self._kbuf.shape[-2]:
                shape = (*key_states.shape[:-2], max(self.capacity, 2 * (n + add)), key_states.shape[-1])
                kbuf, vbuf = key_states.new_empty(shape), value_states.new_empty(shape)
                if n:
                    kbuf[..., :n, :] = self._kbuf[..., :n, :]
                    vbuf[..., :n, :] = self._vbuf[..., :n, :]
                self._kbuf, self._vbuf = kbuf, vbuf
            self._kbuf[..., n:n + add, :] = key_states
            self._vbuf[..., n:n + add, :] = value_states
            self._len = n + add
            self._views()
            return self.keys, self.values

        def crop(self, max_length: int) -> None:
            if max_length < 0:
                max_length = self._len + max_length
            if self._kbuf is not None and max_length < self._len:
                self._len = max_length
                self._views()

        def batch_repeat_interleave(self, repeats: int) -> None:
            if self._kbuf is not None:
                self._kbuf = self._kbuf.repeat_interleave(repeats, dim=0)
                self._vbuf = self._vbuf.repeat_interleave(repeats, dim=0)
                self._views()

        def adopt(self, kbuf: Any, vbuf: Any, length: int) -> None:
            """Take ``kbuf``/``vbuf`` (``[B, H, capacity, D]``, the first ``length`` positions filled)."""
            self.lazy_initialization(kbuf, vbuf)
            self._kbuf, self._vbuf, self._len = kbuf, vbuf, length
            self._views()

        def drop_left(self, k: int) -> None:
            """Forget the first ``k`` positions of every row (a view: no copy)."""
            if self._kbuf is not None and k:
                self._kbuf, self._vbuf, self._len = self._kbuf[..., k:, :], self._vbuf[..., k:, :], self._len - k
                self._views()

        def batch_select_indices(self, indices: Any) -> None:
            if self._kbuf is not None:
                self._kbuf, self._vbuf = self._kbuf[indices, ...], self._vbuf[indices, ...]
                self._views()

    return _GrowingLayer


def growing_cache(n_layers: int, capacity: int) -> Any:
    """A transformers ``Cache`` whose layers append into preallocated buffers of ``capacity`` positions."""
    from transformers.cache_utils import Cache

    layer = _growing_layer_class()
    return Cache(layers=[layer(capacity) for _ in range(n_layers)])




def stack_rows(parts: Sequence[tuple[Any, Any]], capacity: int) -> tuple[Any, Any]:
    """One growing cache and mask holding the rows of every ``(cache, mask)`` in ``parts``, in order,
    each left-padded (zero keys/values, mask 0) to the widest; room for ``capacity`` positions."""
    import torch

    parts = [(c, m) for c, m in parts if m.shape[0]]
    width = max(m.shape[1] for _, m in parts)
    rows = sum(m.shape[0] for _, m in parts)
    mask = torch.cat([torch.nn.functional.pad(m, (width - m.shape[1], 0)) for _, m in parts])
    n_layers = len(parts[0][0].layers)
    out = growing_cache(n_layers, max(capacity, width))
    for layer in range(n_layers):
        k0 = parts[0][0].layers[layer].keys
        shape = (rows, k0.shape[1], max(capacity, width), k0.shape[3])
        kbuf, vbuf = k0.new_zeros(shape), k0.new_zeros(shape)
        r = 0
        for cache, m in parts:
            n, w = m.shape
            kbuf[r:r + n, :, width - w:width] = cache.layers[layer].keys
            vbuf[r:r + n, :, width - w:width] = cache.layers[layer].values
            r += n
        out.layers[layer].adopt(kbuf, vbuf, width)
    return out, mask


def trim_left(cache: Any, mask: Any) -> Any:
    """``mask`` without its leading all-zero columns, ``cache`` cut the same way (in place); the mask."""
    live = mask.any(dim=0).nonzero()
    k = int(live[0]) if len(live) else mask.shape[1]
    if k:
        for layer in cache.layers:
            layer.drop_left(k)
        mask = mask[:, k:]
    return mask
