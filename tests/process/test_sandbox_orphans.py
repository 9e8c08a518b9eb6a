"""A process running dataset test-case code in the sandbox dies with its owner: killing the owner
(as Ray does to a hung reward actor) never leaves the test-case code running as an orphan."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in state  # a zombie has already died


@pytest.mark.slow  # a subprocess tree killed and waited on
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal is Linux-only")
def test_test_case_code_dies_with_its_owner(demo_db_path, tmp_path) -> None:
    pid_file = tmp_path / "child.pid"
    owner = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        from sqlrl.eval.critic import run_critic
        from sqlrl.tasks.types import CriticTask
        code = (
            "def test_case(pred_sqls, sol_sqls, db_path, conn, conditions):\\n"
            "    import os\\n"
            "    open({str(pid_file)!r}, 'w').write(str(os.getpid()))\\n"
            "    while True:\\n"
            "        pass\\n")
        task = CriticTask(instance_id="loop", db_id="shop", query="q", issue_sql=["SELECT 1"],
                          sol_sql=["SELECT 1"], test_cases=[code])
        run_critic(task, ["SELECT 1"], "sqlite:///{demo_db_path}", test_timeout_s=300)
    """)
    proc = subprocess.Popen([sys.executable, "-c", owner])
    try:
        deadline = time.monotonic() + 60
        while not pid_file.exists() or not pid_file.read_text():
            assert time.monotonic() < deadline, "the test case never started"
            assert proc.poll() is None, "the owner exited early"
            time.sleep(0.1)
        child = int(pid_file.read_text())
        assert alive(child)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 60  # a bound on the event, only to stop a hang
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(child), "the test-case child outlived its owner"
    finally:
        if proc.poll() is None:
            proc.kill()
