"""``FileGate``: a scripted engine's gate that a file opens -- a cross-process event for tests.

A test in another process than the engine (an e2e test against a serving replica) cannot reach
a gate object inside it; ``FileGate(gate, path)`` opens ``gate`` (a ``ScriptedEngine.hold`` gate)
while ``path`` exists and closes it again when the file is removed. It polls the file every 10 ms
on a daemon thread (the file system gives no portable event) until ``stop()``; the thread keeps it
alive, so the engine's factory need not hold it (``backends._scripted_engine``, option ``gate_file``).
"""

from __future__ import annotations

import os
import threading
from typing import Any

__all__ = ["FileGate"]


class FileGate:
    """Opens ``gate`` while ``path`` exists, closes it again when the file is removed (module doc)."""

    def __init__(self, gate: Any, path: str) -> None:
        self.gate, self.path = gate, path
        self._stop = threading.Event()
        threading.Thread(target=self._watch, name="sqlrl-file-gate", daemon=True).start()

    def _watch(self) -> None:
        while not self._stop.is_set():
            if os.path.exists(self.path):
                if not self.gate.opened.is_set():
                    self.gate.opened.set()
            elif self.gate.opened.is_set():
                self.gate.opened.clear()
            self._stop.wait(0.01)

    def stop(self) -> None:
        self._stop.set()
