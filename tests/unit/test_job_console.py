"""jobs.console: plain output off a terminal — heartbeat lines during long phases (a background
thread that stops with its ``with`` block), unwrapped lines, no third-party progress bars — and
path options checked all at once."""

from __future__ import annotations

import io
import os
import threading

import pytest

from jobs.console import (HEARTBEAT_ENV, Heartbeat, check_paths, heading, heartbeat_interval, make_console,
                          quiet_third_party_bars)

WAIT_S = 60  # an upper bound for waiting on an event, never a measured duration


class Recorder(io.StringIO):
    """A non-terminal stream that signals each line written."""

    def __init__(self, tty: bool = False) -> None:
        super().__init__()
        self.tty = tty
        self.lines: list[str] = []
        self.wrote = threading.Event()

    def isatty(self) -> bool:
        return self.tty

    def write(self, s: str) -> int:
        self.lines += [x for x in s.splitlines() if x]
        self.wrote.set()
        return super().write(s)


def test_a_heartbeat_line_names_the_phase_its_progress_and_the_elapsed_time():
    out = Recorder()
    beat = Heartbeat("eval (agentic) final", total=8, unit="tasks", interval_s=0.01, stream=out)
    beat.update(3, note="rollout batch 1/1")
    with beat:
        assert out.wrote.wait(WAIT_S), "no heartbeat line appeared"
    line = out.lines[-1]
    assert line.startswith("[heartbeat] eval (agentic) final: 3/8 tasks (rollout batch 1/1), ")
    assert line.endswith(" s elapsed")


def test_the_heartbeat_thread_stops_when_the_block_ends_even_on_an_error():
    out = Recorder()
    with pytest.raises(RuntimeError):
        with Heartbeat("stage4 GRPO", total=2, interval_s=0.01, stream=out) as beat:
            assert out.wrote.wait(WAIT_S)
            thread = beat._thread
            assert thread is not None and thread.is_alive()
            raise RuntimeError("the phase failed")
    assert not thread.is_alive() and not beat.running  # joined: it can print nothing more
    n = len(out.lines)
    beat.update(2)  # updating a finished heartbeat prints nothing
    assert len(out.lines) == n


def test_a_heartbeat_is_off_in_a_terminal_and_on_otherwise():
    tty = Recorder(tty=True)
    with Heartbeat("stage1 SFT", interval_s=0.01, stream=tty) as beat:
        assert not beat.enabled and beat._thread is None
    assert tty.lines == []
    with Heartbeat("stage1 SFT", interval_s=0.01, stream=Recorder()) as beat:
        assert beat.enabled and beat.running


def test_a_heartbeat_is_a_progress_callback():
    beat = Heartbeat("evaluate critic", unit="instances", interval_s=1, stream=Recorder())
    beat(5, 9)
    assert ": 5/9 instances, " in beat.line()
    assert Heartbeat("data", interval_s=1, stream=Recorder()).line().startswith("[heartbeat] data: running, ")


def test_the_interval_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv(HEARTBEAT_ENV, raising=False)
    assert heartbeat_interval() == 60.0
    monkeypatch.setenv(HEARTBEAT_ENV, "0.5")
    assert heartbeat_interval() == 0.5 and Heartbeat("x", stream=Recorder()).interval_s == 0.5
    for bad in ("soon", "0", "-1"):
        monkeypatch.setenv(HEARTBEAT_ENV, bad)
        with pytest.raises(SystemExit, match=HEARTBEAT_ENV):
            heartbeat_interval()


def test_off_a_terminal_lines_are_not_wrapped_and_headings_not_cut(capsys):
    console = make_console()  # stdout is captured: not a terminal
    long = "tasks: " + " ".join(f"word{i}" for i in range(60))
    console.print(long)
    heading(console, "sqlrl main job: " + "x" * 150)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == long
    assert out[1] == "== sqlrl main job: " + "x" * 150 + " =="


@pytest.fixture
def bars(monkeypatch):
    """transformers' progress-bar switch, restored (with the environment) after the test."""
    from transformers.utils import logging as hf_logging

    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "0")  # restored afterwards, whatever the test sets
    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS")
    was = hf_logging.is_progress_bar_enabled()
    hf_logging.enable_progress_bar()
    yield hf_logging
    (hf_logging.enable_progress_bar if was else hf_logging.disable_progress_bar)()


def test_third_party_progress_bars_are_switched_off_when_asked(bars):
    assert quiet_third_party_bars(False) is False and "HF_HUB_DISABLE_PROGRESS_BARS" not in os.environ
    assert bars.is_progress_bar_enabled()
    assert quiet_third_party_bars(True) is True
    assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"  # reaches child processes too
    assert not bars.is_progress_bar_enabled()


def test_quiet_is_the_default_when_stderr_is_not_a_terminal(bars, monkeypatch):
    monkeypatch.setattr("sys.stderr", Recorder(tty=True))
    assert quiet_third_party_bars() is False and bars.is_progress_bar_enabled()
    monkeypatch.setattr("sys.stderr", Recorder(tty=False))
    assert quiet_third_party_bars() is True and not bars.is_progress_bar_enabled()


def test_every_missing_path_is_named_with_its_option(tmp_path):
    (tmp_path / "gold.sql").write_text("")
    problems = check_paths([("--gold", str(tmp_path / "gold.sql"), "file"),
                            ("--pred", "/nonexistent/pred.sql", "file"),
                            ("--db", str(tmp_path / "gold.sql"), "dir"),
                            ("--tasks", str(tmp_path), "file"),
                            ("--questions", None, "file"),
                            ("--db-root", "postgresql://admin@host/db", "dir")],
                           allow=lambda opt, value: "://" in value)
    assert problems == ["--pred: /nonexistent/pred.sql does not exist",
                        f"--db: {tmp_path / 'gold.sql'} is not a folder",
                        f"--tasks: {tmp_path} is not a file"]
