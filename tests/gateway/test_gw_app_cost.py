"""``serve.gateway_app_cost``: the in-process driver of the gateway's ASGI app that the overhead
measurements in docs/gateway.md rely on -- it really goes through the app (every call is traced
and answered 200), and it counts what it claims to count."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_app_cost_drives_the_app_and_reports_cpu_and_python_calls(tmp_path):
    out = tmp_path / "cost.json"
    run = subprocess.run([sys.executable, "-m", "serve.gateway_app_cost", "--calls", "3", "--rounds", "2",
                          "--live", "3", "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    r = json.loads(out.read_text())
    assert r["live"] == 3 and len(r["cpu_ms"]["app"]) == len(r["cpu_ms"]["direct"]) == 2
    # the app does the direct path's work (rendering, the result) and more: HTTP, checks, capture
    assert r["python_calls"]["app"] > r["python_calls"]["direct"] > 0
    assert all(x > 0 for xs in r["cpu_ms"].values() for x in xs)
    assert "the app adds" in run.stdout


def test_asgi_call_refuses_an_answer_that_is_not_200(tmp_path):
    """The driver asserts the status: a call the app refuses is not silently counted as a call."""
    import asyncio

    import pytest
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse

    from serve.gateway_app_cost import asgi_call

    app = FastAPI()

    @app.post("/x")
    async def refuse() -> JSONResponse:
        return JSONResponse({"error": "no"}, status_code=401)

    with pytest.raises(AssertionError):
        asyncio.run(asgi_call(app, "/x", b"{}")())
