"""The README's main job runs end to end on the embedded default and all its checks pass."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_main_job_passes_every_check(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "jobs.foundation_demo", "--out", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert len(report["checks"]) == 6 and all(c["passed"] for c in report["checks"])
    assert report["pool_stats"]["leases"] == 1000 and report["pool_stats"]["in_use"] == 0
    assert "Error (runtime): no such table: order" in proc.stdout or "Error (syntax)" in proc.stdout
    assert not (tmp_path / "evil.db").exists()
