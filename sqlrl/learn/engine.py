"""The training engine: one rank of the learner (``Learner``), plain or FSDP2-sharded.

``Learner(model, optim, ...)`` loads a Hugging Face checkpoint folder (a ``sqlrl.policy.load``
name or path) in fp32, optionally a frozen reference copy (for KL), and — when it is one rank of a
group (``dist=DistConfig(...)``, required for ``world_size > 1``) — shards both with FSDP2
(``sqlrl.learn.fsdp.shard_model``). Without a group it runs in-process, unsharded; "bf16" then
means ``torch.autocast`` (bf16 matmuls, fp32 weights), with FSDP it means FSDP2's
``MixedPrecisionPolicy`` (bf16 parameters and compute, fp32 reduction and master weights).

``step(batch, loss, loss_cfg)`` is one optimizer update over a ``TokenBatch`` (this rank's rows):
- micro-batches of ``optim.micro_batch_size`` rows; every rank runs the same number of
  forward/backward passes (a rank with fewer repeats its last micro-batch at weight 0), so FSDP's
  collectives always pair up;
- each micro-batch's ``LossOutput`` is back-propagated as ``loss * weight``; after the last one the
  gradients are divided by the global weight (sum of ``weight`` over all micro-batches and ranks,
  times ``1/world_size`` under FSDP, which averages over ranks). The update therefore equals the
  single-process full-batch update, whatever the micro-batch size or the number of ranks;
- reference log-probs (``loss_cfg.kl_coef > 0`` and the batch has none; trained columns) come from the frozen
  reference model under ``no_grad`` before the update;
- global grad-norm clipping (DTensor-aware ``clip_grad_norm_``), ``AdamW`` step, ``LambdaLR`` step;
  a non-finite grad norm skips the update (reported as ``skipped=1``, the step counter stays);
- after the update the freed heap goes back to the OS (``sqlrl.memory.trim``: on CPU the step's
  activations and gradients otherwise stay resident as heap garbage, step after step);
- returns metrics identical on every rank: ``loss`` and the loss's own metrics (weighted by
  ``weight`` over all micro-batches and ranks; counts named ``n_*`` are summed instead), ``lr`` (the lr used), ``grad_norm`` (before clipping), ``tokens``
  (sum over ranks), ``tokens_per_s``, ``step_time_s`` (slowest rank), ``micro_batches``, ``step``,
  ``version``, ``skipped``.
Bad input (unknown loss, a rank with an empty batch, zero total loss weight, KL without a
reference) raises ``ValueError`` on every rank alike — never a hang in a collective.

``version`` is the number of updates applied (0 = the loaded weights); ``full_state_dict()`` is a
collective under FSDP that returns full fp32 CPU tensors with Hugging Face keys on rank 0 ({} on
the others); unsharded it returns a CPU copy.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections import defaultdict
from typing import Any, Mapping

from sqlrl.memory import trim as trim_heap

from .fsdp import DistConfig, check_precision, default_device, init_distributed, shard_model
from .optim import OptimConfig, build_optimizer, build_scheduler

COUNT_PREFIX = "n_"  # loss metrics named n_* are counts: summed over micro-batches and ranks


class Learner:
    def __init__(self, model: str | os.PathLike, optim: OptimConfig | None = None, *,
                 mixed_precision: str = "float32", reference: bool = False,
                 dist: DistConfig | None = None, shard: bool | None = None,
                 device: str | None = None, seed: int = 0,
                 cache_dir: str | os.PathLike | None = None) -> None:
        import torch

        from sqlrl.policy.load import load_policy

        self.device = device or default_device()
        mixed_precision = check_precision(mixed_precision, self.device)  # fp32 / bf16 normalised
        self.optim = optim or OptimConfig()
        self.mixed_precision = mixed_precision
        self.rank, self.world_size = (dist.rank, dist.world_size) if dist else (0, 1)
        self.sharded = (self.world_size > 1) if shard is None else bool(shard)
        if self.world_size > 1 and not self.sharded:
            raise ValueError("a learner group of more than one rank must shard (FSDP2); shard=False "
                             "is only valid for a single rank")
        if self.sharded and dist is None:
            raise ValueError("sharding needs a process group: pass dist=DistConfig(rank=0, world_size=1, ...)")
        self.mesh = init_distributed(dist, self.device) if dist else None
        torch.manual_seed(seed)
        policy = load_policy(model, dtype="float32", device=self.device, cache_dir=cache_dir)
        self.path, self.tokenizer = policy.path, policy.tokenizer
        self.model = policy.model.train()
        self.ref_model = None
        if reference:
            ref = load_policy(policy.path, dtype="float32", device=self.device).model.eval()
            self.ref_model = ref.requires_grad_(False)
        if self.sharded:
            shard_model(self.model, self.mesh, mixed_precision)
            if self.ref_model is not None:
                shard_model(self.ref_model, self.mesh, mixed_precision)
        self.optimizer = build_optimizer([p for p in self.model.parameters() if p.requires_grad], self.optim)
        self.scheduler = build_scheduler(self.optimizer, self.optim)
        self.step_count = 0

    # ----------------------------------------------------------------------------------- helpers
    @property
    def version(self) -> int:
        return self.step_count

    @property
    def config(self) -> Any:
        return self.model.config

    def autocast(self) -> Any:
        import torch

        if self.mixed_precision == "bfloat16" and not self.sharded:
            return torch.autocast(self.device.split(":")[0], dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _distributed(self) -> bool:
        import torch.distributed as dist

        return self.world_size > 1 and dist.is_initialized()

    def _all_reduce(self, values: list[float], op: str = "sum") -> list[float]:
        import torch
        import torch.distributed as dist

        if not self._distributed():
            return list(values)
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op={"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}[op])
        return t.tolist()

    def _gather(self, obj: Any) -> list[Any]:
        import torch.distributed as dist

        if not self._distributed():
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def _fail_together(self, message: str | None) -> None:
        """Every rank raises if any rank has a problem (so none is left waiting in a collective)."""
        messages = [m for m in self._gather(message) if m]
        if messages:
            raise ValueError(messages[0] if len(set(messages)) == 1 else "; ".join(sorted(set(messages))))

    def _ref_logprobs(self, mb: Any, loss_cfg: Any) -> Any:
        import torch

        from .losses import forward_logprobs

        with torch.no_grad(), self.autocast():
            logprobs, _ = forward_logprobs(self.ref_model, mb, temperature=getattr(loss_cfg, "temperature", 1.0),
                                           trained_only=True, share_prefix=getattr(loss_cfg, "share_prefix", False))
        return logprobs.float()

    # -------------------------------------------------------------------------------------- step
    def step(self, batch: Any, loss: str, loss_cfg: Any) -> dict[str, float]:
        import torch

        from .losses import LOSSES

        t0 = time.perf_counter()
        fn = LOSSES.get(loss)
        kl = float(getattr(loss_cfg, "kl_coef", 0.0) or 0.0) > 0
        problem = None
        if fn is None:
            problem = f"unknown loss {loss!r}; known: {', '.join(sorted(LOSSES))}"
        elif len(batch) == 0:
            problem = f"rank {self.rank} got an empty batch (a group of {self.world_size} needs >= 1 row per rank)"
        elif kl and self.ref_model is None and batch.ref_logprobs is None:
            problem = "kl_coef > 0 needs a reference model (Learner(reference=True)) or batch.ref_logprobs"
        self._fail_together(problem)

        batch = batch.to(self.device)
        micro = list(batch.micro_batches(self.optim.micro_batch_size))
        n_passes = int(self._all_reduce([len(micro)], "max")[0])
        self.optimizer.zero_grad(set_to_none=True)
        weight, sums = 0.0, defaultdict(float)
        for i in range(n_passes):
            real = i < len(micro)
            mb = micro[min(i, len(micro) - 1)]
            if kl and mb.ref_logprobs is None:
                mb = mb.with_ref_logprobs(self._ref_logprobs(mb, loss_cfg))
            with self.autocast():
                out = fn(self.model, mb, loss_cfg)
            w = float(out.weight) if real else 0.0
            (out.loss * w).backward()
            if real:
                weight += w
                local = {"loss": float(out.loss.detach()), **out.metrics}
                for key, value in local.items():
                    if value is not None:
                        sums[key] += float(value) * (1.0 if key.startswith(COUNT_PREFIX) else w)
        total_weight = self._all_reduce([weight])[0]
        if not total_weight > 0:
            self.optimizer.zero_grad(set_to_none=True)
            raise ValueError("the batch has zero total loss weight (no loss tokens on any rank)")
        factor = (self.world_size if self.sharded else 1) / total_weight
        params = [p for p in self.model.parameters() if p.grad is not None]
        for p in params:
            p.grad.mul_(factor)
        max_norm = self.optim.grad_clip if self.optim.grad_clip else math.inf
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        grad_norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
        lr = float(self.scheduler.get_last_lr()[0])
        skipped = not math.isfinite(grad_norm)
        if skipped:
            self.optimizer.zero_grad(set_to_none=True)
        else:
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.step_count += 1
        trim_heap()  # the step's activations and gradients are free: give their heap pages back
        elapsed = time.perf_counter() - t0
        gathered = self._gather((dict(sums), int(batch.n_tokens), elapsed))
        merged: dict[str, float] = defaultdict(float)
        for rank_sums, _, _ in gathered:
            for key, value in rank_sums.items():
                merged[key] += value
        tokens = float(sum(g[1] for g in gathered))
        slowest = max(g[2] for g in gathered)
        metrics = {key: value if key.startswith(COUNT_PREFIX) else value / total_weight
                   for key, value in sorted(merged.items())}
        metrics.update(lr=lr, grad_norm=grad_norm, tokens=tokens, tokens_per_s=tokens / slowest,
                       step_time_s=slowest, micro_batches=float(n_passes), weight=total_weight,
                       step=float(self.step_count), version=float(self.version), skipped=float(skipped))
        return metrics

    # ------------------------------------------------------------------------------------ weights
    def full_state_dict(self) -> dict[str, Any]:
        """Full fp32 CPU weights with Hugging Face keys (collective under FSDP: rank 0 gets them)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        if self.sharded:
            return get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True,
                                                                            cpu_offload=True))
        return {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}

    def load_full_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Load full weights (collective under FSDP: only rank 0's ``state_dict`` is read)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        if self.sharded:
            set_model_state_dict(self.model, dict(state_dict),
                                 options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
        else:
            self.model.load_state_dict(dict(state_dict))

    def shutdown(self) -> None:
        from .fsdp import destroy_distributed

        if self.world_size > 1 or self.sharded:
            destroy_distributed()
