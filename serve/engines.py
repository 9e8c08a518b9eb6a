"""The async engine a model replica serves with, by backend name: one place to add one (``KINDS``).

A served model's replica owns ONE ``AsyncEngine`` (``sqlrl.policy.engine``): every chat
completion, stream and SQL-agent turn is its own engine request and joins the running batch at
the engine's next step (continuous batching: ``HFEngine``, ``VLLMEngine``; the scripted engine
for tests). ``EngineKind`` says, per backend:

- ``build(policy, spec)``: the engine (``ModelSpec.max_batch_size`` bounds the sequences it runs
  at once: ``HFEngine(max_batch=)``, vLLM's ``max_num_seqs``; ``backend_options`` go to it);
- ``window(engine, policy)``: the context window in tokens (prompt + generated), or None;
- ``running(engine)``: the sequences the engine holds now (running or waiting) -- read from the
  engine's own state, so a test can check that an aborted request was freed;
- ``too_long(exc)``: whether an error the engine raised for a request is its "prompt does not fit
  the context window" error (vLLM: ``ContextLengthExceeded``); serving answers it with 400
  ``context_length_exceeded``. The replica also checks prompt + ``max_tokens`` against ``window``
  before submitting, so on every backend a prompt that does not fit is that 400;
- ``loads_weights``: whether the replica needs the HF model beside the engine. vLLM holds its own
  copy of the weights, so a vLLM replica loads only the tokenizer and end tokens
  (``weightless_policy``: a ``Policy`` whose ``model`` is None) -- one copy of the weights per
  replica, not vLLM's plus a float32 HF copy;
- ``constrains``: the engine honours ``SamplingParams.structured`` (hf, vllm: forced tool calls are
  grammar-constrained); the scripted engine does not (its turns are canned).

``"auto"`` resolves to ``"vllm"`` where vLLM can serve the policy, else ``"hf"``
(``sqlrl.policy.backends.vllm_unavailable``).

The scripted engine takes, besides ``ScriptedEngine``'s options, ``gate_file`` (+
``gate_after_tokens``, ``gate_match``): matching requests stop before that token while the file
does not exist (``FileGate``: a cross-process event for the e2e tests, which cannot reach a gate
object inside a replica; it polls the file every 10 ms and re-closes when the file is removed).

Guarantees: an unknown backend is a ``ValueError`` naming the known ones; engines are imported
lazily (this module loads neither torch nor vLLM).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from sqlrl.policy.engine import AsyncEngine


@dataclass(frozen=True)
class EngineKind:
    build: Callable[[Any, Any], AsyncEngine]
    window: Callable[[Any, Any], int | None]
    running: Callable[[Any], Awaitable[int]]
    too_long: Callable[[BaseException], bool] = lambda exc: False
    constrains: bool = False  # honours SamplingParams.structured (forced tool calls are constrained)
    loads_weights: bool = True  # False: the engine holds its own copy; the replica loads no HF model


def _positions(engine: Any, policy: Any) -> int | None:
    return getattr(policy.model.config, "max_position_embeddings", None)


def _build_hf(policy: Any, spec: Any) -> AsyncEngine:
    from sqlrl.policy.backends import make_engine

    return make_engine("hf", policy, max_batch=spec.max_batch_size, **dict(spec.backend_options))


async def _running_hf(engine: Any) -> int:
    stats = await engine.stats()
    return stats.running + stats.waiting


def _build_vllm(policy: Any, spec: Any) -> AsyncEngine:
    from sqlrl.policy.backends import make_engine
    from sqlrl.policy.load import DTYPES

    return make_engine("vllm", policy, **{"dtype": DTYPES[spec.dtype], "max_num_seqs": spec.max_batch_size,
                                          **dict(spec.backend_options)})


async def _running_vllm(engine: Any) -> int:
    return int(engine.counters()["unfinished"])


def _vllm_too_long(exc: BaseException) -> bool:
    from sqlrl.policy.vllm_engine import ContextLengthExceeded  # loaded already where vLLM serves

    return isinstance(exc, ContextLengthExceeded)


class FileGate:
    """Opens ``gate`` while ``path`` exists, closes it again when the file is removed (module doc)."""

    def __init__(self, gate: Any, path: str) -> None:
        self.gate, self.path = gate, path
        self._stop = threading.Event()
        threading.Thread(target=self._watch, name="sqlrl-file-gate", daemon=True).start()

    def _watch(self) -> None:
        while not self._stop.is_set():
            if os.path.exists(self.path):
                if not self.gate.opened.is_set():
                    self.gate.opened.set()
            elif self.gate.opened.is_set():
                self.gate.opened.clear()
            self._stop.wait(0.01)

    def stop(self) -> None:
        self._stop.set()


def _build_scripted(policy: Any, spec: Any) -> AsyncEngine:
    from sqlrl.policy.scripted import ScriptedEngine

    options = dict(spec.backend_options)
    gate_file = options.pop("gate_file", None)
    after, match = int(options.pop("gate_after_tokens", 0)), str(options.pop("gate_match", ""))
    engine = ScriptedEngine(policy.tokenizer, policy.eos_token_ids, **options)
    if gate_file:
        FileGate(engine.hold(match, after_tokens=after), str(gate_file))  # its thread keeps it alive
    return engine


async def _running_scripted(engine: Any) -> int:
    return engine.in_flight


KINDS: dict[str, EngineKind] = {
    "hf": EngineKind(_build_hf, _positions, _running_hf, constrains=True),
    "vllm": EngineKind(_build_vllm, lambda engine, policy: engine.max_model_len, _running_vllm, _vllm_too_long,
                       constrains=True, loads_weights=False),
    "scripted": EngineKind(_build_scripted, _positions, _running_scripted),
}


def weightless_policy(name_or_path: str) -> Any:
    """The ``Policy`` of a checkpoint without its weights (``model`` None): the tokenizer, pad id and
    end tokens exactly as ``load_policy`` gives them (the tokenizer's EOS plus the generation
    config's), read from the folder's tokenizer and config files only."""
    from transformers import AutoConfig, GenerationConfig

    from sqlrl.policy.load import Policy, load_tokenizer, resolve_path

    path = resolve_path(name_or_path)
    tokenizer, pad = load_tokenizer(path)
    tokenizer.padding_side = "left"
    if tokenizer.eos_token_id is None:
        raise ValueError(f"the tokenizer in {path} has no EOS token")
    try:
        generation = GenerationConfig.from_pretrained(path, local_files_only=True)
    except OSError:  # no generation_config.json: transformers derives it from the model config
        generation = GenerationConfig.from_model_config(AutoConfig.from_pretrained(path, local_files_only=True))
    configured = generation.eos_token_id
    eos = {tokenizer.eos_token_id}
    eos.update(configured if isinstance(configured, (list, tuple)) else [] if configured is None else [configured])
    return Policy(name=str(name_or_path), path=path, model=None, tokenizer=tokenizer,
                  eos_token_ids=tuple(sorted(eos)), pad_token_id=pad)


def resolve(backend: str, policy: Any) -> str:
    """The ``KINDS`` name ``backend`` means for ``policy`` (``auto``: vllm where it can, else hf)."""
    if backend == "auto":
        from sqlrl.policy.backends import vllm_unavailable

        return "hf" if vllm_unavailable(policy) else "vllm"
    if backend not in KINDS:
        raise ValueError(f"unknown serving backend {backend!r}; known: auto, {', '.join(KINDS)}")
    return backend
