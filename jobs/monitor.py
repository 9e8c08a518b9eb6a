"""``python -m jobs.monitor {start,stop,status,screenshot}``: Prometheus for a Ray head, with sqlrl's
console page (``bash scripts/monitor.sh`` runs it, after installing Debian's ``prometheus``).

``start``:
1. **The Ray head.** If nothing answers on ``127.0.0.1:$SQLRL_RAY_PORT`` (6379), it starts a head in a
   session of its own, with ``--metrics-export-port``, its files in ``$SQLRL_MONITOR_DIR/ray`` and
   ``RAY_PROMETHEUS_HOST`` pointing at the Prometheus below, so the dashboard queries it. If a head
   answers, it uses that head; Ray's files are read from ``$SQLRL_RAY_TEMP_DIR`` (``/tmp/ray``), and
   a head that wrote its files elsewhere is an error that says which variable to set.
2. **Prometheus** (``$SQLRL_PROMETHEUS``) on ``127.0.0.1:$SQLRL_PROM_PORT`` (9090), with Ray's own
   scrape configs unchanged (``session_latest/metrics/prometheus/prometheus.yml``, which reads Ray's
   ``prom_metrics_service_discovery.json``: every node's metrics endpoint), only the scrape interval
   set (``$SQLRL_PROM_SCRAPE_S``, 5 s), and ``deploy/monitoring/consoles`` served at ``/consoles/``.
   ``start`` returns once ``/-/ready`` answers, and prints the addresses to open.

``stop`` ends what ``start`` started: Prometheus (the recorded pid, checked to be that Prometheus),
and the Ray head only if ``start`` started it. The head is stopped as every process of its session
(raylet first, GCS last, SIGKILL after a grace period), never with ``ray stop``, which would end
every Ray on the machine. A second ``stop`` does nothing. ``status`` prints the same addresses, the
scrape targets that are up, and whether the dashboard sees Prometheus. ``screenshot`` renders the
console page in headless Chromium (``jobs/monitor_page.py``).

Bad input (a malformed port, a missing binary, an unknown subcommand) exits non-zero with one
line that says what to do.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
CONSOLES = ROOT / "deploy" / "monitoring" / "consoles"
CONSOLE_LIBRARIES = ROOT / "deploy" / "monitoring" / "console_libraries"
CONSOLE_PAGE = "consoles/sqlrl.html"


class MonitorError(RuntimeError):
    """A one-line, actionable error (the CLI prints it and exits 1)."""


@dataclass(frozen=True)
class Settings:
    dir: Path
    prom_port: int
    scrape_s: int
    ray_port: int
    dashboard_port: int
    metrics_port: int
    ray_cpus: int
    ray_temp_dir: str | None  # None: /tmp/ray for a running head, dir/ray for one started here
    ray_start_args: tuple[str, ...]
    prometheus: str
    chromium: str

    @staticmethod
    def from_env(env: dict[str, str] | None = None) -> "Settings":
        env = dict(os.environ if env is None else env)

        def integer(name: str, default: int, low: int = 1, high: int = 65535) -> int:
            raw = env.get(name, str(default))
            if not raw.strip().isdigit() or not low <= int(raw) <= high:
                raise MonitorError(f"{name}={raw!r} must be an integer from {low} to {high}")
            return int(raw)

        return Settings(
            dir=Path(env.get("SQLRL_MONITOR_DIR", "/tmp/sqlrl-monitor")),
            prom_port=integer("SQLRL_PROM_PORT", 9090), scrape_s=integer("SQLRL_PROM_SCRAPE_S", 5, 1, 3600),
            ray_port=integer("SQLRL_RAY_PORT", 6379), dashboard_port=integer("SQLRL_DASHBOARD_PORT", 8265),
            metrics_port=integer("SQLRL_METRICS_EXPORT_PORT", 8080), ray_cpus=integer("SQLRL_RAY_CPUS", 8, 1, 4096),
            ray_temp_dir=env.get("SQLRL_RAY_TEMP_DIR") or None,
            ray_start_args=tuple(shlex.split(env.get("SQLRL_RAY_START_ARGS", ""))),
            prometheus=env.get("SQLRL_PROMETHEUS", "prometheus"), chromium=env.get("SQLRL_CHROMIUM", "chromium"))

    @property
    def prom_url(self) -> str:
        return f"http://127.0.0.1:{self.prom_port}"

    @property
    def state_file(self) -> Path:
        return self.dir / "state.json"


# --------------------------------------------------------------------------------------- helpers

def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex((host, port)) == 0


def http_get(url: str, headers: dict[str, str] | None = None, timeout: float = 5.0) -> tuple[int, str]:
    """``(status, body)``; ``(0, reason)`` when nothing answers."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=timeout) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError) as exc:
        return 0, str(getattr(exc, "reason", exc))


def wait_until(what: str, check: Any, timeout_s: float, still_alive: Any = None) -> Any:
    """Poll ``check()`` until it returns something truthy; ``MonitorError`` after ``timeout_s`` or
    as soon as ``still_alive()`` says the process that should produce it has died."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if still_alive is not None and not still_alive():
            raise MonitorError(f"{what}: the process exited before it was ready")
        if time.monotonic() > deadline:
            raise MonitorError(f"{what}: not ready after {timeout_s:.0f} s")
        time.sleep(0.5)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return ""


def session_pids(sid: int) -> list[int]:
    """Every live process whose session id is ``sid`` (Linux /proc)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 3 and int(fields[3]) == sid and fields[0] != "Z":
            out.append(int(d.name))
    return out


def stop_session(sid: int, grace_s: float = 10.0) -> int:
    """End every process of session ``sid`` in Ray's order (raylet, others, gcs_server): SIGTERM,
    then SIGKILL for what is left after ``grace_s``. Returns how many processes there were."""
    pids = session_pids(sid)
    buckets = ([p for p in pids if "raylet" in _cmdline(p).split(" ")[0]],
               [p for p in pids if not any(n in _cmdline(p).split(" ")[0] for n in ("raylet", "gcs_server"))],
               [p for p in pids if "gcs_server" in _cmdline(p).split(" ")[0]])
    for bucket in buckets:
        for pid in bucket:
            _signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s / 3
        while time.monotonic() < deadline and set(bucket) & set(session_pids(sid)):
            time.sleep(0.2)
    for pid in session_pids(sid):
        _signal(pid, signal.SIGKILL)
    wait_until(f"the Ray head's processes (session {sid})", lambda: not session_pids(sid), 30)
    return len(pids)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _state(s: Settings) -> dict[str, Any]:
    try:
        return json.loads(s.state_file.read_text())
    except (OSError, ValueError):
        return {}


def _prometheus_alive(state: dict[str, Any]) -> bool:
    pid = state.get("prometheus_pid")
    return bool(pid) and str(state.get("config")) in _cmdline(int(pid))


def _ray_bin() -> str:
    here = Path(sys.executable).with_name("ray")
    return str(here) if here.exists() else (shutil.which("ray") or "ray")


def _auth_headers() -> dict[str, str]:
    """Ray's own token header for the dashboard (token auth; empty when auth is off)."""
    try:
        from ray._private.authentication.http_token_authentication import get_auth_headers_if_auth_enabled

        return dict(get_auth_headers_if_auth_enabled({}))
    except Exception:  # an older Ray, or no token: the health check then reports what it got
        return {}


# ----------------------------------------------------------------------------------------- start

def _start_head(s: Settings, temp: Path) -> int:
    """Start a Ray head in a new session; returns the session id (the ``ray start`` pid)."""
    env = {**os.environ, "RAY_PROMETHEUS_HOST": s.prom_url, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
           "RAY_USAGE_STATS_ENABLED": "0"}
    env.setdefault("RAY_AUTH_MODE", "token")
    ray = _ray_bin()
    if env["RAY_AUTH_MODE"] == "token":  # Ray >= 2.59 local clusters use token auth: make the token once
        subprocess.run([ray, "get-auth-token", "--generate"], env=env, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, check=False)
    cmd = [ray, "start", "--head", "--node-ip-address=127.0.0.1", f"--port={s.ray_port}", f"--num-cpus={s.ray_cpus}",
           "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={s.dashboard_port}",
           f"--metrics-export-port={s.metrics_port}", f"--temp-dir={temp}", "--disable-usage-stats",
           *s.ray_start_args]
    log = s.dir / "ray-start.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        rc = proc.wait(timeout=300)
    if rc != 0:
        stop_session(proc.pid)
        tail = log.read_text(errors="replace").strip().splitlines()[-3:]
        raise MonitorError(f"ray start failed (exit {rc}; {log}): {' / '.join(tail)}")
    return proc.pid


def _ray_scrape_configs(s: Settings, temp: Path, owned: bool, ray_sid: int | None) -> list[dict[str, Any]]:
    """Ray's generated scrape configs (file-based service discovery), once Ray has written them."""
    session = temp / "session_latest"
    ray_yml = session / "metrics" / "prometheus" / "prometheus.yml"
    if not owned and not ray_yml.is_file():
        raise MonitorError(f"a Ray head answers on 127.0.0.1:{s.ray_port}, but {ray_yml} does not exist: set "
                           f"SQLRL_RAY_TEMP_DIR to that head's --temp-dir (or stop it and let start make one)")
    alive = (lambda: bool(session_pids(ray_sid))) if ray_sid else None
    wait_until(f"Ray's Prometheus config {ray_yml}", ray_yml.is_file, 120, alive)
    ports = {p.read_text().strip() for p in session.glob("gcs_server_port_*")}
    if ports and str(s.ray_port) not in ports:
        raise MonitorError(f"{session} belongs to a Ray head on port {', '.join(sorted(ports))}, not "
                           f"{s.ray_port}: set SQLRL_RAY_PORT or SQLRL_RAY_TEMP_DIR to the head you mean")
    configs = (yaml.safe_load(ray_yml.read_text()) or {}).get("scrape_configs") or []
    if not configs:
        raise MonitorError(f"{ray_yml} has no scrape_configs (an unexpected Ray version?)")
    return configs


def start(s: Settings) -> dict[str, Any]:
    s.dir.mkdir(parents=True, exist_ok=True)
    state = _state(s)
    if _prometheus_alive(state):
        print("monitor: already running (stop it with: bash scripts/monitor.sh stop)")
        print(addresses(s, state))
        return state
    prometheus = shutil.which(s.prometheus)
    if not prometheus:
        raise MonitorError(f"{s.prometheus!r} is not on PATH: run 'bash scripts/monitor.sh start' (it installs "
                           f"Debian's prometheus package) or set SQLRL_PROMETHEUS to a prometheus binary")
    if port_open(s.prom_port):
        raise MonitorError(f"127.0.0.1:{s.prom_port} is taken by another program: set SQLRL_PROM_PORT to a free port")
    earlier = state.get("ray_session") if state.get("ray_owned") else None
    if earlier and session_pids(int(earlier)):  # a head an earlier start made (its Prometheus died)
        owned, ray_sid, temp = True, int(earlier), Path(state["ray_temp_dir"])
    else:
        owned = not port_open(s.ray_port)
        temp = Path(s.ray_temp_dir or (s.dir / "ray" if owned else "/tmp/ray"))
        ray_sid = _start_head(s, temp) if owned else None
    state = {"ray_session": ray_sid, "ray_temp_dir": str(temp), "ray_owned": owned}
    s.state_file.write_text(json.dumps(state))
    try:
        return _start_prometheus(s, prometheus, temp, state)
    except BaseException:  # leave nothing behind: what was started so far is stopped again
        stop(s, quiet=True)
        raise


def _start_prometheus(s: Settings, prometheus: str, temp: Path, state: dict[str, Any]) -> dict[str, Any]:
    owned, ray_sid = bool(state["ray_owned"]), state["ray_session"]
    configs = _ray_scrape_configs(s, temp, owned, ray_sid)
    config = s.dir / "prometheus.yml"
    body = {"global": {"scrape_interval": f"{s.scrape_s}s", "evaluation_interval": f"{s.scrape_s}s"},
            "scrape_configs": configs}
    config.write_text("# Written by jobs/monitor.py: Ray's own scrape configs, sqlrl's scrape interval.\n"
                      + yaml.safe_dump(body, sort_keys=False))
    cmd = [prometheus, f"--config.file={config}", f"--storage.tsdb.path={s.dir / 'data'}",
           f"--web.listen-address=127.0.0.1:{s.prom_port}", f"--web.console.templates={CONSOLES}",
           f"--web.console.libraries={CONSOLE_LIBRARIES}", "--web.page-title=sqlrl Prometheus"]
    log = s.dir / "prometheus.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    state.update(prometheus_pid=proc.pid, config=str(config), prometheus_log=str(log))
    s.state_file.write_text(json.dumps(state))
    try:
        wait_until(f"Prometheus on {s.prom_url}", lambda: http_get(f"{s.prom_url}/-/ready")[0] == 200, 60,
                   lambda: proc.poll() is None)
    except MonitorError as exc:
        tail = log.read_text(errors="replace").strip().splitlines()[-2:]
        raise MonitorError(f"{exc} ({log}: {' / '.join(tail)})") from None
    print(addresses(s, state))
    print(dashboard_check(s))
    return state


def addresses(s: Settings, state: dict[str, Any]) -> str:
    head = "started by monitor.sh" if state.get("ray_owned") else "already running"
    return "\n".join([
        f"monitor: sqlrl console   {s.prom_url}/{CONSOLE_PAGE}",
        f"monitor: Prometheus      {s.prom_url}/targets   (scrapes Ray's service discovery every {s.scrape_s} s)",
        f"monitor: Ray dashboard   http://127.0.0.1:{s.dashboard_port}   (head on 127.0.0.1:{s.ray_port}, {head}; "
        f"submit jobs with RAY_ADDRESS=http://127.0.0.1:{s.dashboard_port})",
        f"monitor: files           {s.dir}   (stop with: bash scripts/monitor.sh stop)"])


def dashboard_check(s: Settings) -> str:
    status, body = http_get(f"http://127.0.0.1:{s.dashboard_port}/api/prometheus_health", _auth_headers())
    if status == 200:
        return "monitor: the Ray dashboard reaches this Prometheus (RAY_PROMETHEUS_HOST)"
    if status == 0:
        return f"monitor: no Ray dashboard answers on 127.0.0.1:{s.dashboard_port} (SQLRL_DASHBOARD_PORT)"
    return (f"monitor: the Ray dashboard does not reach this Prometheus ({status}): start the head with "
            f"RAY_PROMETHEUS_HOST={s.prom_url} in its environment")


# ------------------------------------------------------------------------------------ stop/status

def stop(s: Settings, quiet: bool = False) -> None:
    state = _state(s)
    if not state:
        print(f"monitor: nothing to stop ({s.state_file} does not exist)")
        return
    say = (lambda _: None) if quiet else print
    if _prometheus_alive(state):
        pid = int(state["prometheus_pid"])
        _signal(pid, signal.SIGTERM)
        try:
            wait_until("Prometheus to exit", lambda: str(state["config"]) not in _cmdline(pid), 30)
        except MonitorError:
            _signal(pid, signal.SIGKILL)
        say(f"monitor: Prometheus stopped (pid {pid})")
    if state.get("ray_owned") and state.get("ray_session"):
        n = stop_session(int(state["ray_session"]))
        say(f"monitor: the Ray head it started is stopped ({n} processes)")
    s.state_file.unlink(missing_ok=True)


def status(s: Settings) -> int:
    state = _state(s)
    if not _prometheus_alive(state):
        print("monitor: not running (start it with: bash scripts/monitor.sh start)")
        return 3
    print(addresses(s, state))
    code, body = http_get(f"{s.prom_url}/api/v1/targets")
    if code == 200:
        targets = json.loads(body)["data"]["activeTargets"]
        up = sum(t["health"] == "up" for t in targets)
        print(f"monitor: scrape targets up: {up} of {len(targets)}")
    print(dashboard_check(s))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m jobs.monitor", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("start", help="Prometheus (and a Ray head when none runs); prints the addresses")
    sub.add_parser("stop", help="stop what start started")
    sub.add_parser("status", help="addresses, scrape targets up, dashboard link")
    shot = sub.add_parser("screenshot", help="render the console page in headless Chromium to a PNG")
    shot.add_argument("--out", required=True, help="the PNG to write")
    shot.add_argument("--range", default="10m", help="time range of the graphs (e.g. 5m, 1h)")
    shot.add_argument("--size", default="1600x2300", help="window size WIDTHxHEIGHT in pixels")
    a = ap.parse_args(argv)
    try:
        s = Settings.from_env()
        if a.command == "start":
            start(s)
        elif a.command == "stop":
            stop(s)
        elif a.command == "status":
            return status(s)
        else:
            from jobs.monitor_page import screenshot

            report = screenshot(s, Path(a.out), a.range, a.size)
            print(report.describe())
            return 0 if report.rendered else 1
    except MonitorError as exc:
        print(f"monitor: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
