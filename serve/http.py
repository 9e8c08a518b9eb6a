"""HTTP pieces every sqlrl FastAPI app shares (the serve ingress, the gateway): OpenAI-shaped
errors for FastAPI's own failures, and reading a bounded JSON body.

- ``install_error_handlers(app)``: unknown routes (404), methods (405) and FastAPI's request
  validation errors (400) answer OpenAI's error body, never FastAPI's ``{"detail": ...}``.
- ``validation_message(exc)``: ``(message, param)`` of a pydantic / FastAPI validation error.
- ``error_response(exc)``: an ``APIError`` as a ``JSONResponse`` (its status and headers).
- ``check_length(request, max_bytes)`` (413 from ``Content-Length`` before anything is read) and
  ``read_json(request, max_bytes)`` (413 while reading, 400 for a body that is not a JSON object --
  nested too deeply for the parser (``RecursionError``) included: a client error, never a 500).
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from .openai_chat import APIError, error_body


async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
    """Unknown routes (404) and methods (405) in OpenAI's error shape, not FastAPI's ``detail``."""
    where = f"{request.method} {request.url.path}"
    message = {404: f"Invalid URL ({where})",
               405: f"Method not allowed ({where})"}.get(exc.status_code, str(exc.detail))
    return JSONResponse(error_body(exc.status_code, message), status_code=exc.status_code,
                        headers=dict(exc.headers or {}))


async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    msg, param = validation_message(exc)
    return JSONResponse(error_body(400, msg, param=param), status_code=400)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(HTTPException, http_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, validation_error)  # type: ignore[arg-type]


def error_response(exc: APIError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


def validation_message(exc: Exception) -> tuple[str, str | None]:
    errors = getattr(exc, "errors", lambda: [])()
    if errors:
        e = errors[0]
        loc = ".".join(str(x) for x in e.get("loc", ()) if x != "body")
        return f"{loc}: {e.get('msg')}" if loc else str(e.get("msg")), loc or None
    return str(exc), None


def check_length(request: Request, max_bytes: int) -> None:
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > max_bytes:
        raise APIError(413, f"request body of {length} bytes exceeds {max_bytes}")


async def read_json(request: Request, max_bytes: int) -> dict[str, Any]:
    body = b""
    async for part in request.stream():
        body += part
        if len(body) > max_bytes:
            raise APIError(413, f"request body exceeds {max_bytes} bytes")
    try:
        data = json.loads(body or b"null")
    except ValueError as exc:
        raise APIError(400, f"the body is not valid JSON: {exc}") from None
    except RecursionError:  # e.g. 100k nested arrays: fits the size limit, exceeds the parser's depth
        raise APIError(400, "the body is not valid JSON: nested too deeply") from None
    if not isinstance(data, dict):
        raise APIError(400, "the body must be a JSON object")
    return data
