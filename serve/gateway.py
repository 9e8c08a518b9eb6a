"""The gateway's HTTP app: OpenAI-compatible, rollout-scoped endpoints for agents written elsewhere
(issue 44; the contract is docs/gateway.md).

    app = build_gateway_app(rollouts, model, keys=frozenset({"key1"}))
    with serving(app) as url: ...                    # in this process (uvicorn on a thread)

``rollouts`` is the job's ``sqlrl.gateway.rollouts.Rollouts`` (claims, calls, sessions, deadlines,
rewards); ``model`` a ``serve.engine.ModelEngine`` over the policy's ``AsyncEngine`` -- the same object
the serve app uses, so requests are rendered with the policy's chat template, tool calls come back
as structured ``tool_calls`` and streams are token by token exactly as ``serve/`` answers them
(``ModelEngine.chat_plan`` / ``generate`` / ``chat_result`` / ``chat_chunks``).

Routes (every one needs ``Authorization: Bearer <key>``; errors are OpenAI's body):
- ``POST /v1/rollouts`` ``{}`` or ``{"kinds": [...]}`` (the task kinds the client handles; absent or
  null: any) -> the next rollout of those kinds (``base_url``, ``task`` -- ``Claim.task_payload`` --,
  ``session_url``, ``complete_url``, ``deadline_s``); 204 + ``Retry-After`` when none waits; 410 when
  the job has finished handing out work (of those kinds); 400 ``param: kinds`` for a malformed or
  unknown kind, 409 ``kinds_not_offered`` when the job hands out none of them. A task whose setup
  SQL fails is never handed out: the claim answers with the next one (``Rollouts.claim``).
- ``POST /rollouts/{id}/v1/chat/completions`` (``n`` must be 1; ``stream`` supported) and
  ``GET /rollouts/{id}/v1/models``.
- ``POST /v1/rollouts/{id}/sql`` ``{"sql"}`` -> ``{"observation", "is_error"}``; a rollout's
  statements run one at a time, in arrival order: the others wait on the event loop (an
  ``asyncio.Lock`` per rollout), never in a worker thread, so one client's burst of concurrent
  SQL cannot take the threads every other rollout's SQL, claims and completions run in; the
  statements run in the app's own pool (``GatewayConfig.sql_workers`` threads, ``app.state.sql_pool``;
  shut down by ``close_gateway_app`` when the server stops, or when the app is collected),
  so slow SQL on many rollouts never delays claims, completions or expiry (the loop's default
  executor).
- ``POST /v1/rollouts/{id}/complete`` ``{"sql"}`` or ``{"reward"}`` -> ``{"rollout_id", "status",
  "reward"}``.

Capture: a chat call is recorded (``CallTicket.commit``) with ``plan.ids`` -- the ids the engine
generated from -- and the engine's own ``Generation`` (streamed: ``chat_chunks``' ``on_final``),
only once the answer was produced whole (streamed: after its last chunk); a call that fails, is
cancelled, whose stream the client drops, or whose client goes away before a non-streamed answer
(a client timeout: the engine request is aborted, ``_unless_gone``) is abandoned (``n_incomplete``):
the trace never holds an answer its agent did not receive. A bad request
(validation, context length, ``n`` > 1, a bad tag) is refused before the call begins: it is neither
recorded nor counted. Order of checks: body size (413), key (401), rate (429), expiry of overdue
rollouts, JSON and schema (400), the rollout (404 / 409), then the work. A gateway restarted under
a policy version > 0 (``Rollouts.awaiting_weights``) holds chat calls until the job restores its
weights (``during_update: wait``) or answers them 429 + ``Retry-After`` (``reject``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import json
import socket
import threading
import weakref
from typing import Any, Awaitable, Callable, Iterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StrictStr

from sqlrl.gateway.capture import TAG_HEADER, call_tag
from sqlrl.gateway.rollouts import Claim, GatewayError, NoWorkNow, RolloutClosed, Rollouts

from .config import LimitsSpec
from .engine import ModelEngine
from .http import check_length, error_response, install_error_handlers, read_json, validation_message
from .limits import RateLimiter, check_api_key
from .openai_chat import APIError, ChatRequest, error_body

Endpoint = Callable[[Any], Awaitable[Any]]  # a plain Starlette endpoint: Request -> Response


class ClaimBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kinds: list[StrictStr] | None = None  # the task kinds the client handles (None: any)


class SQLBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    sql: str = Field(min_length=1)


class CompleteBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    sql: str | None = None
    reward: StrictFloat | StrictInt | None = None


def _api_error(exc: GatewayError) -> APIError:
    headers = {"Retry-After": str(exc.retry_after_s)} if exc.retry_after_s else None
    return APIError(exc.status, str(exc), param=exc.param, code=exc.code, headers=headers)


def _parse(model: type[BaseModel], data: dict[str, Any]) -> Any:
    try:
        return model.model_validate(data)
    except Exception as exc:
        msg, param = validation_message(exc)
        raise APIError(400, msg, param=param) from None


async def _disconnected(request: Request) -> None:
    """Returns when the client disconnects (the ASGI ``http.disconnect`` message; the body was read)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _sse(item: Any) -> str:
    return f"data: {json.dumps(item, ensure_ascii=False)}\n\n"


def claim_view(claim: Claim, base: str) -> dict[str, Any]:
    rid = claim.rollout_id
    return {"rollout_id": rid, "base_url": f"{base}/rollouts/{rid}/v1",
            "task": claim.task_payload(),  # any kind: sqlrl.gateway.contract.task_payload
            "session_url": f"{base}/v1/rollouts/{rid}/sql",
            "complete_url": f"{base}/v1/rollouts/{rid}/complete", "deadline_s": claim.deadline_s}


async def _weights_restored(rollouts: Rollouts) -> None:
    """Until the engine has the job's weights (``Rollouts.when_weights``: at once but after a restart)."""
    if not rollouts.awaiting_weights:  # the usual case: no future, no waiter (re-checked under the lock below)
        return
    loop = asyncio.get_running_loop()
    ready = loop.create_future()
    if not rollouts.when_weights(lambda: loop.call_soon_threadsafe(lambda: ready.done() or ready.set_result(None))):
        await ready


def build_gateway_app(rollouts: Rollouts, model: ModelEngine, *, keys: frozenset[str],
                      limits: LimitsSpec | None = None, public_url: str | None = None) -> FastAPI:
    """The app (module docstring). ``public_url``: the address clients reach it at (None: the
    request's own base URL; settable later as ``app.state.public_url``, once a server bound its
    port); ``limits``: body, token, rate limits (default: ``model``'s)."""
    lim = limits or model.limits
    limiter = RateLimiter(lim.rate_limit_per_minute, lim.rate_limit_burst)
    app = FastAPI(title="sqlrl gateway", docs_url=None, redoc_url=None)
    install_error_handlers(app)
    app.state.rollouts, app.state.model, app.state.public_url = rollouts, model, public_url

    async def key_of(request: Request) -> str:
        key = check_api_key(request.headers.get("authorization"), keys)
        limiter.take(key)
        if rollouts.due():
            await asyncio.to_thread(rollouts.expire_due)
        return key

    async def admitted(request: Request, body: type[BaseModel]) -> tuple[str, Any, dict[str, Any]]:
        """Size, key, rate, expiry, JSON, schema: ``(key, parsed body, raw body)``."""
        check_length(request, lim.max_body_bytes)
        key = await key_of(request)
        data = await read_json(request, lim.max_body_bytes)
        return key, _parse(body, data), data

    def route(path: str, methods: list[str]) -> Callable[[Endpoint], Endpoint]:
        """A plain Starlette route: the endpoint takes the ``Request`` and returns a ``Response``
        (path parameters from ``request.path_params``) -- no FastAPI dependency solving, parameter
        parsing or response serialisation on every call (the gateway does its own validation)."""
        def add(endpoint: Endpoint) -> Endpoint:
            app.router.add_route(path, endpoint, methods=methods, include_in_schema=False)
            return endpoint
        return add

    async def answer(work: Callable[[], Awaitable[Any]]) -> Any:
        try:
            return await work()
        except GatewayError as exc:
            if isinstance(exc, NoWorkNow):  # not an error: nothing to hand out yet
                return Response(status_code=204, headers={"Retry-After": str(exc.retry_after_s)})
            return error_response(_api_error(exc))
        except APIError as exc:
            return error_response(exc)
        except Exception as exc:  # a bug, a scorer failure: still OpenAI's shape
            return JSONResponse(error_body(500, f"{type(exc).__name__}: {exc}"), status_code=500)

    @route("/healthz", ["GET"])
    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    @route("/v1/rollouts", ["POST"])
    async def claim(request: Request) -> Any:
        async def work() -> Any:
            key, body, _ = await admitted(request, ClaimBody)
            got = await asyncio.to_thread(rollouts.claim, key, body.kinds)
            base = app.state.public_url or str(request.base_url).rstrip("/")
            return JSONResponse(claim_view(got, base))
        return await answer(work)

    @route("/rollouts/{rollout_id}/v1/models", ["GET"])
    async def models(request: Request) -> Any:
        rollout_id = request.path_params["rollout_id"]

        async def work() -> Any:
            rollouts.check(await key_of(request), rollout_id)
            return JSONResponse({"object": "list", "data": [
                {"id": model.name, "object": "model", "created": 0, "owned_by": "sqlrl"}]})
        return await answer(work)

    @route("/rollouts/{rollout_id}/v1/chat/completions", ["POST"])
    async def chat(request: Request) -> Any:
        rollout_id = request.path_params["rollout_id"]

        async def work() -> Any:
            key, req, data = await admitted(request, ChatRequest)
            if req.n != 1:
                raise APIError(400, "n: the gateway traces one choice per call; n must be 1", param="n")
            try:
                tag = call_tag(data, request.headers.get(TAG_HEADER))
            except ValueError as exc:
                raise APIError(400, str(exc), param="metadata") from None
            rollouts.check(key, rollout_id)
            plan = model.chat_plan(req)  # 400s (template, context length) before the call begins
            if rollouts.config.during_update == "wait":
                await _weights_restored(rollouts)  # a restarted gateway: held until the job restores them
            runner: dict[str, asyncio.Task] = {"task": asyncio.current_task()}  # type: ignore[dict-item]
            loop = asyncio.get_running_loop()
            ticket = rollouts.begin_call(key, rollout_id,
                                         cancel=lambda: loop.call_soon_threadsafe(runner["task"].cancel))
            if req.stream:
                return await _stream(plan, req, ticket, tag, runner)
            try:
                answered, gens = await _unless_gone(request, model.generate(plan))
            except asyncio.CancelledError:
                ticket.abandon()
                if rollouts.rollout_status(rollout_id) in ("active", None):
                    raise  # the server cancelled us, not the rollout's end
                raise RolloutClosed(f"rollout {rollout_id} ended while this call ran") from None
            except BaseException:
                ticket.abandon()
                raise
            if not answered:  # the client went away first (its timeout): the engine request was aborted
                ticket.abandon()
                return Response(status_code=499)  # nobody reads it
            ticket.commit(plan.ids, gens[0], tag)
            return JSONResponse(model.chat_result(plan, gens))
        return await answer(work)

    async def _unless_gone(request: Request, work: Awaitable[Any]) -> tuple[bool, Any]:
        """``work`` while watching the client's connection: ``(True, result)`` when it finished first,
        ``(False, None)`` when the client disconnected first (``work`` is cancelled: the engine
        request aborts). A cancel of the caller cancels ``work`` too. ``work`` runs in the caller's
        own task (its engine request is submitted at once and its answer wakes the caller
        directly); one watcher task cancels the caller when the client goes away, and that cancel
        is taken back (``uncancel``) once handled here."""
        me = asyncio.current_task()
        assert me is not None
        gone = False

        async def watch() -> None:
            nonlocal gone
            await _disconnected(request)
            gone = True
            me.cancel()

        watcher = asyncio.ensure_future(watch())
        try:
            return True, await work
        except asyncio.CancelledError:
            if not gone:
                raise  # the server's cancel (an expired rollout, a shutdown), not the client's
            me.uncancel()
            return False, None
        finally:
            watcher.cancel()

    async def _stream(plan: Any, req: ChatRequest, ticket: Any, tag: str | None,
                      runner: dict[str, Any]) -> StreamingResponse:
        finals: list[Any] = []
        include_usage = bool((req.stream_options or {}).get("include_usage"))
        chunks = model.chat_chunks(plan, include_usage, on_final=lambda i, g: finals.append(g))
        try:
            first = await anext(chunks)  # errors before the first token: a plain error response
        except BaseException:
            ticket.abandon()
            with contextlib.suppress(BaseException):
                await chunks.aclose()
            raise

        async def events() -> Any:
            runner["task"] = asyncio.current_task()
            whole = False
            try:
                yield _sse(first)
                async for item in chunks:
                    yield _sse(item)
                ticket.commit(plan.ids, finals[0], tag)
                whole = True
            except APIError as exc:
                yield _sse(exc.body())
            except GatewayError as exc:
                yield _sse(_api_error(exc).body())
            except Exception as exc:  # the engine failed mid-stream
                yield _sse(error_body(500, f"{type(exc).__name__}: {exc}"))
            finally:
                with contextlib.suppress(BaseException):
                    await chunks.aclose()  # closes the engine stream: its request aborts
                if not whole:
                    ticket.abandon()  # a dropped client, a cancel, a failure: nothing half recorded
            yield "data: [DONE]\n\n"

        stream = events()
        weakref.finalize(stream, ticket.abandon)  # a client gone before the body started
        return StreamingResponse(stream, media_type="text/event-stream")

    # a rollout's SQL turn (FIFO), alive while a request holds or waits for it: concurrent statements
    # on one rollout wait on the loop, so they cannot take every worker thread from other rollouts
    sql_turns: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
    # ... and runs in threads of its own (``GatewayConfig.sql_workers``), so slow statements on many
    # rollouts hold none of the loop's default threads, in which claims, completions and expiry run
    sql_pool = concurrent.futures.ThreadPoolExecutor(rollouts.config.sql_workers, thread_name_prefix="sqlrl-gw-sql")
    app.state.sql_pool = sql_pool
    # the pool ends with the app: when its server stops (``close_gateway_app``) or, at the latest,
    # when the app is collected -- its threads never outlive it idle
    app.state.close = weakref.finalize(app, sql_pool.shutdown, wait=False)

    @route("/v1/rollouts/{rollout_id}/sql", ["POST"])
    async def sql(request: Request) -> Any:
        rollout_id = request.path_params["rollout_id"]

        async def work() -> Any:
            key, body, _ = await admitted(request, SQLBody)
            rollouts.check(key, rollout_id)  # 404 / 409 first: a foreign key never waits behind the owner's SQL
            turn = sql_turns.get(rollout_id)
            if turn is None:
                turn = sql_turns[rollout_id] = asyncio.Lock()
            async with turn:  # one statement at a time per rollout, waiting here -- not in a worker thread
                observation, is_error = await asyncio.get_running_loop().run_in_executor(
                    sql_pool, functools.partial(rollouts.execute_sql, key, rollout_id, body.sql))
            return JSONResponse({"observation": observation, "is_error": is_error})
        return await answer(work)

    @route("/v1/rollouts/{rollout_id}/complete", ["POST"])
    async def complete(request: Request) -> Any:
        rollout_id = request.path_params["rollout_id"]

        async def work() -> Any:
            key, body, _ = await admitted(request, CompleteBody)
            # the reward as sent (an int of any size): ``GatewayConfig.check_complete`` bounds it first
            trace = await asyncio.to_thread(rollouts.complete, key, rollout_id, sql=body.sql, reward=body.reward)
            return JSONResponse({"rollout_id": trace.rollout_id, "status": trace.status,
                                 "reward": trace.reward})
        return await answer(work)

    return app


def close_gateway_app(app: FastAPI) -> None:
    """Release what ``app`` holds (its SQL pool: statements running finish in their threads, new
    ones are refused). Idempotent; an app is served once: call it when its server has stopped."""
    app.state.close()


@contextlib.contextmanager
def serving(app: FastAPI, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """``app`` served by uvicorn on a thread of this process (tests, benchmarks, a notebook); yields
    its base URL. The socket listens before the server starts, so a client that connects early
    waits in the backlog instead of being refused. On exit the server stops and the app is closed
    (``close_gateway_app``)."""
    import uvicorn

    sock = socket.socket()
    sock.bind((host, port))
    sock.listen(64)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="sqlrl-gateway", daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
        close_gateway_app(app)
