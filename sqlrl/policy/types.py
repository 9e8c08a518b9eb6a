"""The contract between the agent loop and a generation backend (Ray-free, torch-free).

A backend turns a batch of prompts (token ids) into one or more completions each; the agent loop
never sees a model, only this Protocol. Guarantees every backend gives:
- ``Generation.token_ids`` are exactly the tokens sampled (not a re-tokenisation of the text) and
  ``logprobs[i]`` is the log-probability the sampling distribution gave ``token_ids[i]`` (after
  temperature/top-p, as the policy-gradient loss needs the behaviour policy's numbers);
- a stop string ends a completion *including* the stop string in ``text``/``token_ids``
  (``finish_reason="stop"``), hitting ``max_new_tokens`` gives ``"length"``, the EOS token gives
  ``"eos"`` (EOS is included in ``token_ids``);
- ``generate`` returns ``len(prompts) * params.n`` generations, prompt-major
  (prompt 0's n samples, then prompt 1's, ...).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence

from .constraints import StructuredOutput


@dataclass(frozen=True)
class SamplingParams:
    n: int = 1
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    max_new_tokens: int = 256
    stop: tuple[str, ...] = ()
    seed: int | None = None
    # A grammar the tokens must follow (``sqlrl.policy.constraints``; None: free). Honoured by the
    # async engines (``HFEngine``, ``VLLMEngine``), which mask before temperature/top-p, so
    # ``logprobs`` stay those of the distribution sampled from. The batch backends called directly
    # (``HFBackend``, ``VLLMBackend``, ``ScriptedBackend``) and the lock-step adapter refuse it at
    # ``generate`` (``ValueError`` naming the engines that honour it), before any token is generated.
    structured: StructuredOutput | None = None

    def __post_init__(self) -> None:
        if self.n < 1 or self.max_new_tokens < 1:
            raise ValueError("SamplingParams.n and max_new_tokens must be >= 1")
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ValueError("SamplingParams: temperature >= 0 and 0 < top_p <= 1")
        if self.structured is not None and not isinstance(self.structured, StructuredOutput):
            raise ValueError("SamplingParams.structured must be a sqlrl.policy.constraints.StructuredOutput")


@dataclass(frozen=True)
class Generation:
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    text: str
    finish_reason: str  # "stop" | "length" | "eos" | "abort" (an engine request aborted: sqlrl.policy.engine)
    meta: dict = field(default_factory=dict, compare=False)
    # The policy version that produced each token (async engines fill it: sqlrl.policy.engine); () from
    # the batch backends, whose callers know the one version they ran.
    versions: tuple[int, ...] = ()


class GenerationBackend(Protocol):
    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]: ...


def row_seed(seed: int, prompt_index: int, sample_index: int) -> int:
    """The seed of sample ``sample_index`` of prompt ``prompt_index`` in a call seeded ``seed``: every
    backend derives per-sample seeds this way, so equal prompts in one call draw different samples."""
    return (seed * 1_000_003 + prompt_index * 7919 + sample_index) % (2**63 - 1)
