"""scripts/monitor.sh and jobs/monitor*.py without Ray or Prometheus running: bad input gets a clear
error (a missing prometheus with no apt-get, a failing apt-get, a bad subcommand or setting, a taken
port, a head whose files are elsewhere), the console page's panels and the DOM report, stopping a
process session, and the metric table in docs/monitoring.md covering every metric the page graphs.
(The real thing, a Ray head, Prometheus, a job and Chromium, is tests/e2e/test_monitoring.py.)"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jobs.monitor import MonitorError, Settings, session_pids, stop_session
from jobs.monitor_page import _parse, page_url, panels, seconds

ROOT = Path(__file__).resolve().parents[2]


def sh(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "scripts/monitor.sh", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={**os.environ, **env})


def py(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "jobs.monitor", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={**os.environ, **env})


@pytest.mark.parametrize("args", [(), ("bogus",), ("screenshot",), ("install", "grafana")])
def test_bad_subcommand_is_a_usage_error(args):
    p = sh(*args)
    assert p.returncode == 2
    assert "usage:" in p.stderr or "unknown package 'grafana'" in p.stderr


def test_missing_prometheus_without_apt_says_what_to_do(tmp_path):
    p = sh("start", SQLRL_PROMETHEUS=str(tmp_path / "no-prometheus"), SQLRL_APT_GET=str(tmp_path / "no-apt-get"),
           SQLRL_MONITOR_DIR=str(tmp_path))
    assert p.returncode == 1
    assert f"{tmp_path / 'no-prometheus'} is not installed and {tmp_path / 'no-apt-get'} is not available" in p.stderr
    assert "install Debian's prometheus package, or set SQLRL_PROMETHEUS" in p.stderr
    assert not (tmp_path / "state.json").exists()  # nothing was started


def test_failing_apt_get_is_reported(tmp_path):
    fake = tmp_path / "apt-get"
    fake.write_text("#!/bin/sh\necho 'E: Unable to locate package' >&2\nexit 100\n")
    fake.chmod(0o755)
    p = sh("install", "chromium", SQLRL_CHROMIUM=str(tmp_path / "no-chromium"), SQLRL_APT_GET=str(fake))
    assert p.returncode == 1
    if os.geteuid() == 0:
        assert f"{fake} could not install chromium" in p.stderr and "E: Unable to locate package" in p.stderr
    else:
        assert "run 'apt-get install chromium' as root" in p.stderr


@pytest.mark.parametrize("var, value", [("SQLRL_PROM_PORT", "abc"), ("SQLRL_RAY_PORT", "70000"),
                                        ("SQLRL_PROM_SCRAPE_S", "0")])
def test_bad_setting_names_the_variable(var, value, tmp_path):
    p = py("start", **{var: value, "SQLRL_MONITOR_DIR": str(tmp_path)})
    assert p.returncode == 1 and f"{var}={value!r} must be an integer" in p.stderr


def test_stop_and_status_when_nothing_runs(tmp_path):
    p = py("stop", SQLRL_MONITOR_DIR=str(tmp_path))
    assert p.returncode == 0 and "nothing to stop" in p.stdout
    p = py("status", SQLRL_MONITOR_DIR=str(tmp_path))
    assert p.returncode == 3 and "not running" in p.stdout


def test_prometheus_not_on_path_from_python(tmp_path):
    p = py("start", SQLRL_MONITOR_DIR=str(tmp_path), SQLRL_PROMETHEUS=str(tmp_path / "missing"))
    assert p.returncode == 1 and "is not on PATH" in p.stderr and "SQLRL_PROMETHEUS" in p.stderr


@pytest.fixture
def listening():
    """A socket that accepts connections (stands in for a port someone else holds)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    yield s.getsockname()[1]
    s.close()


def test_taken_prometheus_port(tmp_path, listening):
    p = py("start", SQLRL_MONITOR_DIR=str(tmp_path), SQLRL_PROMETHEUS="/bin/true", SQLRL_PROM_PORT=str(listening))
    assert p.returncode == 1 and f"127.0.0.1:{listening} is taken" in p.stderr


def test_running_head_with_files_elsewhere(tmp_path, listening):
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    prom_port = free.getsockname()[1]
    free.close()
    p = py("start", SQLRL_MONITOR_DIR=str(tmp_path / "m"), SQLRL_PROMETHEUS="/bin/true",
           SQLRL_PROM_PORT=str(prom_port), SQLRL_RAY_PORT=str(listening), SQLRL_RAY_TEMP_DIR=str(tmp_path / "ray"))
    assert p.returncode == 1
    assert f"a Ray head answers on 127.0.0.1:{listening}" in p.stderr and "set SQLRL_RAY_TEMP_DIR" in p.stderr
    assert py("stop", SQLRL_MONITOR_DIR=str(tmp_path / "m")).returncode == 0  # nothing of its own to end


def test_stop_session_ends_every_process_of_the_session():
    # a session leader with a child and a grandchild, as `ray start` leaves its daemons
    leader = subprocess.Popen(["bash", "-c", "sleep 300 & (sleep 300 & wait) & wait"], start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while len(session_pids(leader.pid)) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(session_pids(leader.pid)) >= 4
        assert stop_session(leader.pid, grace_s=3) >= 4
        assert session_pids(leader.pid) == []
    finally:
        leader.kill()
        leader.wait()


def test_console_panels_cover_every_group_of_the_issue():
    found = panels()
    groups = {p.group for p in found}
    assert groups == {"reward", "pass_rate", "turns", "tools", "malformed", "length", "learner", "phases", "db",
                      "serving"}
    assert all(p.title and p.exprs and all(e.strip() for e in p.exprs) for p in found)
    text = " ".join(e for p in found for e in p.exprs)
    for needed in ("reward_mean", "pass_rate", "turns_mean", "tool_calls_mean", "tool_errors_mean",
                   "malformed_mean", "response_tokens_mean", "train_loss", "ppo_kl", "pg_clipfrac", "grad_norm",
                   "rollout|tool|reward|update|sync", "db_leases_total", "db_lease_wait_ms_bucket",
                   "db_errors_total", "serve_deployment_processing_latency_ms_bucket"):
        assert needed in text, needed


def test_docs_table_lists_every_metric_the_page_graphs():
    doc = (ROOT / "docs" / "monitoring.md").read_text()
    table = "\n".join(line for line in doc.splitlines() if line.startswith("|"))
    page = " ".join(e for p in panels() for e in p.exprs)
    names = set(re.findall(r"\bray_[a-z_]+[a-z]", page)) - {"ray_sqlrl_train_reward_", "ray_sqlrl_train_reward_mean"}
    names = {re.sub(r"_(bucket|count|sum)$", "", n) for n in names}
    names |= {f"ray_sqlrl_train_time_{p}_s" for p in ("rollout", "tool", "reward", "update", "sync")}
    missing = sorted(n for n in names if n not in table and n.replace("ray_", "", 1) not in table)
    assert not missing, f"docs/monitoring.md's metric table lacks {missing}"


def test_dom_report_states():
    dom = """
    <div class="sqlrl-panel" data-group="a"><h5>One</h5><code class="sqlrl-q">up</code>
      <div class="sqlrl-graph"><table><tr><td><svg></svg></td></tr></table></div></div>
    <div class="sqlrl-panel" data-group="a"><h5>Two</h5><code class="sqlrl-q">x &gt; 0</code>
      <div class="sqlrl-graph"><div class="prom_graph_error">No timeseries returned</div></div></div>
    <div class="sqlrl-panel" data-group="b"><h5>Three</h5><code class="sqlrl-q">y</code>
      <div class="sqlrl-graph"><div class="prom_graph_error">Error loading data</div></div></div>
    <div class="sqlrl-panel" data-group="c"><h5>Four</h5><code class="sqlrl-q">z</code>
      <div class="sqlrl-graph"><img class="prom_graph_loading"></div></div>"""
    found = _parse(dom)
    assert [(p.group, p.title, p.state) for p in found] == [
        ("a", "One", "chart"), ("a", "Two", "empty"), ("b", "Three", "error"), ("c", "Four", "loading")]
    assert found[1].exprs == ("x > 0",)


def test_range_and_url():
    assert seconds("90s") == 90 and seconds("10m") == 600 and seconds("2h") == 7200
    for bad in ("10", "0m", "ten minutes", "5x"):
        with pytest.raises(MonitorError, match="give a duration"):
            seconds(bad)
    url = page_url(Settings.from_env({"SQLRL_PROM_PORT": "9999"}), "5m")
    assert url.startswith("http://127.0.0.1:9999/consoles/sqlrl.html#pctc") and "300" in url


def test_screenshot_bad_size(tmp_path):
    p = py("screenshot", "--out", str(tmp_path / "x.png"), "--size", "big", SQLRL_MONITOR_DIR=str(tmp_path))
    assert p.returncode == 1 and "give WIDTHxHEIGHT" in p.stderr
