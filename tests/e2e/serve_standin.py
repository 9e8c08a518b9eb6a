"""A stand-in Ray Serve app for tests/e2e/test_monitoring.py, run as a Ray job.

sqlrl's own serving app is ``serve.app:build_app``; this echo
deployment makes Ray Serve emit its built-in metrics (replica processing latency, HTTP requests and
their latency), so that the console page's serving graphs are checked against real series. It is
not sqlrl's serving app and says nothing about it.

    python tests/e2e/serve_standin.py PORT SECONDS   # HTTP on 127.0.0.1:PORT, requests for SECONDS
"""

from __future__ import annotations

import sys
import time
import urllib.request

from ray import serve


@serve.deployment(ray_actor_options={"num_cpus": 0.1})
class Echo:
    async def __call__(self, request) -> str:
        return "ok"


def main(port: int, seconds: float) -> None:
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(Echo.bind(), name="standin", route_prefix="/echo")
    n, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:  # a steady trickle, so rate() over the scrapes has points
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/echo", timeout=30) as response:
            assert response.read() == b"ok"
        n += 1
        time.sleep(0.2)
    print(f"serve stand-in: {n} requests answered")


if __name__ == "__main__":
    main(int(sys.argv[1]), float(sys.argv[2]))
