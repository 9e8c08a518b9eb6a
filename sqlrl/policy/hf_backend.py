"""``HFBackend``: the ``GenerationBackend`` for a local transformers model, with its own KV-cache decode loop.

Its steps (``prefill``, ``decode``, ``sample_tokens``, ``finish_reason``, ``store_rows``) are also
the continuous-batching engine's (``sqlrl.policy.hf_engine``): one copy of the decode code.

One ``generate`` call is one left-padded batch: every distinct prompt is prefilled once (identical
prompts in a call, e.g. a GRPO group's first turn, share one prefill), the cache is indexed out to
one row per sample (the ``n`` samples of a prompt sit in the same batch), then one token per row is
decoded per step; rows that finish are dropped from the batch (and the cache).

**Prefix cache** (``prefix_cache=True``, the default; ``sqlrl.policy.prefix_cache``): when a row
finishes, the KV of its prompt + generated ids but the last (whose KV was never computed) is kept
in a bounded LRU store (``max_cached_tokens``, a token budget; SmolLM2-135M in float32 costs
45 KiB per token: 30 layers x 3 KV heads x 64 x K,V x 4 B, so the default 64,000 tokens is at most
~2.9 GB; the tiny model 512 B). The next call looks every prompt up (longest common prefix with a
stored sequence) and prefills only the rest: rows with different cached and suffix lengths are
combined in one batch (cached KV left-padded and masked, suffixes left-padded so all rows end at
the same column, positions counting real tokens only). Only for models whose layers are all full
attention (otherwise ``prefix_cache_off_reason`` says why it is off). ``clear_cache()`` forgets
everything; ``generate`` also clears the store by itself when any parameter was modified in place
or replaced since the last call (``tensor._version`` / data pointer), so stale KV is never reused.
Guarantees, on top of ``sqlrl.policy.types``:
- The prefix cache does not change results: greedy tokens are the same with it on or off and
  log-probs agree to float error (tested at 1e-4 over multi-turn conversations, batched and alone).
- Padding does not change results: positions are counted from each row's first real token and
  padded keys are masked, so a prompt gives the same greedy tokens alone or in a batch.
- ``logprobs[i]`` is computed from the very logits ``token_ids[i]`` was drawn from: log-softmax of
  ``logits / temperature`` restricted to the top-p nucleus (the smallest set of most likely tokens
  whose mass reaches ``top_p``; the most likely token is always kept) and renormalised. At
  ``temperature == 0`` the token is the argmax and its log-prob is the temperature-1 one (a point
  mass would always give 0). ``score`` recomputes the same numbers teacher-forced from the full
  sequence (equal up to float error, tested at 1e-4).
- Sampling is deterministic given ``params.seed``: sample ``j`` of prompt ``i`` draws from its own
  generator seeded by ``(seed, i, j)``, so it does not depend on the other prompts in the call.
  ``seed=None`` draws fresh seeds (reported in ``meta["seed"]``).
- Stop strings are matched in the decoded text of the completion (``skip_special_tokens=True``, the
  same decoding as ``text``) after every step; the first token that completes one ends the row with
  ``"stop"`` (all of that token is kept, so ``text`` may run a few characters past the stop string).
  EOS tokens (``policy.eos_token_ids``) end a row with ``"eos"`` and are kept; ``max_new_tokens``
  gives ``"length"``. EOS wins over a stop string completed by the same token.
- Bad input (empty prompt, non-integer or out-of-vocabulary ids, prompt + ``max_new_tokens`` longer
  than the model's positions) raises ``ValueError`` before any
  model work; an empty prompt list returns ``[]``.
"""

from __future__ import annotations

import random
from typing import Any, Callable, Sequence

from .constraints import refuse_structured
from .hf_kv import growing_cache, use_gqa_attention
from .prefix_cache import PrefixHit, PrefixKVCache, common_prefix_length
from .types import Generation, SamplingParams, row_seed

DEFAULT_MAX_CACHED_TOKENS = 64_000
MIN_SHARED_PREFIX = 32  # tokens distinct prompts of one call must share beyond the cache to prefill once


def _prefix_cache_unsupported(config: Any) -> str | None:
    """Why KV prefixes of this model cannot be reused (None: they can)."""
    types = set(getattr(config, "layer_types", None) or ["full_attention"])
    if types != {"full_attention"} or getattr(config, "use_sliding_window", False):
        return f"the model has non-full-attention layers ({', '.join(sorted(types))})"
    return None


def processed_logprobs(logits: Any, temperature: float, top_p: float) -> Any:
    """Log-probs of the sampling distribution for ``logits`` ``[..., V]`` (float32; ``-inf`` outside top-p)."""
    import torch

    logits = logits.float()
    if temperature > 0:
        logits = logits / temperature
    logprobs = torch.log_softmax(logits, dim=-1)
    if top_p < 1.0:
        sorted_lp, order = torch.sort(logprobs, dim=-1, descending=True)
        probs = sorted_lp.exp()
        mass_before = torch.cumsum(probs, dim=-1) - probs
        drop_sorted = mass_before >= top_p
        drop_sorted[..., 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logprobs = torch.log_softmax(logits.masked_fill(drop, float("-inf")), dim=-1)
    return logprobs


def sample_tokens(logits: Any, temperature: float, top_p: float, gens: Sequence[Any]) -> tuple[Any, list[float]]:
    """One token per row of ``logits`` ``[B, V]`` and its processed log-prob: the argmax at
    ``temperature == 0``, else inverse-CDF sampling with one uniform draw from row ``b``'s own
    generator ``gens[b]`` (so a row's draw does not depend on the other rows)."""
    import torch

    logprobs = processed_logprobs(logits, temperature, top_p)
    if temperature == 0:
        tokens = logprobs.argmax(dim=-1)
    else:
        u = torch.tensor([torch.rand((), generator=g, dtype=torch.float64).item() for g in gens],
                         dtype=torch.float64, device=logprobs.device)
        cdf = torch.cumsum(logprobs.double().exp(), dim=-1)
        tokens = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(-1), right=True).squeeze(-1)
        tokens = tokens.clamp(max=logprobs.shape[-1] - 1)
    return tokens, logprobs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1).tolist()


def stop_strings(params: SamplingParams) -> tuple[str, ...]:
    return tuple(x for x in params.stop if x)


def torch_cat_ones(mask: Any) -> Any:
    """``mask`` with one more (attended) column."""
    import torch

    return torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=-1)


class HFBackend:
    """Batched sampling and teacher-forced scoring for a ``sqlrl.policy.load.Policy``."""

    def __init__(self, policy: Any, *, prefix_cache: bool = True,
                 max_cached_tokens: int = DEFAULT_MAX_CACHED_TOKENS) -> None:
        self.policy = policy
        self.model = policy.model
        self.tokenizer = policy.tokenizer
        self.eos_ids = frozenset(policy.eos_token_ids)
        self.pad_id = policy.pad_token_id
        self.vocab_size = self.model.get_input_embeddings().weight.shape[0]
        self.gqa_attention = use_gqa_attention(self.model)
        self.prefix_cache: PrefixKVCache | None = None
        self.prefix_cache_off_reason: str | None = "disabled (prefix_cache=False)"
        if prefix_cache:
            why = _prefix_cache_unsupported(self.model.config)
            if why is None:
                self.prefix_cache = PrefixKVCache(max_cached_tokens)
            self.prefix_cache_off_reason = why
        self._weights_seen: tuple | None = None
        # prompt tokens asked for / actually run through the model in prefill (all calls)
        self.prefill_stats = {"prompt_tokens": 0, "prefilled_tokens": 0, "deduped_prompts": 0}

    def async_engine(self) -> Any:
        """The native ``AsyncEngine`` on this backend (``HFEngine``: continuous batching through these
        decode steps and this prefix cache; ``sqlrl.policy.engine.ProvidesEngine``). Close it after use;
        the backend stays usable."""
        from .hf_engine import HFEngine

        return HFEngine(self.policy, backend=self)

    def clear_cache(self) -> None:
        """Forget every cached prefix; call after the weights change (``generate`` also notices
        in-place parameter updates by itself)."""
        if self.prefix_cache is not None:
            self.prefix_cache.clear()
        self._weights_seen = None

    def _check_weights(self) -> None:
        seen = tuple((p.data_ptr(), p._version) for p in self.model.parameters())
        if self._weights_seen is not None and seen != self._weights_seen and self.prefix_cache is not None:
            self.prefix_cache.clear()
        self._weights_seen = seen

    # ------------------------------------------------------------------ input handling
    def _check(self, seqs: Sequence[Sequence[int]], what: str, allow_empty: bool = False) -> list[list[int]]:
        out = []
        for i, seq in enumerate(seqs):
            ids = list(seq)
            if not ids and not allow_empty:
                raise ValueError(f"{what} {i} is empty")
            for t in ids:
                if isinstance(t, bool) or not isinstance(t, int) and not hasattr(t, "__index__"):
                    raise ValueError(f"{what} {i} holds a non-integer token {t!r}")
                if not 0 <= int(t) < self.vocab_size:
                    raise ValueError(f"{what} {i} holds token id {int(t)} outside the vocabulary [0, {self.vocab_size})")
            out.append([int(t) for t in ids])
        return out

    def _left_pad(self, seqs: list[list[int]]) -> tuple[Any, Any, Any]:
        import torch

        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for r, s in enumerate(seqs):
            ids[r, width - len(s):] = torch.tensor(s, dtype=torch.long)
            mask[r, width - len(s):] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        device = self.policy.device
        return ids.to(device), mask.to(device), positions.to(device)

    # ------------------------------------------------------------------ generation
    streams_tokens = True  # generate(..., on_token=) is called as every token is sampled

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams, *,
                 on_token: Callable[[int, int], None] | None = None) -> list[Generation]:
        """``on_token(row, token_id)``: called for every sampled token, row = prompt_index * n + sample.
        A grammar (``params.structured``) is a ``ValueError``: only the engines honour one."""
        refuse_structured(params, "HFBackend.generate (a batch backend)")
        with self._attention_kernels():
            return self._generate(prompts, params, on_token)

    def _attention_kernels(self) -> Any:
        """On CUDA, scaled-dot-product attention without the cuDNN backend: it builds a plan for
        every new sequence length, and decoding makes a new length every step (measured on an H100
        with bf16: ~21 ms of CPU per attention call, generation 12-16x slower than float32)."""
        import contextlib

        import torch

        if self.model.device.type != "cuda":
            return contextlib.nullcontext()
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])

    def _generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                  on_token: Callable[[int, int], None] | None) -> list[Generation]:
        import torch

        prompts = self._check(prompts, "prompt")
        if not prompts:
            return []
        self.check_length(max(len(p) for p in prompts), params.max_new_tokens)
        n, rows = params.n, len(prompts) * params.n
        base_seed = params.seed if params.seed is not None else random.SystemRandom().getrandbits(62)
        seeds = [row_seed(base_seed, r // n, r % n) for r in range(rows)]
        gens = [torch.Generator().manual_seed(s) for s in seeds]
        stops = stop_strings(params)

        out_ids: list[list[int]] = [[] for _ in range(rows)]
        out_lp: list[list[float]] = [[] for _ in range(rows)]
        reasons: list[str | None] = [None] * rows
        pc = self.prefix_cache
        with torch.inference_mode():
            logits, mask, next_pos, cache = self.prefill(prompts, n, params.max_new_tokens)
            active = list(range(rows))  # row ids, in batch order
            while True:
                tokens, chosen = sample_tokens(logits, params.temperature, params.top_p, [gens[r] for r in active])
                keep: list[int] = []
                done: list[tuple[int, list[int]]] = []
                for b, (r, tok, lp) in enumerate(zip(active, tokens.tolist(), chosen)):
                    out_ids[r].append(tok)
                    out_lp[r].append(lp)
                    if on_token is not None:
                        on_token(r, tok)
                    reasons[r] = self.finish_reason(out_ids[r], params.max_new_tokens, stops)
                    if reasons[r] is None:
                        keep.append(b)
                    else:
                        done.append((b, prompts[r // n] + out_ids[r][:-1]))
                if pc is not None and done:
                    self.store_rows(cache, mask, done)
                if not keep:
                    break
                if len(keep) < len(active):
                    index = torch.tensor(keep, dtype=torch.long, device=mask.device)
                    cache.batch_select_indices(index)
                    mask, next_pos, tokens = mask[index], next_pos[index], tokens[index]
                    active = [active[b] for b in keep]
                logits, mask, next_pos = self.decode(tokens, mask, next_pos, cache)
        return [Generation(token_ids=tuple(out_ids[r]), logprobs=tuple(out_lp[r]),
                           text=self.tokenizer.decode(out_ids[r], skip_special_tokens=True),
                           finish_reason=reasons[r] or "length",
                           meta={"prompt_index": r // n, "sample_index": r % n, "seed": seeds[r]})
                for r in range(rows)]

    # ------------------------------------------------------------------ the decode steps (shared with HFEngine)
    def check_length(self, prompt_tokens: int, max_new_tokens: int) -> None:
        """``ValueError`` when ``prompt_tokens + max_new_tokens`` exceeds the model's positions."""
        limit = getattr(self.model.config, "max_position_embeddings", None)
        if limit is not None and prompt_tokens + max_new_tokens > limit:
            raise ValueError(f"prompt of {prompt_tokens} tokens + max_new_tokens={max_new_tokens} exceeds the "
                             f"model's {limit} positions")

    def prefill(self, prompts: list[list[int]], n: int, max_new_tokens: int) -> tuple[Any, Any, Any, Any]:
        """Prefill ``prompts`` (checked ids) through the prefix cache; ``(logits [rows, V], mask,
        next_pos, cache)`` for ``n`` rows per prompt, prompt-major (identical prompts share one prefill)."""
        import torch

        pc = self.prefix_cache
        if pc is not None:
            self._check_weights()
            distinct: dict[tuple[int, ...], int] = {}
            of_prompt = [distinct.setdefault(tuple(p), len(distinct)) for p in prompts]
            unique = [list(k) for k in distinct]
            hits = [pc.lookup(u) for u in unique]
            if self._warm_shared_prefixes(pc, unique, hits):
                hits = [pc.lookup(u) for u in unique]
        else:
            of_prompt, unique, hits = list(range(len(prompts))), prompts, [PrefixHit(0)] * len(prompts)
        self.prefill_stats["prompt_tokens"] += sum(len(p) for p in prompts)
        self.prefill_stats["prefilled_tokens"] += sum(len(u) - h.length for u, h in zip(unique, hits))
        self.prefill_stats["deduped_prompts"] += len(prompts) - len(unique)
        ids, mask, positions, cache = self._prefill_inputs(unique, hits, max_new_tokens)
        logits = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                            use_cache=True, logits_to_keep=1).logits[:, -1, :]
        expand = [u for u in of_prompt for _ in range(n)]
        if expand != list(range(len(unique))):
            index = torch.tensor(expand, dtype=torch.long, device=mask.device)
            cache.batch_select_indices(index)
            logits, mask, positions = logits[index], mask[index], positions[index]
        return logits, mask, positions[:, -1] + 1, cache

    def decode(self, tokens: Any, mask: Any, next_pos: Any, cache: Any) -> tuple[Any, Any, Any]:
        """One decode step: feed ``tokens`` (one per row) at ``next_pos``; ``(logits, mask, next_pos)`` after it."""
        mask = torch_cat_ones(mask)
        logits = self.model(input_ids=tokens.unsqueeze(-1), attention_mask=mask, position_ids=next_pos.unsqueeze(-1),
                            past_key_values=cache, use_cache=True).logits[:, -1, :]
        return logits, mask, next_pos + 1

    def finish_reason(self, ids: list[int], max_new_tokens: int, stops: tuple[str, ...]) -> str | None:
        """Why a row whose generated ids are ``ids`` (its newest last) ends now, or None (module docstring)."""
        if ids[-1] in self.eos_ids:
            return "eos"
        if stops and self._hits_stop(ids, stops, 4 * max(len(s) for s in stops) + 4):
            return "stop"
        return "length" if len(ids) >= max_new_tokens else None

    def store_rows(self, cache: Any, mask: Any, rows: Sequence[tuple[int, list[int]]]) -> None:
        """Store, for each ``(b, key)``, batch row ``b``'s KV as the prefix-cache entry of ``key`` (the
        prompt + generated ids but the last, whose KV was never computed)."""
        pc = self.prefix_cache
        if pc is None:
            return
        for b, key in rows:
            real = mask[b].bool()
            if int(real.sum()) != len(key):  # a bookkeeping bug must not poison the cache
                raise RuntimeError(f"row {b}: {int(real.sum())} cached columns for {len(key)} tokens")
            pc.store(key, [(layer.keys[b][:, real], layer.values[b][:, real]) for layer in cache.layers])

    def _prefill_inputs(self, seqs: list[list[int]], hits: Sequence[PrefixHit],
                        max_new_tokens: int = 0) -> tuple[Any, Any, Any, Any]:
        """Batch inputs that prefill only each sequence's uncached suffix.

        Layout per row: ``[pad, cached KV (c_r), pad, suffix (s_r)]`` -- the cached KV left-padded
        to the longest cached length ``C``, the suffixes left-padded to the longest suffix ``S``, so
        every row ends at the same column; the mask is 1 exactly on real columns and positions count
        real tokens only (``c_r + cumsum(suffix mask) - 1``), as if each row had been run alone.
        """
        import torch

        cached = [h.length for h in hits]
        suffixes = [s[c:] for s, c in zip(seqs, cached)]
        width_c, width_s, rows = max(cached), max(len(x) for x in suffixes), len(seqs)
        ids = torch.full((rows, width_s), self.pad_id, dtype=torch.long)
        mask = torch.zeros((rows, width_c + width_s), dtype=torch.long)
        for r, (c, x) in enumerate(zip(cached, suffixes)):
            ids[r, width_s - len(x):] = torch.tensor(x, dtype=torch.long)
            mask[r, width_c - c:width_c] = 1
            mask[r, width_c + width_s - len(x):] = 1
        offsets = torch.tensor(cached, dtype=torch.long).unsqueeze(-1)
        positions = (offsets + mask[:, width_c:].cumsum(-1) - 1).clamp(min=0)
        device = self.policy.device
        cache = growing_cache(self.model.config.num_hidden_layers, width_c + width_s + max_new_tokens)
        if width_c:
            layers = next(h.layers for h in hits if h.length)
            for layer, (k0, _) in enumerate(layers):
                keys = k0.new_zeros((rows, k0.shape[0], width_c, k0.shape[2]))
                values = torch.zeros_like(keys)
                for r, h in enumerate(hits):
                    if h.length:
                        keys[r, :, width_c - h.length:] = h.layers[layer][0]
                        values[r, :, width_c - h.length:] = h.layers[layer][1]
                cache.update(keys, values, layer)
        return ids.to(device), mask.to(device), positions.to(device), cache

    def _warm_shared_prefixes(self, pc: PrefixKVCache, unique: list[list[int]], hits: list[PrefixHit]) -> int:
        """Prefill once, and store, every long prefix that distinct prompts of this call share beyond
        what the cache holds (e.g. one database's system prompt); returns how many were stored."""
        shared: dict[tuple[int, ...], None] = {}
        for i, u in enumerate(unique):
            best = max((common_prefix_length(u, unique[j]) for j in range(i)), default=0)
            best = min(best, len(u) - 1)
            if best - hits[i].length >= MIN_SHARED_PREFIX:
                shared[tuple(u[:best])] = None
        if not shared:
            return 0
        seqs = [list(k) for k in shared]
        pre = [pc.lookup(x) for x in seqs]
        self.prefill_stats["prefilled_tokens"] += sum(len(x) - h.length for x, h in zip(seqs, pre))
        ids, mask, positions, cache = self._prefill_inputs(seqs, pre)
        self.model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                   use_cache=True, logits_to_keep=1)
        for b, x in enumerate(seqs):
            real = mask[b].bool()
            pc.store(x, [(layer.keys[b][:, real], layer.values[b][:, real]) for layer in cache.layers])
        return len(seqs)

    def _hits_stop(self, ids: list[int], stops: tuple[str, ...], window: int) -> bool:
        tail = self.tokenizer.decode(ids[-window:], skip_special_tokens=True)
        return any(s in tail for s in stops)

    # ------------------------------------------------------------------ scoring
    def completion_logprobs(self, pairs: Sequence[tuple[Sequence[int], Sequence[int]]], *,
                            temperature: float = 1.0, top_p: float = 1.0) -> list[Any]:
        """Teacher-forced log-probs (1-D tensors, graph kept if grad is enabled) of each completion's tokens."""
        import torch

        if temperature < 0 or not 0 < top_p <= 1:
            raise ValueError("temperature >= 0 and 0 < top_p <= 1")
        prompts = self._check([p for p, _ in pairs], "prompt")
        completions = self._check([c for _, c in pairs], "completion", allow_empty=True)
        if not prompts:
            return []
        ids, mask, positions = self._left_pad([p + c for p, c in zip(prompts, completions)])
        width = ids.shape[1]
        logits = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False).logits
        out = []
        for r, comp in enumerate(completions):
            if not comp:
                out.append(logits.new_zeros((0,)))
                continue
            # the token at column j is predicted by the logits at column j - 1
            cols = torch.arange(width - len(comp) - 1, width - 1, device=logits.device)
            lp = processed_logprobs(logits[r, cols], temperature, top_p)
            target = torch.tensor(comp, dtype=torch.long, device=logits.device)
            out.append(lp.gather(-1, target.unsqueeze(-1)).squeeze(-1))
        return out

    def score(self, pairs: Sequence[tuple[Sequence[int], Sequence[int]]], *, temperature: float = 1.0,
              top_p: float = 1.0) -> list[tuple[float, ...]]:
        """``completion_logprobs`` as plain floats, without a graph. ``temperature=0`` scores at temperature 1."""
        import torch

        with torch.inference_mode():
            return [tuple(t.tolist()) for t in self.completion_logprobs(pairs, temperature=temperature, top_p=top_p)]
