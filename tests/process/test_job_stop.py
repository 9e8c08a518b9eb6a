"""A job stopped with SIGTERM unwinds (jobs/stop.py): its ``finally`` blocks run, so the processes
it started end with it, and it exits 143; a second SIGTERM cuts a stuck clean-up short; the handler
is not put over someone else's, nor off the main thread; every job entry point installs it."""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from jobs.stop import SIGTERM_STATUS, exit_on_sigterm

ROOT = Path(__file__).resolve().parents[2]

# a job's shape: start a child process, hold it in try/finally, say when it is running
JOB = """
import subprocess, sys, threading, pathlib
from jobs.stop import exit_on_sigterm
out = pathlib.Path(sys.argv[1])
exit_on_sigterm()
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
try:
    (out / "child").write_text(str(child.pid))
    (out / "ready").write_text("")
    threading.Event().wait()
finally:
    (out / "unwinding").write_text("")
    if sys.argv[2] == "stuck":
        threading.Event().wait()  # a clean-up that never ends
    child.kill()
    child.wait()
    (out / "cleaned").write_text("")
"""


def _wait_for(path: Path, proc: subprocess.Popen, limit_s: float = 120.0) -> None:
    """Until ``path`` exists (the job says so); fails if the job ends first or never gets there."""
    end = time.monotonic() + limit_s  # a hang limit, not a timing assertion
    while not path.exists():
        assert proc.poll() is None, f"the job ended ({proc.returncode}) before writing {path.name}"
        assert time.monotonic() < end, f"the job never wrote {path.name}"
        time.sleep(0.05)


def _start(tmp_path: Path, mode: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", JOB, str(tmp_path), mode], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is gone for our purpose
        return f.read().split(")")[-1].split()[0] != "Z"


def test_sigterm_unwinds_the_job_so_its_child_processes_end_with_it(tmp_path):
    proc = _start(tmp_path, "clean")
    try:
        _wait_for(tmp_path / "ready", proc)
        child = int((tmp_path / "child").read_text())
        assert _alive(child)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == SIGTERM_STATUS == 143
        assert (tmp_path / "cleaned").exists()  # the finally block ran to its end
        assert not _alive(child)
    finally:
        proc.kill()


def test_a_second_sigterm_ends_a_stuck_clean_up_at_once(tmp_path):
    proc = _start(tmp_path, "stuck")
    child = None
    try:
        _wait_for(tmp_path / "ready", proc)
        child = int((tmp_path / "child").read_text())
        proc.send_signal(signal.SIGTERM)
        _wait_for(tmp_path / "unwinding", proc)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == -signal.SIGTERM  # the default action, not another unwind
        assert not (tmp_path / "cleaned").exists()
    finally:
        proc.kill()
        if child is not None and _alive(child):
            os.kill(child, signal.SIGKILL)


def test_it_keeps_a_handler_someone_set_and_installs_nothing_off_the_main_thread():
    before = signal.getsignal(signal.SIGTERM)

    def mine(signum, frame):  # pragma: no cover - never delivered
        pass

    try:
        signal.signal(signal.SIGTERM, mine)
        assert exit_on_sigterm() is False and signal.getsignal(signal.SIGTERM) is mine
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        got = []
        t = threading.Thread(target=lambda: got.append(exit_on_sigterm()))
        t.start()
        t.join()
        assert got == [False] and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        assert exit_on_sigterm() is True and signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    finally:
        signal.signal(signal.SIGTERM, before)


# entry points left with the default action, and why
NOT_JOBS = {
    "serve.py": "Ray Serve's own process handles its signals (serve.run / serve shutdown)",
    "monitor.py": "ends Ray sessions itself; holds nothing to unwind",
    "report.py": "reads files and draws; holds no process or session",
}


def test_every_job_entry_point_unwinds_on_sigterm():
    for path in sorted((ROOT / "jobs").glob("*.py")):
        tree = ast.parse(path.read_text())
        mains = [n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)]
        if not mains or path.name in NOT_JOBS:
            continue
        first = mains[0].body
        calls = [ast.unparse(s.value) for s in first if isinstance(s, ast.Expr) and isinstance(s.value, ast.Call)]
        assert calls and calls[0] == "exit_on_sigterm()", \
            f"jobs/{path.name}: its __main__ block must call jobs.stop.exit_on_sigterm() before the job starts"


@pytest.mark.parametrize("name", sorted(NOT_JOBS))
def test_the_exceptions_are_entry_points_that_exist(name):
    assert (ROOT / "jobs" / name).is_file()


# bench scripts that start a vLLM engine core, a stage or agent processes: killed with SIGTERM they
# must unwind too (seen: a SIGTERM'd bench/suite_training.py left VLLM::EngineCore under init)
BENCH_WITH_PROCESSES = ("gateway_learn.py", "rollout.py", "rollout_engines.py", "serve_peer.py",
                        "suite_training.py")


@pytest.mark.parametrize("name", BENCH_WITH_PROCESSES)
def test_bench_scripts_that_start_processes_unwind_on_sigterm(name):
    tree = ast.parse((ROOT / "bench" / name).read_text())
    mains = [n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)]
    assert mains, f"bench/{name} has no __main__ block"
    calls = [ast.unparse(s.value) for s in mains[0].body if isinstance(s, ast.Expr) and isinstance(s.value, ast.Call)]
    assert calls and calls[0] == "exit_on_sigterm()", \
        f"bench/{name}: its __main__ block must call jobs.stop.exit_on_sigterm() before it starts anything"
