"""``HFBackend``: the ``GenerationBackend`` for a local transformers model, with its own KV-cache decode loop.

One ``generate`` call is one left-padded batch: every prompt is prefilled once, the cache is
repeated ``n`` times (the ``n`` samples of a prompt sit in the same batch), then one token per row is
decoded per step; rows that finish are dropped from the batch (and the cache). Guarantees, on top
of ``sqlrl.policy.types``:
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
from typing import Any, Sequence

from .types import Generation, SamplingParams

_SEED_MOD = 2**63 - 1


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


def _row_seed(seed: int, prompt_index: int, sample_index: int) -> int:
    return (seed * 1_000_003 + prompt_index * 7919 + sample_index) % _SEED_MOD


class HFBackend:
    """Batched sampling and teacher-forced scoring for a ``sqlrl.policy.load.Policy``."""

    def __init__(self, policy: Any) -> None:
        self.policy = policy
        self.model = policy.model
        self.tokenizer = policy.tokenizer
        self.eos_ids = frozenset(policy.eos_token_ids)
        self.pad_id = policy.pad_token_id
        self.vocab_size = self.model.get_input_embeddings().weight.shape[0]

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
    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        import torch
        from transformers import DynamicCache

        prompts = self._check(prompts, "prompt")
        if not prompts:
            return []
        limit = getattr(self.model.config, "max_position_embeddings", None)
        longest = max(len(p) for p in prompts)
        if limit is not None and longest + params.max_new_tokens > limit:
            raise ValueError(f"prompt of {longest} tokens + max_new_tokens={params.max_new_tokens} exceeds the "
                             f"model's {limit} positions")
        n, rows = params.n, len(prompts) * params.n
        base_seed = params.seed if params.seed is not None else random.SystemRandom().getrandbits(62)
        seeds = [_row_seed(base_seed, r // n, r % n) for r in range(rows)]
        gens = [torch.Generator().manual_seed(s) for s in seeds]
        stops = tuple(s for s in params.stop if s)
        window = 4 * max((len(s) for s in stops), default=0) + 4

        out_ids: list[list[int]] = [[] for _ in range(rows)]
        out_lp: list[list[float]] = [[] for _ in range(rows)]
        reasons: list[str | None] = [None] * rows
        ids, mask, positions = self._left_pad(prompts)
        cache = DynamicCache()
        with torch.inference_mode():
            logits = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                                use_cache=True, logits_to_keep=1).logits[:, -1, :]
            if n > 1:
                cache.batch_repeat_interleave(n)
                logits = logits.repeat_interleave(n, dim=0)
                mask = mask.repeat_interleave(n, dim=0)
                positions = positions.repeat_interleave(n, dim=0)
            next_pos = positions[:, -1] + 1
            active = list(range(rows))  # row ids, in batch order
            for step in range(params.max_new_tokens):
                logprobs = processed_logprobs(logits, params.temperature, params.top_p)
                if params.temperature == 0:
                    tokens = logprobs.argmax(dim=-1)
                else:
                    u = torch.tensor([torch.rand((), generator=gens[r], dtype=torch.float64).item() for r in active],
                                     dtype=torch.float64, device=logprobs.device)
                    cdf = torch.cumsum(logprobs.double().exp(), dim=-1)
                    tokens = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(-1), right=True).squeeze(-1)
                    tokens = tokens.clamp(max=logprobs.shape[-1] - 1)
                chosen = logprobs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1).tolist()
                keep: list[int] = []
                for b, (r, tok, lp) in enumerate(zip(active, tokens.tolist(), chosen)):
                    out_ids[r].append(tok)
                    out_lp[r].append(lp)
                    if tok in self.eos_ids:
                        reasons[r] = "eos"
                    elif stops and self._hits_stop(out_ids[r], stops, window):
                        reasons[r] = "stop"
                    elif step + 1 == params.max_new_tokens:
                        reasons[r] = "length"
                    else:
                        keep.append(b)
                if not keep:
                    break
                if len(keep) < len(active):
                    index = torch.tensor(keep, dtype=torch.long, device=mask.device)
                    cache.batch_select_indices(index)
                    mask, next_pos, tokens = mask[index], next_pos[index], tokens[index]
                    active = [active[b] for b in keep]
                mask = torch.cat([mask, mask.new_ones((len(active), 1))], dim=-1)
                logits = self.model(input_ids=tokens.unsqueeze(-1), attention_mask=mask,
                                    position_ids=next_pos.unsqueeze(-1), past_key_values=cache,
                                    use_cache=True).logits[:, -1, :]
                next_pos = next_pos + 1
        return [Generation(token_ids=tuple(out_ids[r]), logprobs=tuple(out_lp[r]),
                           text=self.tokenizer.decode(out_ids[r], skip_special_tokens=True),
                           finish_reason=reasons[r] or "length",
                           meta={"prompt_index": r // n, "sample_index": r % n, "seed": seeds[r]})
                for r in range(rows)]

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
