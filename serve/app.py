"""The serve application: a FastAPI ingress in front of one ``ModelServer`` deployment per model.

    serve run serve/config.yaml                    # the Serve config file (validated by a test)
    python -m jobs.serve --model talon=runs/main/stage4/final --database shop=sqlite:///...

Endpoints (OpenAI's error shape and status codes for every failure):
- ``GET /v1/models``; ``POST /v1/chat/completions`` (non-streaming, or ``stream: true``: SSE
  ``chat.completion.chunk`` events token by token and ``data: [DONE]``); ``POST /v1/completions``
  (text completions, ``serve/completions.py``; streamed the same way);
- ``POST /v1/sql/debug`` (Talon) and ``POST /v1/sql/generate`` (Zeno): the agent runs
  server-side against a database named in the config (``serve/engine.py``);
- ``GET /healthz`` (no key needed). Unknown routes (404) and methods (405) answer OpenAI's
  error body too.

Order of checks for every ``/v1`` request: body size (413, before the body is parsed), API key
(401), rate limit (429 + ``Retry-After``), JSON and schema (400), model / database exists (404),
clamps, then admission: a model with ``ModelSpec.in_flight_limit`` requests in flight (every
replica slot taken and ``max_queued_requests`` waiting) gives 503, counted exactly by the ingress
(``serve/limits.py``'s ``Admission``; Serve's own queue limit is approximate, so it is left off);
then the model deployment. The end-to-end timeout (``limits.request_timeout_s``) gives 504.

``build_app(args)`` is the application builder ``serve run`` calls with the config's ``args``. With
``colocate: true`` the ingress replicas hold the models themselves (``LocalModel``: the same calls
as a deployment handle, without the Ray hop); otherwise each model is its own deployment.
"""



import asyncio
import inspect
import json
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from ray import serve

from . import metrics
from .completions import CompletionRequest
from .config import ServeConfig, load_serve_config
from .sql_agent import SQL_BODIES
from .http import check_length, error_response, install_error_handlers, read_json, validation_message
from .limits import Admission, RateLimiter, check_api_key
from .model_server import ModelServer
from .openai_chat import APIError, ChatRequest, error_body
from .resources import fit

api = FastAPI(title="sqlrl serve", docs_url=None, redoc_url=None)
install_error_handlers(api)
_error, _validation_message = error_response, validation_message  # the names this module used


class _LocalCall:
    """A colocated model's call: awaitable and cancellable like a ``DeploymentResponse``."""

    def __init__(self, coro: Any) -> None:
        self._task = asyncio.ensure_future(coro)

    def __await__(self) -> Any:
        return self._task.__await__()

    def cancel(self) -> None:
        self._task.cancel()


class _LocalStream:
    """A colocated model's streamed call, like a ``DeploymentResponseGenerator``."""

    def __init__(self, agen: Any) -> None:
        self._agen = agen

    def __anext__(self) -> Any:
        return self._agen.__anext__()

    def cancel(self) -> None:
        asyncio.ensure_future(self._agen.aclose())


class _Method:
    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def remote(self, *args: Any) -> Any:
        out = self.fn(*args)
        return _LocalStream(out) if inspect.isasyncgen(out) else _LocalCall(out)


class LocalModel:
    """A ``ModelServer`` in the ingress's own process (``colocate``), called as its handle is."""

    def __init__(self, server: ModelServer) -> None:
        self.server = server

    def options(self, **_: Any) -> "LocalModel":
        return self

    def __getattr__(self, name: str) -> _Method:
        return _Method(getattr(self.server, name))


@dataclass(frozen=True)
class _Endpoint:
    """A generating endpoint: its request body, and its replica calls (whole, streamed)."""
    body: Any
    whole: Callable[[Any, dict[str, Any]], Any]
    stream: Callable[[Any, dict[str, Any]], Any]


CHAT = _Endpoint(ChatRequest, lambda h, data: h.chat.remote(data),
                 lambda h, data: h.options(stream=True).chat_stream.remote(data))
TEXT = _Endpoint(CompletionRequest, lambda h, data: h.completions.remote(data),
                 lambda h, data: h.options(stream=True).completions_stream.remote(data))


@serve.deployment(max_ongoing_requests=256)
@serve.ingress(api)
class Ingress:
    def __init__(self, config: dict[str, Any], models: dict[str, Any]) -> None:
        self.config: ServeConfig = load_serve_config(config)
        # name -> DeploymentHandle of its ModelServer, or (colocate) the ModelServer itself
        if not models:  # colocate: this replica holds the models
            models = {name: LocalModel(ModelServer(name, config)) for name in self.config.models}
        self.models = models
        lim = self.config.limits
        self.limiter = RateLimiter(lim.rate_limit_per_minute, lim.rate_limit_burst)
        self.admission = Admission({name: spec.in_flight_limit(self.config.colocate)
                                    for name, spec in self.config.models.items()})
        self.keys = self.config.auth.keys()

    async def _admit(self, request: Request) -> dict[str, Any]:
        """Size, key, rate, JSON -- the checks every /v1 POST passes before any model work."""
        lim = self.config.limits
        check_length(request, lim.max_body_bytes)
        self._auth(request)
        return await read_json(request, lim.max_body_bytes)

    def _auth(self, request: Request) -> None:
        key = check_api_key(request.headers.get("authorization"), self.keys,
                            self.config.auth.required)
        self.limiter.take(key)

    def _handle(self, name: str | None) -> Any:
        if not name or name not in self.models:
            raise APIError(404, f"the model {name!r} does not exist; served: "
                           f"{', '.join(sorted(self.models))}", param="model", code="model_not_found")
        return self.models[name]

    def _deadline(self) -> float:
        return time.monotonic() + self.config.limits.request_timeout_s

    async def _call(self, awaitable: Any, cancel: Any, deadline: float) -> Any:
        """Await a model call until ``deadline``: 504 past it (the call is cancelled)."""
        try:
            return await asyncio.wait_for(awaitable, timeout=max(0.0, deadline - time.monotonic()))
        except asyncio.TimeoutError:
            cancel()
            raise APIError(504, f"the request did not finish within "
                           f"{self.config.limits.request_timeout_s} s", code="timeout") from None

    async def _run(self, endpoint: str, request: Request, work) -> Any:
        t0 = time.perf_counter()
        model, status = "-", 500
        try:
            model, response = await work()
            status = getattr(response, "status_code", 200)
            return response
        except APIError as exc:
            status = exc.status
            return _error(exc)
        except Exception as exc:  # a bug or a dead replica: still OpenAI's shape
            return JSONResponse(error_body(500, f"{type(exc).__name__}: {exc}"), status_code=500)
        finally:
            metrics.record("requests", 1, endpoint=endpoint, model=model, status=str(status))
            metrics.record("latency", (time.perf_counter() - t0) * 1000.0, endpoint=endpoint,
                           model=model)

    @api.get("/healthz")
    async def healthz(self) -> dict:
        return {"status": "ok"}

    @api.get("/v1/models")
    async def list_models(self, request: Request) -> Any:
        async def work():
            self._auth(request)
            return "-", JSONResponse({"object": "list", "data": [
                {"id": name, "object": "model", "created": 0, "owned_by": "sqlrl"}
                for name in sorted(self.models)]})
        return await self._run("models", request, work)

    async def _generate(self, endpoint: str, request: Request, api_kind: "_Endpoint") -> Any:
        """A chat or text completion: validated here, generated by the model's replica."""
        async def work():
            data = await self._admit(request)
            try:
                req = api_kind.body.model_validate(data)
            except Exception as exc:
                msg, param = _validation_message(exc)
                raise APIError(400, msg, param=param) from None
            req.refuse_unsupported()
            handle = self._handle(req.model)
            deadline = self._deadline()
            if req.stream:
                return req.model, await self._stream(req.model, handle, data, deadline, api_kind.stream)
            release = self.admission.enter(req.model)
            try:
                response = api_kind.whole(handle, data)
                kind, status, result = await self._call(response, response.cancel, deadline)
            finally:
                release()
            if kind == "error":
                raise APIError(status, result["error"]["message"], param=result["error"]["param"],
                               code=result["error"]["code"])
            return req.model, JSONResponse(result)
        return await self._run(endpoint, request, work)

    @api.post("/v1/chat/completions")
    async def chat_completions(self, request: Request) -> Any:
        return await self._generate("chat", request, CHAT)

    @api.post("/v1/completions")
    async def completions(self, request: Request) -> Any:
        return await self._generate("completions", request, TEXT)

    async def _stream(self, name: str, handle: Any, data: dict[str, Any],
                      deadline: float, start: Any = None) -> StreamingResponse:
        """SSE from the replica's ``chat_stream``: errors before the first token are a normal
        OpenAI error response; a failure or the deadline after it is an ``error`` event. The
        request stays admitted until its last event is sent, or, if the client goes away before
        the body starts (the generator then never runs), until the generator is collected."""
        release = self.admission.enter(name)
        try:
            gen = (start or CHAT.stream)(handle, data)
            kind, status, result = await self._call(gen.__anext__(), gen.cancel, deadline)
            if kind == "error":
                raise APIError(status, result["error"]["message"], param=result["error"]["param"],
                               code=result["error"]["code"])
        except BaseException:
            release()
            raise

        async def events():
            finished = False
            try:
                while True:
                    try:
                        item = await self._call(gen.__anext__(), gen.cancel, deadline)
                    except StopAsyncIteration:
                        break
                    if isinstance(item, tuple) and item and item[0] == "error":  # the replica's timeout, a failure
                        yield f"data: {json.dumps(item[2])}\n\n"
                        break
                    yield f"data: {json.dumps(item, ensure_ascii=False)}\n\n"
                finished = True
            except APIError as exc:
                finished = True
                yield f"data: {json.dumps(exc.body())}\n\n"
            except Exception as exc:  # the replica failed mid-stream
                finished = True
                yield f"data: {json.dumps(error_body(500, f'{type(exc).__name__}: {exc}'))}\n\n"
            finally:
                release()
                if not finished:  # the client went away: stop the generation in the engine
                    gen.cancel()
            yield "data: [DONE]\n\n"
        stream = events()
        weakref.finalize(stream, release)
        return StreamingResponse(stream, media_type="text/event-stream")

    async def _sql(self, kind: str, request: Request) -> Any:
        async def work():
            data = await self._admit(request)
            try:
                body = SQL_BODIES[kind].model_validate(data)
            except Exception as exc:
                msg, param = _validation_message(exc)
                raise APIError(400, msg, param=param) from None
            name = body.model or self.config.sql_models.get(kind)
            handle = self._handle(name)
            release = self.admission.enter(name)
            try:
                response = handle.sql.remote(kind, data)
                state, status, result = await self._call(response, response.cancel, self._deadline())
            finally:
                release()
            if state == "error":
                return name, JSONResponse(result, status_code=status)
            return name, JSONResponse(result)
        return await self._run(f"sql_{kind}", request, work)

    @api.post("/v1/sql/debug")
    async def sql_debug(self, request: Request) -> Any:
        return await self._sql("debug", request)

    @api.post("/v1/sql/generate")
    async def sql_generate(self, request: Request) -> Any:
        return await self._sql("generate", request)


def model_deployment(name: str, config: ServeConfig, raw: dict[str, Any], num_cpus: float) -> Any:
    spec = config.models[name]
    return serve.deployment(ModelServer).options(
        name=f"model-{name}", num_replicas=spec.num_replicas,
        max_ongoing_requests=spec.max_ongoing_requests,
        max_queued_requests=-1,  # the ingress's Admission enforces the queue limit exactly
        ray_actor_options={"num_cpus": num_cpus, "num_gpus": spec.num_gpus},
    ).bind(name, raw)


def cluster_totals() -> tuple[float | None, float | None]:
    """The connected Ray cluster's CPUs and GPUs (None, None when no Ray is connected)."""
    import ray

    if not ray.is_initialized():
        return None, None
    total = ray.cluster_resources()
    return float(total.get("CPU", 0.0)), float(total.get("GPU", 0.0))


def build_app(args: dict[str, Any], resources: tuple[float | None, float | None] | None = None) -> Any:
    """The application for ``serve run`` / ``serve.run``: ``args`` is a ``ServeConfig`` mapping.
    Resource asks are fitted to ``resources`` (CPUs, GPUs; default: the connected cluster's), or
    ``serve.resources.ResourceError`` (one line) says what does not fit and which setting fixes it."""
    config = load_serve_config(args)
    asks = fit(config, *(resources if resources is not None else cluster_totals()))
    raw = json.loads(json.dumps(args))  # plain values for the replicas
    ingress = Ingress.options(ray_actor_options={"num_cpus": asks.ingress_cpus})
    if config.colocate:  # the ingress replicas load the models themselves
        return ingress.bind(raw, {})
    models = {name: model_deployment(name, config, raw, asks.model_cpus[name]) for name in config.models}
    return ingress.bind(raw, models)
