"""jobs.infer checks its path options before loading anything and names every missing one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from jobs.infer import main as infer


def test_every_missing_path_option_is_named(tmp_path, capsys) -> None:
    (tmp_path / "tasks.jsonl").write_text("")
    assert infer(["--model", str(tmp_path / "ckpt"), "--tasks", str(tmp_path / "tasks.jsonl"),
                  "--db-root", str(tmp_path / "dbs"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"infer: --model: {tmp_path / 'ckpt'} does not exist (and not a named model: smollm2-135m, tiny)" in err
    assert f"infer: --db-root: {tmp_path / 'dbs'} does not exist" in err
    assert "--tasks:" not in err and not (tmp_path / "out").exists()
    assert infer(["--spider", str(tmp_path / "tasks.jsonl"), "--tasks", "/nonexistent.jsonl"]) == 2
    err = capsys.readouterr().err
    assert "infer: --tasks: /nonexistent.jsonl does not exist" in err
    assert f"infer: --spider: {tmp_path / 'tasks.jsonl'} is not a folder" in err
    assert "--model" not in err  # tiny, a named model


def test_a_missing_path_exits_non_zero_without_a_traceback(tmp_path) -> None:
    proc = subprocess.run([sys.executable, "-m", "jobs.infer", "--tasks", "/nonexistent.jsonl",
                           "--db-root", "/nonexistent-dbs"], cwd=Path(__file__).resolve().parents[2],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.splitlines() == ["infer: --tasks: /nonexistent.jsonl does not exist",
                                        "infer: --db-root: /nonexistent-dbs does not exist"]
