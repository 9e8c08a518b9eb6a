"""sqlrl's serving app under load, run as a Ray job by tests/e2e/test_monitoring.py.

It deploys the real app with ``jobs.serve`` (the tiny model as Zeno, a generated SQLite database,
no API key: loopback only), then sends a steady trickle of chat completions and server-side SQL
agent runs for SECONDS, so that Ray Serve's built-in metrics and sqlrl's ``ray_sqlrl_serve_*``
metrics have series on the console page. The app keeps running after the job ends (Serve is
detached); ``monitor.sh stop`` ends it with the Ray head.

    python tests/e2e/serve_load.py PORT SECONDS
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
import urllib.request
from pathlib import Path


def post(port: int, path: str, body: dict) -> dict:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def main(port: int, seconds: float) -> None:
    from jobs.serve import main as serve_main
    from sqlrl.tasks.demo_db import build_demo_database

    db = Path(tempfile.mkdtemp(prefix="sqlrl-serve-load-")) / "shop.sqlite"
    build_demo_database(str(db))
    assert serve_main(["--model", "zeno=tiny", "--database", f"shop=sqlite:///{db}", "--no-auth",
                       "--port", str(port), "--once"]) == 0
    n, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:  # a steady trickle, so rate() over the scrapes has points
        chat = post(port, "/v1/chat/completions", {"model": "zeno", "max_tokens": 4,
                                                    "messages": [{"role": "user", "content": f"hi {n}"}]})
        assert chat["object"] == "chat.completion", chat
        sql = post(port, "/v1/sql/generate", {"database": "shop", "question": "How many customers?",
                                              "max_turns": 2, "max_tokens": 12})
        assert sql["object"] == "sql.generate", sql
        n += 1
        time.sleep(0.2)
    print(f"serve load: {n} chat + {n} SQL requests answered")


if __name__ == "__main__":
    main(int(sys.argv[1]), float(sys.argv[2]))
