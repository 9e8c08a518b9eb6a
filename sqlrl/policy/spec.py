"""``PolicySpec``: which model generates, on which engine, in which precision -- one spec, one set of
defaults, for rollouts, evaluation, inference and (where it builds engines from one) serving.

    spec = PolicySpec("smollm2-135m", backend="vllm", dtype="bf16")   # dtype normalised: "bfloat16"
    engine = make_engine(spec.backend, load_policy(spec.model, dtype=spec.dtype), **spec.engine_options)

Fields: ``model`` (a ``sqlrl.policy.load.MODELS`` name or a checkpoint folder), ``backend`` (an
engine of the registry ``sqlrl.policy.backends.ENGINES``: ``auto`` -- vLLM where it can serve the
model, else HF --, ``hf``, ``vllm``, ``scripted``, ``hf-batched``, ``vllm-batched``), ``dtype`` (the
weights' precision while generating), ``device`` (where HF generation runs:
``sqlrl.policy.backends.generation_device``) and ``engine_options`` (given to the engine's
factory: ``prefix_cache``, ``max_batch``, ``kv_cache_gb``, ...; a ``seed`` there wins over the
sampling seed).

Guarantees:
- One spelling of precision: ``float32``, ``bfloat16``, ``float16``. ``fp32``, ``bf16``, ``fp16``
  (and the dtype names with a ``torch.`` prefix) are accepted as input only and normalised when the
  spec is made (``dtype_name``), so a config written with ``bf16`` records ``bfloat16``; anything
  else is a ``ValueError`` naming the accepted spellings. The learner's mixed precision uses the
  same names (``curriculum.config.ModelConfig.mixed_precision``, ``sqlrl.learn.fsdp``).
- An unknown backend or device is a ``ValueError`` naming the known ones, when the spec is made --
  never first in a rollout worker; ``engine_options`` must be a mapping with string keys.
- Frozen, picklable (crosses Ray boundaries inside ``RolloutConfig``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

__all__ = ["DTYPES", "DTYPE_ALIASES", "PolicySpec", "check_backend", "dtype_name"]

DTYPES = ("float32", "bfloat16", "float16")
DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def dtype_name(value: Any, what: str = "dtype") -> str:
    """``value`` in the one spelling (``float32`` / ``bfloat16`` / ``float16``); the input aliases
    ``fp32`` / ``bf16`` / ``fp16`` and a ``torch.`` prefix are normalised; else ``ValueError``."""
    name = value.strip().lower().removeprefix("torch.") if isinstance(value, str) else value
    name = DTYPE_ALIASES.get(name, name)
    if name not in DTYPES:
        raise ValueError(f"{what}: unknown precision {value!r}; use one of {', '.join(DTYPES)} "
                         f"(accepted as input too: {', '.join(DTYPE_ALIASES)})")
    return name


def check_backend(backend: Any) -> str:
    """``backend`` when it names a registered engine (``ENGINES``); else ``ValueError`` naming them."""
    from .backends import ENGINES

    if backend not in ENGINES:
        raise ValueError(f"unknown backend {backend!r}; known: {', '.join(ENGINES)}")
    return backend


@dataclass(frozen=True)
class PolicySpec:
    model: str = "tiny"
    backend: str = "auto"  # an ENGINES name: vllm where it can serve the model, else hf
    dtype: str = "float32"  # float32 | bfloat16 | float16 (fp32 / bf16 / fp16 accepted, normalised)
    device: str = "auto"  # where HF generation runs: auto, cpu, cuda, cuda:N
    engine_options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        from .backends import check_device

        if not isinstance(self.model, str) or not self.model.strip():
            raise ValueError(f"PolicySpec.model must be a model name or a checkpoint folder, got {self.model!r}")
        check_backend(self.backend)
        check_device(self.device)
        object.__setattr__(self, "dtype", dtype_name(self.dtype, "PolicySpec.dtype"))
        if not isinstance(self.engine_options, Mapping) or not all(isinstance(k, str) for k in self.engine_options):
            raise ValueError(f"PolicySpec.engine_options must be a mapping of option names, got {self.engine_options!r}")
        object.__setattr__(self, "engine_options", dict(self.engine_options))

    def build(self, seed: int | None = None) -> tuple[Any, Any]:
        """``(policy, engine)``: the model loaded in ``dtype`` and placed on ``device``, and ONE engine
        over it (``make_engine(backend)``, seeded with ``engine_options["seed"]``, else ``seed``)."""
        from .backends import make_engine, place_policy
        from .load import load_policy

        policy = place_policy(load_policy(self.model, dtype=self.dtype), self.device, self.backend)
        options = dict(self.engine_options)
        return policy, make_engine(self.backend, policy, options.pop("seed", seed), **options)
