"""Losses of one micro-batch: SFT negative log-likelihood and GRPO, with verl's ``core_algos`` math.

``LOSSES`` is the registry ``name -> fn(model, batch, cfg) -> LossOutput``. Every loss is the
*local* aggregate of its micro-batch (verl's ``agg_loss`` with no global batch info), and
``LossOutput.weight`` is what that aggregate averages over: trained tokens for ``"token-mean"``,
sequences with a trained token for the ``"seq-mean-*"`` modes. The engine gets the global loss by
summing ``loss * weight / total_weight`` over micro-batches (and ranks), so the result does not
depend on how a batch is split.

Guarantees:
- ``forward_logprobs(model, batch)`` returns ``[B, T]`` float32 log-probs where column ``t`` is
  ``log p(input_ids[t] | input_ids[:t])`` under ``logits / temperature`` — the same numbers
  ``HFBackend`` reports for sampled tokens at ``top_p=1`` (tested at 1e-4) — and 0 on column 0 and
  on padding; with ``with_entropy`` also the entropy of each of those distributions (same layout).
- ``grpo_loss`` = verl ``get_policy_loss_fn(cfg.policy_loss)`` (clipped ratio loss, given an
  ``ActorConfig`` built from ``cfg``) ``- entropy_coef * agg_loss(entropy)``
  ``+ kl_coef * agg_loss(kl_penalty(logprob, ref_logprob, cfg.kl_type))`` — the combination verl's
  own ``ppo_loss`` uses; no GRPO math is re-derived here. ``kl_coef > 0`` without
  ``batch.ref_logprobs``, or a batch without ``old_logprobs``/``advantages``, is a ``ValueError``.
- A micro-batch with no trained token gives ``weight == 0`` and a zero loss that still depends on
  the model (so every rank runs the same forward/backward), never NaN.
- ``metrics`` are plain floats, local to the micro-batch: ``loss``, ``n_tokens``, ``n_sequences``
  and, for GRPO, ``pg_loss``, ``pg_clipfrac``, ``pg_clipfrac_lower``, ``ppo_kl``, ``entropy`` and
  (when ``ref_logprobs`` are present) ``kl``, plus verl's rollout-vs-train mismatch
  (``rollout_probs_diff_max``/``_mean``, ``rollout_actor_probs_pearson_corr``: the sampler's token
  probabilities against the learner's; the engine averages the per-micro-batch values);
  for SFT ``nll`` (mean over tokens).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from .batch import TokenBatch
from .config import GRPOConfig, SFTConfig


@dataclass(frozen=True)
class LossOutput:
    loss: torch.Tensor  # scalar, with grad
    weight: float  # what ``loss`` averages over (see the module doc)
    metrics: dict[str, float]


def loss_weight(batch: TokenBatch, loss_agg_mode: str) -> float:
    return batch.n_tokens if loss_agg_mode == "token-mean" else batch.n_sequences


def forward_logprobs(model: Any, batch: TokenBatch, *, temperature: float = 1.0, with_entropy: bool = False,
                     entropy_grad: bool = True, trained_only: bool = False,
                     share_prefix: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Teacher-forced ``[B, T]`` log-probs (and entropies) of ``batch.input_ids`` under ``model``.

    ``trained_only``: compute the vocabulary projection only from the first column any row trains
    on (``loss_mask``) to the end — the prompt's logits are never needed by a loss, and on long
    prompts they are most of the LM-head and log-softmax work. Columns before that are 0; the
    trained columns are identical to the full computation.

    ``share_prefix`` (with ``trained_only``): rows whose prompts -- every column before their first
    trained one -- are identical (a GRPO group: one prompt, ``group_size`` samples) run the prompt
    once and their continuations on its KV cache (``shared_prefix_logprobs``); other rows run as
    above. The trained columns equal the full computation up to float rounding (and so do the
    gradients: the prompt's activations get the sum of every row's gradient).

    On an FSDP2-sharded model ``share_prefix`` applies only without grad (reference log-probs):
    FSDP2 frees a layer's gathered weights when the backward reaches that layer's *output*, but the
    prompt pass also feeds the continuation through its KV cache, so part of its backward comes
    later, on freed weights ("setStorage ... storage of size 0"). With grad, rows run as above."""
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}")
    share_prefix = share_prefix and not (torch.is_grad_enabled() and _fsdp_sharded(model))
    clusters = prompt_clusters(batch) if share_prefix and trained_only else []
    if not clusters:
        return _forward(model, batch, temperature, with_entropy, entropy_grad, trained_only)
    shared = {r for _, rows in clusters for r in rows}
    rest = [r for r in range(len(batch)) if r not in shared]
    parts = [(rows, shared_prefix_logprobs(model, batch.select(rows), p, temperature, with_entropy, entropy_grad))
             for p, rows in clusters]
    if rest:
        parts.append((rest, _forward(model, batch.select(rest), temperature, with_entropy, entropy_grad, True)))
    order = torch.tensor([r for rows, _ in parts for r in rows])
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(len(order))
    width = batch.input_ids.shape[1]

    def join(k: int) -> torch.Tensor:  # select() trims padding: pad each part back to the batch's width
        return torch.cat([torch.nn.functional.pad(out[k], (0, width - out[k].shape[1])) for _, out in parts])[inverse]

    return join(0), (join(1) if with_entropy else None)


def _fsdp_sharded(model: Any) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def prompt_clusters(batch: TokenBatch) -> list[tuple[int, list[int]]]:
    """``(P, rows)`` for every set of >= 2 rows of ``batch`` with the same prompt: the same tokens,
    all real, before the same first trained column ``P + 1`` (``P >= 1``). ``P`` is where their
    shared forward stops: column ``P``'s logits predict the first trained token, so it is run with
    the continuation. Rows in input order; clusters in order of their first row."""
    trained = batch.loss_mask.bool()
    real = batch.attention_mask.bool()
    groups: dict[tuple[int, ...], list[int]] = {}
    for r in range(len(batch)):
        cols = torch.nonzero(trained[r]).flatten()
        if not len(cols) or int(cols[0]) < 2 or not bool(real[r, :int(cols[0])].all()):
            continue
        groups.setdefault(tuple(batch.input_ids[r, :int(cols[0])].tolist()), []).append(r)
    return [(len(key) - 1, rows) for key, rows in groups.items() if len(rows) >= 2]


def shared_prefix_logprobs(model: Any, batch: TokenBatch, prefix: int, temperature: float, with_entropy: bool,
                           entropy_grad: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``forward_logprobs(trained_only=True)`` for rows whose first ``prefix`` columns are the same
    real tokens and whose first trained column is ``>= prefix + 1``: the prefix runs once (batch 1,
    with grad), its KV cache is repeated for every row, and the rest of the columns run on it.
    Columns ``<= prefix`` are 0."""
    width = batch.input_ids.shape[1]
    head = model(input_ids=batch.input_ids[:1, :prefix], attention_mask=batch.attention_mask[:1, :prefix],
                 use_cache=True, logits_to_keep=1)
    cache = head.past_key_values
    cache.batch_repeat_interleave(len(batch))
    out = model(input_ids=batch.input_ids[:, prefix:], attention_mask=batch.attention_mask,
                past_key_values=cache, use_cache=True, logits_to_keep=width - prefix)
    return _logprobs_from(out.logits, batch, prefix + 1, temperature, with_entropy, entropy_grad)


def _forward(model: Any, batch: TokenBatch, temperature: float, with_entropy: bool, entropy_grad: bool,
             trained_only: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    width = batch.input_ids.shape[1]
    first = 1
    if trained_only and width > 1:
        cols = torch.nonzero(batch.loss_mask.bool().any(dim=0)).flatten()
        first = max(1, int(cols[0])) if len(cols) else width - 1
    out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False,
                logits_to_keep=width - first + 1)
    if width == 1:  # nothing is predicted; keep the graph for a zero loss
        zero = out.logits[..., 0].float() * 0.0
        return zero, (zero if with_entropy else None)
    return _logprobs_from(out.logits, batch, first, temperature, with_entropy, entropy_grad)


def _logprobs_from(logits: torch.Tensor, batch: TokenBatch, first: int, temperature: float, with_entropy: bool,
                   entropy_grad: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``[B, T]`` log-probs (and entropies) from the logits of columns ``first - 1 .. T - 1`` (the
    last is dropped: it predicts nothing); columns before ``first`` and padding are 0."""
    import verl.utils.torch_functional as verl_F

    real = batch.attention_mask.bool()
    logits = logits[:, :-1].float()  # predicts columns first .. width-1
    if temperature != 1.0:
        logits = logits / temperature
    lp = verl_F.logprobs_from_logits(logits, batch.input_ids[:, first:], inplace_backward=False)
    lp = torch.where(real, torch.nn.functional.pad(lp, (first, 0)), 0.0)
    entropy = None
    if with_entropy:
        with torch.set_grad_enabled(torch.is_grad_enabled() and entropy_grad):
            entropy = verl_F.entropy_from_logits(logits)
        entropy = torch.where(real, torch.nn.functional.pad(entropy, (first, 0)), 0.0)
    return lp, entropy


def _zero(batch: TokenBatch, *tensors: torch.Tensor | None) -> LossOutput:
    loss = sum((t * 0.0).sum() for t in tensors if t is not None)
    return LossOutput(loss=loss, weight=0.0, metrics={"loss": 0.0, "n_tokens": 0.0, "n_sequences": 0.0})


def _check_cfg(cfg: Any, kind: type) -> None:
    if not isinstance(cfg, kind):
        raise ValueError(f"expected a {kind.__name__}, got {type(cfg).__name__}")


def sft_loss(model: Any, batch: TokenBatch, cfg: SFTConfig) -> LossOutput:
    """Mean negative log-likelihood of the trained tokens (aggregated by ``cfg.loss_agg_mode``)."""
    from verl.trainer.ppo import core_algos

    _check_cfg(cfg, SFTConfig)
    lp, _ = forward_logprobs(model, batch, trained_only=True)
    weight = loss_weight(batch, cfg.loss_agg_mode)
    if weight == 0:
        return _zero(batch, lp)
    mask = batch.loss_mask
    loss = core_algos.agg_loss(loss_mat=-lp, loss_mask=mask, loss_agg_mode=cfg.loss_agg_mode,
                               loss_scale_factor=cfg.loss_scale_factor)
    nll = float((-(lp.detach() * mask).sum() / mask.sum()).item())
    return LossOutput(loss=loss, weight=weight, metrics={"loss": float(loss.item()), "nll": nll,
                                                         "n_tokens": batch.n_tokens,
                                                         "n_sequences": batch.n_sequences})


def actor_config(cfg: GRPOConfig) -> Any:
    """The ``verl.workers.config.ActorConfig`` verl's policy-loss functions read, built from ``cfg``."""
    from verl.workers.config import ActorConfig, PolicyLossConfig

    return ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1,
                       clip_ratio=cfg.clip_ratio_low, clip_ratio_low=cfg.clip_ratio_low,
                       clip_ratio_high=cfg.clip_ratio_high, clip_ratio_c=cfg.clip_ratio_c,
                       loss_agg_mode=cfg.loss_agg_mode, loss_scale_factor=cfg.loss_scale_factor,
                       policy_loss=PolicyLossConfig(loss_mode=cfg.policy_loss),
                       entropy_coeff=cfg.entropy_coef, use_kl_loss=cfg.kl_coef > 0,
                       kl_loss_coef=cfg.kl_coef, kl_loss_type=cfg.kl_type,
                       global_batch_info={"loss_scale_factor": cfg.loss_scale_factor})


def _float(v: Any) -> float | None:
    if isinstance(v, torch.Tensor):
        return float(v.detach().item()) if v.numel() == 1 else None
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    return None


def grpo_loss_from_logprobs(log_prob: torch.Tensor, entropy: torch.Tensor | None, batch: TokenBatch,
                            cfg: GRPOConfig) -> LossOutput:
    """The GRPO loss given the current policy's ``[B, T]`` log-probs (and entropies) for ``batch``."""
    from verl.trainer.ppo import core_algos

    _check_cfg(cfg, GRPOConfig)
    if batch.old_logprobs is None or batch.advantages is None:
        raise ValueError("grpo_loss needs a batch with old_logprobs and advantages (build it with rl_batch)")
    if cfg.kl_coef > 0 and batch.ref_logprobs is None:
        raise ValueError(f"kl_coef={cfg.kl_coef} needs reference log-probs: call batch.with_ref_logprobs(...) "
                         "with the reference model's forward_logprobs first")
    if cfg.entropy_coef > 0 and entropy is None:
        raise ValueError(f"entropy_coef={cfg.entropy_coef} needs the entropies (forward_logprobs(with_entropy=True))")
    if log_prob.shape != batch.input_ids.shape:
        raise ValueError(f"log_prob has shape {tuple(log_prob.shape)}, the batch {tuple(batch.input_ids.shape)}")
    weight = loss_weight(batch, cfg.loss_agg_mode)
    if weight == 0:
        return _zero(batch, log_prob, entropy)
    mask = batch.loss_mask

    def agg(mat: torch.Tensor) -> torch.Tensor:
        return core_algos.agg_loss(loss_mat=mat, loss_mask=mask, loss_agg_mode=cfg.loss_agg_mode,
                                   loss_scale_factor=cfg.loss_scale_factor)

    pg_loss, pg_metrics = core_algos.get_policy_loss_fn(cfg.policy_loss)(
        old_log_prob=batch.old_logprobs, log_prob=log_prob, advantages=batch.advantages, response_mask=mask,
        loss_agg_mode=cfg.loss_agg_mode, config=actor_config(cfg), rollout_is_weights=None)
    metrics = {k.removeprefix("actor/"): f for k, v in pg_metrics.items() if (f := _float(v)) is not None}
    metrics.update(rollout_mismatch(log_prob, batch.old_logprobs, mask))
    metrics["pg_loss"] = float(pg_loss.detach().item())
    loss = pg_loss
    if entropy is not None:
        entropy_term = agg(entropy)
        metrics["entropy"] = float(entropy_term.detach().item())
        if cfg.entropy_coef > 0:
            loss = loss - cfg.entropy_coef * entropy_term
    if batch.ref_logprobs is not None:
        kl_term = agg(core_algos.kl_penalty(logprob=log_prob, ref_logprob=batch.ref_logprobs,
                                            kl_penalty=cfg.kl_type))
        metrics["kl"] = float(kl_term.detach().item())
        if cfg.kl_coef > 0:
            loss = loss + cfg.kl_coef * kl_term
    metrics.update(loss=float(loss.detach().item()), n_tokens=batch.n_tokens, n_sequences=batch.n_sequences)
    return LossOutput(loss=loss, weight=weight, metrics=metrics)


def rollout_mismatch(log_prob: torch.Tensor, old_log_prob: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """verl's rollout-vs-train metrics (``verl.utils.debug.metrics``): the absolute difference of the
    token probabilities the sampler reported and the learner computes (max, mean) and their Pearson
    correlation, over trained tokens. Near 0 / 1 when the sampler ran the learner's weights."""
    from verl.utils.debug.metrics import calculate_log_prob_diff, pearson_correlation_coefficient

    keep = mask.bool()
    if not keep.any():
        return {}
    train, rollout = log_prob.detach().float().exp(), old_log_prob.detach().float().exp()
    diff = calculate_log_prob_diff(train, rollout, keep)
    out = {"rollout_probs_diff_max": float(diff.max().item()), "rollout_probs_diff_mean": float(diff.mean().item())}
    if int(keep.sum()) > 1:
        out["rollout_actor_probs_pearson_corr"] = float(pearson_correlation_coefficient(train, rollout, keep))
    return out


def grpo_loss(model: Any, batch: TokenBatch, cfg: GRPOConfig) -> LossOutput:
    """``forward_logprobs`` at ``cfg.temperature`` (trained columns; a group's prompt run once when
    ``cfg.share_prefix``), then ``grpo_loss_from_logprobs``."""
    _check_cfg(cfg, GRPOConfig)
    log_prob, entropy = forward_logprobs(model, batch, temperature=cfg.temperature, with_entropy=True,
                                         entropy_grad=cfg.entropy_coef > 0, trained_only=True,
                                         share_prefix=cfg.share_prefix)
    return grpo_loss_from_logprobs(log_prob, entropy, batch, cfg)


LOSSES: dict[str, Callable[[Any, TokenBatch, Any], LossOutput]] = {"sft": sft_loss, "grpo": grpo_loss}
