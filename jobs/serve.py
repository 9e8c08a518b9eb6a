"""python -m jobs.serve: serve trained models over HTTP (Ray Serve; the app is serve/app.py).

    python -m jobs.serve --model talon=runs/talon/stage4/final --model zeno=runs/main/stage4/final \\
        --database shop=sqlite:///$PWD/runs/data/synth/databases/shop/shop.sqlite --port 8000
    ray job submit --working-dir . -- python -m jobs.serve --model zeno=$PWD/runs/main/stage4/final ...

``--model NAME=PATH`` (repeatable; PATH a checkpoint folder or a named model such as ``tiny``),
With one model and no ``sql_models`` in ``--config``, that model answers both SQL endpoints.
``--database NAME=URL`` (repeatable; a SQLite URL, or the session URL of a sealed PostgreSQL /
MariaDB base), ``--config FILE`` (a YAML mapping of ``serve.config.ServeConfig``; the flags add to
it; ``--model`` sets ``models.NAME.policy.model`` and ``.backend``), ``--backend hf|vllm|auto``
(default hf; auto: vLLM where it can serve the model, else HF). API keys come from
``SQLRL_SERVE_API_KEYS`` (comma-separated) unless ``--no-auth``. It connects to the running Ray
cluster (``ray job submit``) or starts a local one, deploys the app and keeps serving until
interrupted (``--once``: deploy, print the address, and return -- for tests). The app's CPU asks
are fitted to the cluster (``serve/resources.py``: models without ``num_cpus`` share what the
ingress leaves); asks that cannot fit are refused before anything deploys, in one line naming the
setting to change (exit status 2).
Reads top to bottom: parse -> config -> start Serve -> deploy -> wait.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import yaml


def pairs(values: list[str], flag: str) -> dict[str, str]:
    out = {}
    for v in values:
        name, sep, rest = v.partition("=")
        if not sep or not name or not rest:
            raise SystemExit(f"{flag} takes NAME=VALUE, got {v!r}")
        out[name] = rest
    return out


def build_args(a: argparse.Namespace) -> dict[str, Any]:
    args: dict[str, Any] = yaml.safe_load(open(a.config)) if a.config else {}
    models = args.setdefault("models", {})
    for name, path in pairs(a.model, "--model").items():
        entry = models.setdefault(name, {})
        entry["policy"] = {**entry.get("policy", {}), "model": path, "backend": a.backend}
    dbs = args.setdefault("databases", {})
    for name, url in pairs(a.database, "--database").items():
        dbs[name] = {"url": url}
    if "sql_models" not in args and len(models) == 1:  # one model answers both SQL endpoints
        only = next(iter(models))
        args["sql_models"] = {"debug": only, "generate": only}
    if a.no_auth:
        args.setdefault("auth", {})["required"] = False
    return args


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m jobs.serve", description=__doc__.split("\n")[0])
    ap.add_argument("--model", action="append", default=[], help="NAME=PATH (repeatable)")
    ap.add_argument("--database", action="append", default=[], help="NAME=URL (repeatable)")
    ap.add_argument("--config", help="a YAML ServeConfig mapping")
    ap.add_argument("--backend", default="hf", choices=["hf", "vllm", "auto", "scripted"])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--no-auth", action="store_true", help="no API key needed (local use only)")
    ap.add_argument("--once", action="store_true", help="deploy and return")
    a = ap.parse_args(argv)
    args = build_args(a)

    from serve.config import load_serve_config

    config = load_serve_config(args)  # fail here, before Ray starts, on a bad config
    if config.auth.required and not config.auth.keys():
        print(f"serve: no API keys: set {config.auth.api_keys_env}=key1,key2 or pass --no-auth",
              file=sys.stderr)
        return 2

    import ray
    from ray import serve

    from serve.app import build_app
    from serve.resources import ResourceError

    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    ray.init(ignore_reinit_error=True)
    try:
        app = build_app(args)  # resource asks fitted to the cluster, or one line saying what to change
    except ResourceError as exc:
        print(exc, file=sys.stderr)
        return 2
    serve.start(http_options={"host": a.host, "port": a.port})
    serve.run(app, name="sqlrl", route_prefix="/")
    print(f"serve: models {', '.join(config.models)} at http://{a.host}:{a.port}/v1", flush=True)
    if a.once:
        return 0
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        serve.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
