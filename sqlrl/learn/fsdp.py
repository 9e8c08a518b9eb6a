"""Process groups and FSDP2 sharding for the learner (same code on CPU/gloo and GPU/NCCL).

Guarantees:
- ``DistConfig`` (frozen) names one rank of a group: rank, world size, rendezvous address/port and
  backend ("auto" = "nccl" when CUDA is available, else "gloo"). ``init_distributed(cfg)`` joins the
  group (idempotent for the same rank/world size; a different live group is an error), sets the
  CUDA device from ``LOCAL_RANK``/the visible devices, and returns the ``DeviceMesh`` over all ranks.
- ``shard_model(model, mesh, mixed_precision)`` applies ``torch.distributed.fsdp.fully_shard`` to
  every decoder layer (``model.model.layers``), then to the root; parameters stay as the model's
  own FQNs (so ``get_model_state_dict`` gives Hugging Face keys). ``MIXED_PRECISION`` is the registry
  of policies: "float32" (none) and "bfloat16" (bf16 parameters/compute, fp32 gradient reduction, fp32
  master weights and optimizer state). FSDP2 works on CPU with gloo in torch 2.13 (reduce-scatter
  and all-gather included): verified by tests/actors/test_learner_fsdp.py.
- Precision has one spelling (``sqlrl.policy.spec.dtype_name``): ``float32`` / ``bfloat16``;
  ``fp32`` / ``bf16`` are accepted as input and normalised (``precision_name``).
- ``bf16_supported(device)`` says whether bf16 compute is usable; asking for "bfloat16" where it is not
  raises ``ValueError``. On a CPU, "bfloat16" without AVX512-BF16/AMX (``cpu_bf16_hardware()``)
  warns ``SlowPrecisionWarning``: it runs, emulated, several times slower than fp32.
- ``free_port(host)`` returns a port that was free on ``host`` a moment ago (rendezvous).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable

BACKENDS = ("auto", "gloo", "nccl")


@dataclass(frozen=True)
class DistConfig:
    rank: int
    world_size: int
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    backend: str = "auto"
    timeout_s: float = 600.0  # a collective that waits longer fails instead of hanging

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown backend {self.backend!r}; known: {', '.join(BACKENDS)}")
        if not (self.world_size >= 1 and 0 <= self.rank < self.world_size):
            raise ValueError(f"rank {self.rank} is not in a group of {self.world_size}")


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_backend(backend: str, device: str) -> str:
    if backend != "auto":
        return backend
    return "nccl" if device.startswith("cuda") else "gloo"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def init_distributed(cfg: DistConfig, device: str | None = None) -> Any:
    """Join the process group described by ``cfg``; returns a 1-D ``DeviceMesh`` over it."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    device = device or default_device()
    if dist.is_initialized():
        if (dist.get_rank(), dist.get_world_size()) != (cfg.rank, cfg.world_size):
            raise RuntimeError(f"this process is already rank {dist.get_rank()} of "
                               f"{dist.get_world_size()}, not rank {cfg.rank} of {cfg.world_size}")
    else:
        if device.startswith("cuda"):
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
        dist.init_process_group(backend=resolve_backend(cfg.backend, device),
                                init_method=f"tcp://{cfg.master_addr}:{cfg.master_port}",
                                rank=cfg.rank, world_size=cfg.world_size,
                                timeout=timedelta(seconds=cfg.timeout_s))
    return init_device_mesh(device.split(":")[0], (cfg.world_size,))


def destroy_distributed() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def bf16_supported(device: str) -> bool:
    import torch

    if device.startswith("cuda"):
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return True  # CPU: bf16 kernels exist for every op the models use (slow without AVX512-BF16/AMX)


def cpu_bf16_hardware() -> bool:
    """Whether this CPU computes bf16 matmuls natively (AVX512-BF16 or AMX, as oneDNN reports it).
    With it a SmolLM2 update in bf16 autocast ran ~2x faster than fp32 (docs/learner.md); without it
    torch emulates bf16 and the same update ran 4-5x slower."""
    import torch

    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


class SlowPrecisionWarning(UserWarning):
    """bf16 asked for on a CPU that emulates it."""


def _bf16() -> Any:
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


# the one spelling of precision (sqlrl.policy.spec.dtype_name; fp32 / bf16 accepted as input)
MIXED_PRECISION: dict[str, Callable[[], Any]] = {"float32": lambda: None, "bfloat16": _bf16}


def precision_name(mixed_precision: str) -> str:
    """``mixed_precision`` as a ``MIXED_PRECISION`` key (``fp32`` -> ``float32``, ``bf16`` ->
    ``bfloat16``); ``ValueError`` naming the known ones otherwise."""
    from sqlrl.policy.spec import dtype_name

    try:
        name = dtype_name(mixed_precision, "mixed_precision")
    except ValueError:
        name = None
    if name not in MIXED_PRECISION:
        raise ValueError(f"unknown mixed_precision {mixed_precision!r}; known: {', '.join(MIXED_PRECISION)} "
                         "(fp32 / bf16 accepted too)")
    return name


def check_precision(mixed_precision: str, device: str) -> str:
    """The normalised precision, after checking the device can run it (module doc)."""
    mixed_precision = precision_name(mixed_precision)
    if mixed_precision == "bfloat16" and not bf16_supported(device):
        raise ValueError(f"bfloat16 is not supported on {device}; use mixed_precision='float32'")
    if mixed_precision == "bfloat16" and device.startswith("cpu") and not cpu_bf16_hardware():
        import warnings

        warnings.warn("mixed_precision='bfloat16' on a CPU without AVX512-BF16/AMX: torch emulates bf16 here, "
                      "about 4-5x slower than float32 (docs/learner.md); set model.mixed_precision=float32",
                      SlowPrecisionWarning, stacklevel=2)
    return mixed_precision


def decoder_layers(model: Any) -> list[Any]:
    """The repeated blocks to shard one by one (Hugging Face decoder-only models keep them at
    ``model.model.layers``); an unknown layout raises ``ValueError``."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise ValueError(f"cannot find the decoder layers of {type(model).__name__} (expected model.model.layers)")
    return list(layers)


def shard_model(model: Any, mesh: Any, mixed_precision: str = "float32") -> Any:
    """``fully_shard`` each decoder layer, then the root (in place; returns the model)."""
    from torch.distributed.fsdp import fully_shard

    mixed_precision = check_precision(mixed_precision, mesh.device_type)
    kwargs: dict[str, Any] = {"mesh": mesh}
    policy = MIXED_PRECISION[mixed_precision]()
    if policy is not None:
        kwargs["mp_policy"] = policy
    for layer in decoder_layers(model):
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    return model
