"""``ModelEngine``: one served model's work on its async engine, without Ray -- chat completions
(whole or streamed) and the SQL agent.

The Serve deployment (``serve/model_server.py``) owns one ``ModelEngine`` over ONE ``AsyncEngine``
(``serve/engines.py`` builds it); the unit tests build one directly. Every method is a coroutine
on the caller's event loop: each chat choice and each agent turn is its own engine request, which
the engine admits into its running batch at its next step (no batch runner here).

- ``chat_plan(req)``: an OpenAI chat completion (``serve.openai_chat``) as a prompt and one
  ``SamplingParams`` per choice: messages rendered with the model's tool chat template (+ the
  forced tool-call prefix); choice ``i`` samples with ``row_seed(seed, 0, i)`` (None: fresh draws),
  so the ``n`` choices are different samples and a seeded request is reproducible. 400 for: ``n``
  above ``limits.max_n`` (named, never clamped), unsupported parameters, messages the template
  refuses, prompt + ``max_tokens`` over the model's context window (``context_length_exceeded``).
  A forced tool call (``tool_choice`` required / named) carries its grammar
  (``openai_chat.call_constraint``) when the engine honours one (``constrains``).
- ``chat(plan)``: the ``chat.completion`` (hermes tool calls as ``tool_calls``, ``usage`` in
  tokens, per-choice ``logprobs`` when asked); ``chat_chunks(plan, include_usage)``: the same
  answer as ``chat.completion.chunk`` dicts, token by token from ``engine.stream`` on every
  backend. An engine error before the first token raises ``APIError`` from the first step (so the
  caller can still answer with a plain error); closing the iterator (a dropped client, a
  timeout) closes the engine streams, which aborts their requests in the engine.
- ``sql(kind, body)``: ``/v1/sql/debug`` (Talon) and ``/v1/sql/generate`` (Zeno): the SQL agent
  (``serve/sql_agent.py``'s ``SQLAgent``, ``agent``) on the same engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Sequence

from sqlrl.agent.chat_format import HFChatFormat
from sqlrl.policy.engine import AsyncEngine, EngineError, TokenDelta
from sqlrl.policy.types import Generation, SamplingParams, row_seed

from .config import LimitsSpec, ServeConfig
from .limits import clamp
from .openai_chat import APIError, ChatRequest, call_constraint, chunk, completion, prepare, token_logprobs
from .sql_agent import SQLAgent, SQLBody
from .streaming import ChoiceStream, finish_reason, message, split_reply, visible

__all__ = ["ChatPlan", "ModelEngine", "choice_seed", "context_error", "gather_all", "merged"]


@dataclass(frozen=True)
class ChatPlan:
    ids: list[int]  # the rendered prompt (+ the forced tool-call prefix)
    samplings: tuple[SamplingParams, ...]  # one per choice (n == 1 each, own seed)
    prefix: str  # text the turn is forced to start with (tool_choice)
    stops: tuple[str, ...]  # the client's stop strings + the end-of-turn text
    tool_names: tuple[str, ...]
    logprobs: bool = False


def choice_seed(seed: int | None, choice: int) -> int | None:
    """The seed of choice ``choice`` of a request seeded ``seed`` (None: fresh draws)."""
    return None if seed is None else row_seed(seed, 0, choice)


async def merged(streams: Sequence[AsyncIterator[TokenDelta]]) -> AsyncIterator[tuple[int, TokenDelta]]:
    """``(i, delta)`` from every stream as it comes, until each has given its final delta. An
    error in one stream is raised here; closing this iterator (or an error) cancels the others,
    which closes their engine requests."""
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, stream: AsyncIterator[TokenDelta]) -> None:
        try:
            async with contextlib.aclosing(stream):  # type: ignore[type-var]
                async for delta in stream:
                    queue.put_nowait((i, delta, None))
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # handed to the consumer, which raises it
            queue.put_nowait((i, None, exc))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        ended = 0
        while ended < len(tasks):
            i, delta, exc = await queue.get()
            if exc is not None:
                raise exc
            ended += delta.final is not None
            yield i, delta
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def gather_all(coros: Sequence[Any]) -> list[Any]:
    """``asyncio.gather`` that cancels the others when one fails (their engine requests abort)."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


def context_error(exc: Exception) -> APIError:
    return APIError(400, str(exc), param="messages", code="context_length_exceeded")


class ModelEngine:
    def __init__(self, name: str, policy: Any, engine: AsyncEngine, config: ServeConfig,
                 schema_style: str | None = None, *, window: int | None = None,
                 too_long: Callable[[BaseException], bool] = lambda exc: False,
                 constrains: bool = False) -> None:
        """``engine``: the model's ``AsyncEngine``; ``window``: its context window in tokens (None:
        unchecked here); ``too_long(exc)``: the engine's own context-window error
        (``serve.engines.EngineKind``). ``schema_style``: how agent prompts render the schema --
        the style the checkpoint records (``sqlrl.agent.prompts.checkpoint_schema_style``).
        ``constrains``: the engine honours ``SamplingParams.structured`` (forced tool calls are
        then grammar-constrained, ``openai_chat.call_constraint``; else forced by the prefix only)."""
        self.name, self.policy, self.engine, self.config = name, policy, engine, config
        self.constrains = constrains
        self.window, self._too_long = window, too_long
        self.limits: LimitsSpec = config.limits
        self.chat_format = HFChatFormat(policy.tokenizer)
        self.agent = SQLAgent(name, engine, self.chat_format, config, schema_style)

    def engine_error(self, exc: BaseException) -> APIError | None:
        """The client error an engine failure of one request means (None: not a client error)."""
        if self._too_long(exc):
            return context_error(exc)  # type: ignore[arg-type]
        if isinstance(exc, ValueError):  # the engine refused the prompt (bad ids, ...)
            return APIError(400, f"the model refused the request: {exc}", param="messages")
        if isinstance(exc, EngineError):
            return APIError(500, f"generation failed: {exc}", code="engine_error")
        return None

    # -- chat completions ------------------------------------------------------------------------

    def plan(self, ids: list[int], *, n: int, max_tokens: int | None, temperature: float, top_p: float,
             stop: tuple[str, ...], seed: int | None, logprobs: bool = False, prefix: str = "",
             end_stops: tuple[str, ...] = (), tool_names: tuple[str, ...] = (),
             structured: Any = None) -> ChatPlan:
        """A prompt's plan: ``n`` within ``limits.max_n`` (else 400 naming it), ``max_tokens``
        clamped, prompt + ``max_tokens`` within the context window (else 400
        ``context_length_exceeded``), one ``SamplingParams`` per choice, choice ``i`` seeded
        ``choice_seed(seed, i)``."""
        self.check_n(n)
        max_tokens = clamp(max_tokens, self.limits.max_tokens, self.limits.default_max_tokens)
        if self.window is not None and len(ids) + max_tokens > self.window:
            raise context_error(ValueError(
                f"this model's context window is {self.window} tokens, but the prompt has {len(ids)} "
                f"and max_tokens is {max_tokens}: shorten the prompt or lower max_tokens"))
        samplings = tuple(SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=max_tokens,
                                         stop=stop, seed=choice_seed(seed, i), structured=structured)
                          for i in range(n))
        return ChatPlan(ids, samplings, prefix, stop + end_stops, tool_names, logprobs)

    def check_n(self, n: int) -> None:
        if n > self.limits.max_n:
            raise APIError(400, f"n={n} is above this server's limit of {self.limits.max_n} "
                           "choices per request (limits.max_n)", param="n")

    def chat_plan(self, req: ChatRequest) -> ChatPlan:
        """The prompt and per-choice sampling of a chat completion (400s: module docstring)."""
        req.refuse_unsupported()
        self.check_n(req.n)  # before rendering: the cheap check first
        p = prepare(req)
        try:
            ids = self.chat_format.prompt_ids(p.messages, p.tools)
        except Exception as exc:
            raise APIError(400, f"the messages cannot be rendered with this model's chat "
                           f"template: {exc}", param="messages") from None
        if p.prefix:
            ids = ids + list(self.policy.tokenizer.encode(p.prefix, add_special_tokens=False))
        eot = self.chat_format.end_of_turn
        return self.plan(ids, n=req.n, max_tokens=req.max_completion_tokens or req.max_tokens,
                         temperature=req.temperature, top_p=req.top_p, stop=p.stop, seed=req.seed,
                         logprobs=req.logprobs, prefix=p.prefix, end_stops=(eot,) if eot else (),
                         tool_names=p.tool_names, structured=call_constraint(p) if self.constrains else None)

    async def generate(self, plan: ChatPlan) -> list[Generation]:
        """The plan's choices, one engine request each (all in flight at once)."""
        try:
            return await gather_all([self.engine.generate(plan.ids, s) for s in plan.samplings])
        except Exception as exc:
            api = self.engine_error(exc)
            if api is None:
                raise
            raise api from None

    async def chat(self, plan: ChatPlan) -> dict[str, Any]:
        return self.chat_result(plan, await self.generate(plan))

    def logprobs_of(self, plan: ChatPlan, token_ids: Sequence[int], logprobs: Sequence[float]) -> Any:
        return token_logprobs(self.policy.tokenizer, token_ids, logprobs) if plan.logprobs else None

    def chat_result(self, plan: ChatPlan, gens: Sequence[Generation]) -> dict[str, Any]:
        """The ``chat.completion`` for the generations of ``plan``'s choices."""
        choices = []
        for i, g in enumerate(gens):
            text, stopped = visible(plan.prefix + g.text, plan.stops)
            content, calls = split_reply(text, plan.tool_names)
            choices.append({"index": i, "message": message(content, calls),
                            "logprobs": self.logprobs_of(plan, g.token_ids, g.logprobs),
                            "finish_reason": finish_reason(g.finish_reason, stopped, bool(calls))})
        return completion(self.name, choices, len(plan.ids), sum(len(g.token_ids) for g in gens))

    async def chat_chunks(self, plan: ChatPlan, include_usage: bool = False,
                          on_done: Callable[[int], None] | None = None,
                          on_final: Callable[[int, Generation], None] | None = None,
                          ) -> AsyncIterator[dict[str, Any]]:
        """The streamed completion (module docstring): role chunks once the first token is there,
        then content / tool-call deltas as they can no longer change, each choice's finish chunk,
        and the usage chunk if asked; ``on_done(generated tokens)`` once every choice finished;
        ``on_final(choice, generation)`` with each choice's whole ``Generation`` as the engine
        returned it (the gateway's token-exact capture), before that choice's last chunks."""
        n = len(plan.samplings)
        deltas = merged([self.engine.stream(plan.ids, s) for s in plan.samplings])
        async with contextlib.aclosing(deltas):
            try:
                first = await anext(deltas)
            except Exception as exc:
                api = self.engine_error(exc)
                if api is None:
                    raise
                raise api from None
            cid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
            streams = [ChoiceStream(plan.prefix, plan.stops, plan.tool_names) for _ in range(n)]
            ids: list[list[int]] = [[] for _ in range(n)]
            lps: list[list[float]] = [[] for _ in range(n)]
            sent = [0] * n  # tokens whose log-probs went out
            generated = 0
            tokenizer = self.policy.tokenizer

            def logprobs(i: int) -> Any:
                out = self.logprobs_of(plan, ids[i][sent[i]:], lps[i][sent[i]:])
                sent[i] = len(ids[i])
                return out

            for i in range(n):
                yield chunk(cid, created, self.name, i, {"role": "assistant", "content": ""})
            item: tuple[int, TokenDelta] | None = first
            while item is not None:
                i, d = item
                if d.final is None:
                    ids[i].append(int(d.token_id))  # type: ignore[arg-type]
                    lps[i].append(float(d.logprob) if d.logprob is not None else float("nan"))
                    for delta in streams[i].update(tokenizer.decode(ids[i], skip_special_tokens=True)):
                        yield chunk(cid, created, self.name, i, delta, logprobs=logprobs(i))
                else:
                    g = d.final
                    if on_final is not None:
                        on_final(i, g)
                    ids[i], lps[i] = list(g.token_ids), list(g.logprobs)
                    generated += len(g.token_ids)
                    last, reason = streams[i].finish(g.text, g.finish_reason)
                    for delta in last:
                        yield chunk(cid, created, self.name, i, delta, logprobs=logprobs(i))
                    yield chunk(cid, created, self.name, i, {}, reason, logprobs=logprobs(i) if sent[i] < len(ids[i]) else None)
                try:
                    item = await anext(deltas)
                except StopAsyncIteration:
                    item = None
                except EngineError as exc:
                    raise APIError(500, f"generation failed: {exc}", code="engine_error") from None
            if on_done is not None:
                on_done(generated)
            if include_usage:
                yield chunk(cid, created, self.name, None, None, usage={
                    "prompt_tokens": len(plan.ids), "completion_tokens": generated,
                    "total_tokens": len(plan.ids) + generated})

    # -- the SQL agent ---------------------------------------------------------------------------

    async def sql(self, kind: str, body: SQLBody) -> dict[str, Any]:
        return await self.agent.sql(kind, body)
