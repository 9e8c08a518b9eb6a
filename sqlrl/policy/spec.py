"""``PolicySpec``: which model generates, on which engine, in which precision -- one spec, one set of
defaults, for rollouts, evaluation, inference and (where it builds engines from one) serving.

    spec = PolicySpec("smollm2-135m", backend="vllm", dtype="bf16")   # dtype normalised: "bfloat16"
    policy, engine = spec.build(seed=0)        # = spec.engine(spec.load(), seed=0)

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

Building: ``load(weights=True)`` loads the model in ``dtype`` and places it on ``device``
(``weights=False``: tokenizer and end tokens only, for an engine that holds its own copy of the
weights -- a vLLM serving replica); ``engine(policy, seed, **extra)`` makes ONE engine of
``backend`` (``make_engine``) with ``engine_options`` plus ``extra`` (a caller's own settings, such as
serving's batch bound; a key given both ways is a ``ValueError`` naming it); ``build`` is both.
``resolved(policy)``: the spec with a resolution (``sqlrl.policy.backends.RESOLUTIONS``: ``auto``)
replaced by the engine it picks for that policy (``auto``: vllm where it can serve it, else hf,
given the options hf takes), so a caller can look the engine up.
Serving (``serve.config.ModelSpec.policy``), the gateway, rollouts and evaluation all build here.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
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

    def load(self, *, weights: bool = True, light: Any = None) -> Any:
        """The ``Policy``: the model loaded in ``dtype`` and placed on ``device``; ``weights=False``:
        no model (``Policy.model`` None), the tokenizer, pad id and end tokens only. ``light``: this
        spec's policy loaded with ``weights=False`` already (to resolve ``auto``): its tokenizer and
        end tokens are kept and only the model is loaded (``ValueError`` for another model or dtype)."""
        from .backends import place_policy
        from .load import load_policy, with_weights

        if light is not None and weights:
            if light.name != str(self.model) or light.dtype != self.dtype:
                raise ValueError(f"light policy {light.name!r} ({light.dtype}) is not this spec's "
                                 f"{self.model!r} ({self.dtype})")
            policy = with_weights(light)
        else:
            policy = load_policy(self.model, dtype=self.dtype, weights=weights)
        return place_policy(policy, self.device, self.backend) if weights else policy

    def engine(self, policy: Any, seed: int | None = None, **extra: Any) -> Any:
        """ONE engine of ``backend`` over ``policy`` (``make_engine``), given ``engine_options`` and
        ``extra`` (a key in both is a ``ValueError``), seeded with ``engine_options["seed"]``, else ``seed``."""
        from .backends import make_engine

        both = sorted(set(extra) & set(self.engine_options))
        if both:
            raise ValueError(f"engine option(s) {', '.join(both)} are set by the caller here; "
                             "remove them from engine_options")
        options = {**self.engine_options, **extra}
        return make_engine(self.backend, policy, options.pop("seed", seed), **options)

    def build(self, seed: int | None = None) -> tuple[Any, Any]:
        """``(policy, engine)``: ``load()`` and ONE ``engine`` over it."""
        policy = self.load()
        return policy, self.engine(policy, seed)

    def resolved(self, policy: Any) -> "PolicySpec":
        """This spec with a resolution's ``backend`` (``auto``) replaced by the engine it picks for
        ``policy`` (and ``engine_options`` as that engine takes them); an engine's name: this spec."""
        from .backends import resolve_engine

        backend, options = resolve_engine(self.backend, policy, self.engine_options)
        return replace(self, backend=backend, engine_options=options)
