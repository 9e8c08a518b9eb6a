"""A job stopped with SIGTERM ends as one stopped with Ctrl-C does: cleanly.

``kill <pid>``, ``ray job stop`` and a scheduler's preemption send SIGTERM, whose default action
ends the Python process at once: no ``finally`` block or context manager runs, so processes the
job started outlive it. Seen here: a long-preset job killed that way left its vLLM engine core
(``VLLM::EngineCore``, re-parented to init) running at full CPU until it was SIGKILLed by hand; DB
sessions, local Ray actors and agent client processes are closed the same way (by ``finally``).

``exit_on_sigterm()`` (called first by every job entry point: ``jobs.main``, the stage jobs,
``jobs.train_agent``, ``jobs.evaluate``, ``jobs.infer``) guarantees:
- the first SIGTERM raises ``SystemExit(143)`` (128 + 15, the status a shell reports for a
  SIGTERM'd process) in the main thread, so the job unwinds through its ``finally`` blocks (engines
  closed, sessions released, child processes stopped) and exits 143;
- a second SIGTERM while it unwinds ends the process at once (the default action is restored
  before the first raises), so a stuck clean-up can always be cut short;
- it installs nothing off the main thread (Python delivers signals there only), nor over a
  handler someone else set (a host process keeps its own), and returns whether it installed.
Checkpoints are untouched: a stage resumes from its last saved step whichever signal stopped it
(tests/e2e/test_stage_resume.py kills with SIGKILL; tests/unit/test_job_stop.py with SIGTERM).
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

__all__ = ["SIGTERM_STATUS", "exit_on_sigterm"]

SIGTERM_STATUS = 128 + signal.SIGTERM


def _unwind(signum: int, frame: FrameType | None) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the process at once
    raise SystemExit(SIGTERM_STATUS)


def exit_on_sigterm() -> bool:
    """Make SIGTERM unwind this job (module docstring); returns whether the handler was installed."""
    if threading.current_thread() is not threading.main_thread():
        return False
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return False
    signal.signal(signal.SIGTERM, _unwind)
    return True
