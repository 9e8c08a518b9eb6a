"""What serving needs to know of each engine, by engine name: one place to add one (``KINDS``).

A served model's replica owns ONE ``AsyncEngine`` (``sqlrl.policy.engine``), loaded and built by
the same code as training's (``ModelSpec.policy``, a ``sqlrl.policy.spec.PolicySpec``: ``load``,
``engine`` -> ``make_engine``): every chat completion, stream and SQL-agent turn is its own engine
request and joins the running batch at the engine's next step (continuous batching: ``HFEngine``,
``VLLMEngine``; the scripted engine for tests). ``EngineKind`` says, per engine:

- ``batch_option``: the engine option that ``ModelSpec.max_batch_size`` sets -- the sequences it
  runs at once (``HFEngine(max_batch=)``, vLLM's ``max_num_seqs``; None: the engine has no bound);
- ``window(engine, policy)``: the context window in tokens (prompt + generated), or None;
- ``running(engine)``: the sequences the engine holds now (running or waiting) -- read from the
  engine's own state, so a test can check that an aborted request was freed;
- ``too_long(exc)``: whether an error the engine raised for a request is its "prompt does not fit
  the context window" error (vLLM: ``ContextLengthExceeded``); serving answers it with 400
  ``context_length_exceeded``. The replica also checks prompt + ``max_tokens`` against ``window``
  before submitting, so on every backend a prompt that does not fit is that 400;
- ``loads_weights``: whether the replica needs the HF model beside the engine. vLLM holds its own
  copy of the weights, so a vLLM replica loads only the tokenizer and end tokens
  (``PolicySpec.load(weights=False)``: a ``Policy`` whose ``model`` is None) -- one copy of the
  weights per replica, not vLLM's plus a float32 HF copy;
- ``constrains``: the engine honours ``SamplingParams.structured`` (hf, vllm: forced tool calls are
  grammar-constrained); the scripted engine does not (its turns are canned).

A name that is not an engine but picks one from the checkpoint is a registered resolution
(``RESOLUTIONS``: the engine registry's own, ``sqlrl.policy.backends.RESOLUTIONS``, each a
``Resolution`` declaring its targets): ``"auto"`` resolves to ``"vllm"`` where vLLM can serve the
policy, else ``"hf"`` (``PolicySpec.resolved``, ``sqlrl.policy.backends.resolve_engine``). Serving
runs the names of ``RESOLUTIONS`` and ``KINDS`` (``served_names``), and nothing compares a name
against ``"auto"``.
``build_served(model_spec)`` loads and builds a served model's engine (a serving replica's, and an
in-process gateway's). The scripted engine's options (``script``, ``gate_file``, ...) are the engine
registry's (``sqlrl.policy.backends``).

Guarantees: a backend serving has no kind for (``hf-batched``, ``vllm-batched``) is a ``ValueError``
naming the served ones when the config is read (``check_served``); a resolution that picks an
engine with no kind is a ``ValueError`` naming it (``build_served``); ``build_served`` loads the
tokenizer once (a resolution's weight-less policy is kept, and only the model is added where the
engine needs it); this module loads neither torch nor vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Awaitable, Callable

# name -> what it resolves to: the engine registry's resolutions (one registry, so serving,
# PolicySpec and the rollout engines agree on what a resolution such as auto means)
from sqlrl.policy.backends import RESOLUTIONS


@dataclass(frozen=True)
class EngineKind:
    window: Callable[[Any, Any], int | None]
    running: Callable[[Any], Awaitable[int]]
    batch_option: str | None = None  # the engine option max_batch_size sets (None: no bound to set)
    too_long: Callable[[BaseException], bool] = lambda exc: False
    constrains: bool = False  # honours SamplingParams.structured (forced tool calls are constrained)
    loads_weights: bool = True  # False: the engine holds its own copy; the replica loads no HF model

    def batch_bound(self, max_batch_size: int) -> dict[str, int]:
        """The engine options that bound its running batch to ``max_batch_size``."""
        return {self.batch_option: max_batch_size} if self.batch_option else {}


def _positions(engine: Any, policy: Any) -> int | None:
    return getattr(policy.model.config, "max_position_embeddings", None)


async def _running_hf(engine: Any) -> int:
    stats = await engine.stats()
    return stats.running + stats.waiting


async def _running_vllm(engine: Any) -> int:
    return int(engine.counters()["unfinished"])


def _vllm_too_long(exc: BaseException) -> bool:
    from sqlrl.policy.vllm_engine import ContextLengthExceeded  # loaded already where vLLM serves

    return isinstance(exc, ContextLengthExceeded)


async def _running_scripted(engine: Any) -> int:
    return engine.in_flight


KINDS: dict[str, EngineKind] = {
    "hf": EngineKind(_positions, _running_hf, "max_batch", constrains=True),
    "vllm": EngineKind(lambda engine, policy: engine.max_model_len, _running_vllm, "max_num_seqs", _vllm_too_long,
                       constrains=True, loads_weights=False),
    "scripted": EngineKind(_positions, _running_scripted),
}


def served_names() -> tuple[str, ...]:
    """Every backend name serving runs: the resolutions, then the engine kinds."""
    return (*RESOLUTIONS, *KINDS)


@dataclass(frozen=True)
class Served:
    """A served model's engine as ``build_served`` made it: its kind, the policy beside it, the engine."""

    kind: EngineKind
    policy: Any  # sqlrl.policy.load.Policy (model None where the engine holds the weights)
    engine: Any  # an AsyncEngine


def build_served(spec: Any, seed: int | None = None) -> Served:
    """The engine of a ``serve.config.ModelSpec``, loaded and built by its ``PolicySpec`` (training's
    code): a resolution (``auto``) resolved on the checkpoint's weight-less policy, the HF model
    loaded only where the engine needs it (``loads_weights``), the tokenizer loaded once either
    way, ``max_batch_size`` given as the engine's ``batch_option``."""
    light = None
    policy_spec = spec.policy
    if check_served(policy_spec.backend) in RESOLUTIONS:  # picks an engine from the folder alone
        light = policy_spec.load(weights=False)
        policy_spec = policy_spec.resolved(light)
    kind = KINDS.get(policy_spec.backend)
    if kind is None:
        raise ValueError(f"backend {spec.policy.backend!r} resolved to {policy_spec.backend!r}, "
                         f"which cannot serve; serving runs: {', '.join(KINDS)}")
    if kind.loads_weights:
        policy = policy_spec.load(light=light)  # the model added to the resolution's tokenizer
    else:  # vLLM: its own copy of the weights only
        policy = light if light is not None else policy_spec.load(weights=False)
    return Served(kind, policy, policy_spec.engine(policy, seed, **kind.batch_bound(spec.max_batch_size)))


def _engines() -> tuple[str, ...]:
    from sqlrl.policy.backends import ENGINES  # the engine registry (imports neither torch nor vLLM)

    return tuple(ENGINES)


def check_served(backend: str) -> str:
    """``backend`` when serving can run it (a ``RESOLUTIONS`` or ``KINDS`` name); else ``ValueError``."""
    if backend not in served_names():
        raise ValueError(f"backend {backend!r} cannot serve; serving runs: {', '.join(served_names())}"
                         + (" (an engine of sqlrl.policy.backends.ENGINES serves once serve/engines.py::KINDS has its EngineKind)"
                            if backend in _engines() else ""))
    return backend
