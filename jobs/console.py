"""Console output of the jobs: rich displays in a terminal, plain lines everywhere else.

When stdout/stderr is not a terminal (CI logs, ``ray job submit`` logs, ``| cat``) the jobs

- print plain, unwrapped lines (``make_console``: rich without colour and with ``soft_wrap``, so a
  long line is never cut at 80 columns; ``heading`` instead of a rule that truncates its title);
- switch off the transformers / huggingface_hub tqdm bars ("Loading weights", "Writing model
  shards"), which come out as ``\\r``-joined lines (``quiet_third_party_bars``);
- keep a long phase visible with a ``Heartbeat``: a background thread printing
  ``[heartbeat] <phase>: <done>/<total> <unit> (<note>), <elapsed> s elapsed`` every
  ``interval_s`` (default 60 s, ``SQLRL_HEARTBEAT_S`` in the environment); it stops, and its thread
  is joined, when its ``with`` block ends (also on an exception).

In a terminal nothing changes: rich progress displays and tables as before, no heartbeat.
``check_paths`` checks a command's path options before any work starts and names every missing
one at once (``--gold: /x does not exist``).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable, TextIO

from rich.console import Console

HEARTBEAT_ENV = "SQLRL_HEARTBEAT_S"
DEFAULT_HEARTBEAT_S = 60.0


def is_tty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # closed, detached or a plain object
        return False


def make_console(*, stderr: bool = False) -> Console:
    """A rich console on stdout/stderr: as usual in a terminal; otherwise plain (no colour, no
    wrapping at 80 columns)."""
    stream = sys.stderr if stderr else sys.stdout
    tty = is_tty(stream)
    return Console(stderr=stderr, soft_wrap=not tty, highlight=tty)


def heading(console: Console, text: str) -> None:
    """A section title: a rich rule in a terminal, ``== text ==`` (never truncated) otherwise."""
    if console.is_terminal:
        console.rule(text)
    else:
        console.print(f"== {text} ==", markup=False, highlight=False)


def quiet_third_party_bars(quiet: bool | None = None) -> bool:
    """Switch off transformers' and huggingface_hub's progress bars when stderr is not a terminal
    (``quiet=None``) or when asked; returns whether they are off. The environment variable also
    reaches child processes (local Ray workers)."""
    if quiet is None:
        quiet = not is_tty(sys.stderr)
    if not quiet:
        return False
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    if "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    return True


def heartbeat_interval() -> float:
    """Seconds between heartbeat lines: ``SQLRL_HEARTBEAT_S`` or 60."""
    raw = os.environ.get(HEARTBEAT_ENV)
    if not raw:
        return DEFAULT_HEARTBEAT_S
    try:
        value = float(raw)
    except ValueError:
        raise SystemExit(f"{HEARTBEAT_ENV}={raw!r} is not a number of seconds") from None
    if not value > 0:
        raise SystemExit(f"{HEARTBEAT_ENV}={raw!r} must be > 0")
    return value


class Heartbeat:
    """A plain progress line every ``interval_s`` while a long phase runs (a context manager).

    ``update(done, note=...)`` records progress (thread-safe, cheap: it prints nothing);
    the background thread prints the latest state. ``enabled=None``: on when ``stream`` (default
    stderr) is not a terminal. ``__call__(done, total)`` makes it a ``(done, total)`` progress
    callback.
    """

    def __init__(self, phase: str, *, total: int | None = None, unit: str = "", note: str = "",
                 interval_s: float | None = None, stream: TextIO | None = None,
                 enabled: bool | None = None) -> None:
        self.phase, self.total, self.unit, self.note = phase, total, unit, note
        self.interval_s = heartbeat_interval() if interval_s is None else float(interval_s)
        if not self.interval_s > 0:
            raise ValueError("interval_s must be > 0")
        self._stream = stream
        self.enabled = (not is_tty(self.stream)) if enabled is None else enabled
        self.done: int | None = None
        self.beats = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = time.monotonic()

    @property
    def stream(self) -> TextIO:
        return self._stream if self._stream is not None else sys.stderr

    def update(self, done: int | None = None, *, total: int | None = None, note: str | None = None) -> None:
        with self._lock:
            if done is not None:
                self.done = done
            if total is not None:
                self.total = total
            if note is not None:
                self.note = note

    def __call__(self, done: int, total: int) -> None:
        self.update(done, total=total)

    def line(self) -> str:
        with self._lock:
            done, total, note = self.done, self.total, self.note
        parts = []
        if total is not None:
            parts.append(f"{done or 0}/{total}{' ' + self.unit if self.unit else ''}")
        elif done is not None:
            parts.append(f"{done}{' ' + self.unit if self.unit else ''}")
        if note:
            parts.append(f"({note})" if parts else note)
        progress = " ".join(parts) or "running"
        return f"[heartbeat] {self.phase}: {progress}, {time.monotonic() - self._t0:.0f} s elapsed"

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.stream.write(self.line() + "\n")
                self.stream.flush()
                self.beats += 1
            except (OSError, ValueError):  # the stream went away: stop quietly
                return

    def __enter__(self) -> "Heartbeat":
        self._t0 = time.monotonic()
        if self.enabled:
            self._thread = threading.Thread(target=self._run, name=f"heartbeat: {self.phase}", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()


def check_paths(options: Iterable[tuple[str, str | None, str]], *,
                allow: Callable[[str, str], bool] | None = None) -> list[str]:
    """Problems with path options, all at once: ``(option, value, kind)`` with kind ``file``,
    ``dir`` or ``any``; a ``None`` value (an option not given) is skipped, as is one for which
    ``allow(option, value)`` is true (e.g. a URL where a folder may also be given)."""
    problems = []
    for option, value, kind in options:
        if value is None or (allow is not None and allow(option, value)):
            continue
        p = Path(value).expanduser()
        if not p.exists():
            problems.append(f"{option}: {value} does not exist")
        elif kind == "file" and not p.is_file():
            problems.append(f"{option}: {value} is not a file")
        elif kind == "dir" and not p.is_dir():
            problems.append(f"{option}: {value} is not a folder")
    return problems
