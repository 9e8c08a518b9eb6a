"""The generation backends by name: one place to add one (``BACKENDS``).

``make_backend(name, policy, seed=None, **options)`` builds a ``GenerationBackend`` for a loaded
``Policy``. ``seed`` is the caller's sampling seed (``SamplingParams.seed``): a backend that draws
from an engine-wide generator is seeded with it (vLLM's CPU build samples from the engine's
generator, ``sqlrl.policy.vllm_backend``, so without it every run would draw the same samples
whatever its seed); the others seed each call from ``params.seed`` and ignore it.

- ``"hf"``: ``HFBackend`` (transformers; CPU, or GPU with a CUDA torch) -- options go to it
  (``prefix_cache``, ``max_cached_tokens``);
- ``"vllm"``: ``VLLMBackend`` on the policy's folder, with the policy's dtype and end tokens
  (vLLM's CPU build here, its CUDA build on GPU machines) -- options go to it and on to ``vllm.LLM``;
- ``"auto"``: a resolution (below): ``"vllm"`` where it can serve the policy (installed; on CPU,
  a head size its kernels have -- SmolLM2 yes, the tiny test model no), else ``"hf"`` (given the
  options it accepts: vLLM-only ones such as ``kv_cache_gb`` are dropped);
- ``"scripted"``: ``ScriptedBackend`` (``sqlrl.policy.scripted``), canned turns through the real
  tokenizer, for tests, demos and benchmarks of everything around the model.

``generate_streaming(backend, prompts, params, on_token)``: ``on_token(row, token_id)`` for every
generated token (row = prompt_index * n + sample) -- as it is sampled on backends that say
``streams_tokens`` (hf, scripted), after the call on the others (vllm: its offline ``LLM`` API
returns whole completions; ``VLLMEngine`` streams token by token).

``place_policy(policy, device, backend)`` moves a loaded policy to where its own weights generate
(``generation_device``): ``"cpu"``, ``"cuda"`` or ``"cuda:N"`` as given; ``"auto"`` is the GPU when
this process sees one and the backend generates with those weights (hf, or a resolution that
picks hf for this policy), else the CPU -- vLLM keeps its own copy of the weights on the GPU and
the scripted backend uses none, so the policy beside them stays on the CPU.

Engines (``sqlrl.policy.engine``: one sequence per request, awaited by one coroutine per
trajectory) by name: ``ENGINES``, filled only through ``register_engine(name, build, engine_class)``,
which runs ``check_engine_class`` -- a class that does not implement ``AsyncEngine`` is refused at
registration (a class named as ``"module:Class"``, imported lazily, is checked before its first
build). ``make_engine(name, policy, seed=None, **options) -> AsyncEngine``:

- ``"scripted"``: ``ScriptedEngine`` (the same scripts as ``ScriptedBackend``, with gates); the
  options ``gate_file`` (+ ``gate_after_tokens``, ``gate_match``) hold matching requests before that
  token while the file does not exist (``sqlrl.policy.file_gate.FileGate``: for tests in another
  process than the engine, e.g. a serving replica);
- ``"hf"``: ``HFEngine`` (``sqlrl.policy.hf_engine``: continuous batching over HFBackend's decode
  steps); ``"vllm"``: ``VLLMEngine`` (``sqlrl.policy.vllm_engine``: vLLM's ``AsyncLLM``);
  ``"auto"``: the resolution (below) building ``"vllm"`` or ``"hf"`` (``resolve_engine`` says which,
  with the options it keeps);
- ``"hf-batched"``, ``"vllm-batched"`` (transitional): ``BatchedEngine`` (``sqlrl.policy.batched``)
  over the backend ``make_backend`` builds -- lock-step rounds, the reference the engines are
  measured against -- with a weight loader into the policy (checked names and shapes; vLLM's copy
  reloaded, HF's prefix cache cleared). On vLLM's CPU build requests of different seeds share a
  call (its samples come from the engine's generator anyway); elsewhere each seed gets its own call.

Resolutions (``RESOLUTIONS``, filled only through ``register_resolution(name, Resolution)``): a
name that is no engine of its own but picks one of its declared ``targets`` per policy, from the
policy's folder alone (``Resolution.pick``; ``auto``: ``vllm`` where ``vllm_unavailable`` says it
can serve the policy, else ``hf``). Registering one checks that every target is a registered
engine and enters the name in ``ENGINES`` (and ``BACKENDS``, where its targets are backends) as a
build that resolves, then builds the target; ``resolve_engine`` / ``PolicySpec.resolved`` and
``generation_device`` ask the registry, so no code compares a backend's name with a resolution's
(serving lists the same registry: ``serve.engines``).

Guarantees: an unknown name raises ``ValueError`` naming the known ones; backends are imported
lazily (importing this module loads neither torch nor vLLM).
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from .engine import AsyncEngine, check_engine_class
from .types import GenerationBackend


def _hf(policy: Any, seed: int | None = None, **options: Any) -> GenerationBackend:
    from .hf_backend import HFBackend  # seeds every call from params.seed

    return HFBackend(policy, **options)


def _vllm(policy: Any, seed: int | None = None, **options: Any) -> GenerationBackend:
    from .vllm_backend import VLLMBackend

    dtype = str(next(policy.model.parameters()).dtype).removeprefix("torch.")
    options = {"dtype": dtype, "eos_token_ids": policy.eos_token_ids,
               **({"seed": seed} if seed is not None else {}), **options}
    return VLLMBackend(policy.path, **options)


def _scripted(policy: Any, seed: int | None = None, **options: Any) -> GenerationBackend:
    from .scripted import ScriptedBackend

    return ScriptedBackend(policy.tokenizer, policy.eos_token_ids, **options)


def vllm_unavailable(policy: Any) -> str | None:
    """Why ``"vllm"`` cannot serve this policy here (None: it can) -- without starting an engine."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return "vllm is not installed"
    from .vllm_backend import CPU_HEAD_SIZES, head_size

    import torch

    size = head_size(policy.path)
    if not torch.cuda.is_available() and size is not None and size not in CPU_HEAD_SIZES:
        return f"vLLM's CPU attention has no kernel for head size {size}"
    return None


def _auto_pick(policy: Any) -> str:
    """``auto``'s rule: ``"vllm"`` where vLLM can serve the policy here, else ``"hf"``."""
    return "vllm" if vllm_unavailable(policy) is None else "hf"


def _load_class(path: str) -> type:
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


@dataclass(frozen=True)
class Resolution:
    """A backend name that is no engine of its own: per policy it resolves to one of ``targets``
    (each a registered engine, checked by ``register_resolution``). ``pick(policy)``
    chooses from the policy's folder alone (no engine started); ``describe`` is the rule in words
    (serving lists it). ``keeps``: for a target, its backend and engine classes (``"module:Class"``)
    whose ``__init__`` parameters are the options that target is given -- the rest are dropped, so
    a config written for one target runs on the other; a target not in ``keeps`` gets them all."""

    targets: tuple[str, ...]
    pick: Callable[[Any], str]
    describe: str
    keeps: Mapping[str, tuple[str, str]] = field(default_factory=dict)

    def target(self, policy: Any) -> str:
        """The target ``pick`` chooses for ``policy`` (one not in ``targets`` is a ``ValueError``)."""
        name = self.pick(policy)
        if name not in self.targets:
            raise ValueError(f"resolution picked {name!r}, which is not one of its targets {', '.join(self.targets)}")
        return name

    def choose(self, policy: Any, options: Mapping[str, Any], *, engine: bool) -> tuple[str, dict[str, Any]]:
        """``(target, the options it is given)`` for ``policy``; ``engine``: for ``ENGINES`` (else ``BACKENDS``)."""
        name = self.target(policy)
        if name not in self.keeps:
            return name, dict(options)
        accepted = inspect.signature(_load_class(self.keeps[name][int(engine)]).__init__).parameters
        return name, {k: v for k, v in options.items() if k in accepted}


AUTO = Resolution(("vllm", "hf"), _auto_pick, "vllm where vLLM can serve the policy here, else hf",
                  keeps={"hf": ("sqlrl.policy.hf_backend:HFBackend", "sqlrl.policy.hf_engine:HFEngine")})
RESOLUTIONS: dict[str, Resolution] = {}  # filled only through register_resolution


def resolved_name(name: str, policy: Any) -> str:
    """The backend ``name`` builds for ``policy``: a resolution's pick, else ``name`` itself."""
    resolution = RESOLUTIONS.get(name)
    return name if resolution is None else resolution.target(policy)


def check_device(device: str) -> str:
    """``device`` when it is ``auto``, ``cpu``, ``cuda`` or ``cuda:N``; else ``ValueError``."""
    if device in ("auto", "cpu", "cuda") or (device.startswith("cuda:") and device[5:].isdigit()):
        return device
    raise ValueError(f"unknown device {device!r}; known: auto, cpu, cuda, cuda:N")


def generation_device(device: str, backend: str, policy: Any) -> str:
    """Where ``policy``'s weights generate for ``backend`` (module docstring)."""
    if check_device(device) != "auto":
        return device
    import torch

    if not torch.cuda.is_available():
        return "cpu"
    uses_weights = resolved_name(backend, policy) == "hf"  # vllm keeps its own copy; scripted uses none
    return "cuda" if uses_weights else "cpu"


def place_policy(policy: Any, device: str, backend: str) -> Any:
    """``policy`` (loaded on the CPU) moved to ``generation_device(device, backend, policy)``."""
    where = generation_device(device, backend, policy)
    if where != "cpu":
        policy.model.to(where)
    return policy


# lock-step batch backends by name; a resolution is entered (first) by register_resolution
BACKENDS: dict[str, Callable[..., GenerationBackend]] = {"hf": _hf, "vllm": _vllm, "scripted": _scripted}


def generate_streaming(backend: Any, prompts: Any, params: Any,
                       on_token: Callable[[int, int], None]) -> list[Any]:
    if getattr(backend, "streams_tokens", False):
        return backend.generate(prompts, params, on_token=on_token)
    gens = backend.generate(prompts, params)
    for row, g in enumerate(gens):
        for tok in g.token_ids:
            on_token(row, tok)
    return gens


def make_backend(name: str, policy: Any, seed: int | None = None, **options: Any) -> GenerationBackend:
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; known: {', '.join(BACKENDS)}")
    return BACKENDS[name](policy, seed, **options)


# -- engines ---------------------------------------------------------------------------------------

EngineBuild = Callable[..., AsyncEngine]  # (policy, seed=None, **options) -> AsyncEngine
ENGINES: dict[str, EngineBuild] = {}
_UNCHECKED: dict[str, str] = {}  # name -> "module:Class" not yet imported and checked


def register_engine(name: str, build: EngineBuild, engine_class: type | str) -> None:
    """Add (or replace) the engine ``name``; ``engine_class`` is what ``build`` returns, checked with
    ``check_engine_class`` now, or before the first build when given as ``"module:Class"``."""
    if isinstance(engine_class, str):
        _UNCHECKED[name] = engine_class
    else:
        check_engine_class(engine_class)
        _UNCHECKED.pop(name, None)
    ENGINES[name] = build


def make_engine(name: str, policy: Any, seed: int | None = None, **options: Any) -> AsyncEngine:
    if name not in ENGINES:
        raise ValueError(f"unknown engine {name!r}; known: {', '.join(ENGINES)}")
    if name in _UNCHECKED:
        module, _, attr = _UNCHECKED[name].partition(":")
        check_engine_class(getattr(importlib.import_module(module), attr))
        del _UNCHECKED[name]
    return ENGINES[name](policy, seed, **options)


def _weight_shapes(policy: Any) -> Callable[[], dict[str, tuple[int, ...]]]:
    return lambda: {k: tuple(v.shape) for k, v in policy.model.state_dict().items()}


def _hf_adapter(policy: Any, seed: int | None = None, **options: Any) -> AsyncEngine:
    from .batched import BatchedEngine

    backend = _hf(policy, seed, **options)

    def load(weights: Mapping[str, Any]) -> None:
        policy.model.load_state_dict(dict(weights), strict=True)
        backend.clear_cache()  # cached KV is of the old weights

    return BatchedEngine(backend, load_weights=load, weight_shapes=_weight_shapes(policy))


def _vllm_adapter(policy: Any, seed: int | None = None, **options: Any) -> AsyncEngine:
    from .batched import BatchedEngine

    backend = _vllm(policy, seed, **options)

    def load(weights: Mapping[str, Any]) -> None:
        policy.model.load_state_dict(dict(weights), strict=True)
        backend.load_weights(policy.model.state_dict())

    return BatchedEngine(backend, merge_seeds=not backend.per_request_seeds,  # type: ignore[attr-defined]
                         load_weights=load, weight_shapes=_weight_shapes(policy),
                         close_backend=backend.close,  # type: ignore[attr-defined]
                         inline=backend.thread_bound)  # type: ignore[attr-defined]  # in-process on CPU: its thread


def _hf_engine(policy: Any, seed: int | None = None, **options: Any) -> AsyncEngine:
    from .hf_engine import make_hf_engine

    return make_hf_engine(policy, seed, **options)


def _vllm_engine(policy: Any, seed: int | None = None, **options: Any) -> AsyncEngine:
    from .vllm_engine import make_vllm_engine

    return make_vllm_engine(policy, seed, **options)


def resolve_engine(name: str, policy: Any, options: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """``(engine, options)`` that ``name`` means for ``policy``: a resolution's choice (``auto``: vllm
    where it can serve the policy, else hf with the options ``HFEngine`` accepts); else unchanged."""
    resolution = RESOLUTIONS.get(name)
    if resolution is None:
        return name, dict(options)
    name, kept = resolution.choose(policy, options, engine=True)
    if "seed" in options:  # every engine's factory takes the seed (make_engine's argument)
        kept["seed"] = options["seed"]
    return name, kept


def register_resolution(name: str, resolution: Resolution) -> None:
    """Add (or replace) the resolution ``name``: every target must be a registered engine, not a
    resolution (else ``ValueError``). ``name`` then builds what it resolves to for the policy at
    hand: in ``ENGINES``, and in ``BACKENDS`` too where every target is a backend (listed first)."""
    missing = [t for t in resolution.targets if t not in ENGINES or t in RESOLUTIONS]
    if not resolution.targets or missing:
        raise ValueError(f"resolution {name!r}: its targets must be registered engines, not resolutions; "
                         f"not: {', '.join(missing) or '(none given)'}")

    def engine(policy: Any, seed: int | None = None, **options: Any) -> AsyncEngine:
        target, kept = resolve_engine(name, policy, options)
        return make_engine(target, policy, seed, **kept)

    def backend(policy: Any, seed: int | None = None, **options: Any) -> GenerationBackend:
        target, kept = RESOLUTIONS[name].choose(policy, options, engine=False)
        return BACKENDS[target](policy, seed, **kept)

    RESOLUTIONS[name] = resolution
    _UNCHECKED.pop(name, None)  # what it builds is a registered engine, checked as that one
    ENGINES[name] = engine
    if all(t in BACKENDS for t in resolution.targets):
        others = {k: v for k, v in BACKENDS.items() if k != name}
        BACKENDS.clear()
        BACKENDS.update({name: backend, **others})


def _scripted_engine(policy: Any, seed: int | None = None, *, gate_file: str | None = None,
                     gate_after_tokens: int = 0, gate_match: str = "", **options: Any) -> AsyncEngine:
    from .scripted import ScriptedEngine

    engine = ScriptedEngine(policy.tokenizer, policy.eos_token_ids, **options)
    if gate_file:
        from .file_gate import FileGate

        FileGate(engine.hold(str(gate_match), after_tokens=int(gate_after_tokens)), str(gate_file))
    return engine


def _register_defaults() -> None:
    from .batched import BatchedEngine
    from .scripted import ScriptedEngine

    register_engine("scripted", _scripted_engine, ScriptedEngine)
    register_engine("hf", _hf_engine, "sqlrl.policy.hf_engine:HFEngine")
    register_engine("vllm", _vllm_engine, "sqlrl.policy.vllm_engine:VLLMEngine")
    register_resolution("auto", AUTO)  # vllm or hf, picked per policy
    # TRANSITIONAL: the lock-step adapter over today's batch backends (one batch call per round of
    # waiting requests): the reference the async engines are benchmarked against, and what
    # AgentLoop wraps a VLLMBackend in until the jobs build engines (make_engine).
    register_engine("hf-batched", _hf_adapter, BatchedEngine)
    register_engine("vllm-batched", _vllm_adapter, BatchedEngine)


_register_defaults()
