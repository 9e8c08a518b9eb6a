"""sqlrl.metrics: JSONL survives every step, TensorBoard and PNG curves are written, sinks never kill a job."""

import math

from sqlrl.metrics import MetricsLogger, read_metrics


def test_jsonl_tensorboard_and_curves(tmp_path):
    seen = []
    log = MetricsLogger(tmp_path, "stage3", sinks=[lambda st, step, m: seen.append((st, step, m["reward"]))])
    for step in range(5):
        log.log(step, {"reward": step / 4, "loss": 1.0 - step / 10, "note": "x", "nan": math.nan})
    # each step is on disk before close (a crash loses nothing already logged)
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [0, 1, 2, 3, 4]
    written = log.close()
    assert (tmp_path / "curves" / "stage3.png") in written and written[0].stat().st_size > 1000
    assert list((tmp_path / "tensorboard" / "stage3").glob("events.out.tfevents.*"))
    assert seen[-1] == ("stage3", 4, 1.0)
    rows = read_metrics(tmp_path / "metrics.jsonl", stage="stage3")
    assert rows[2]["reward"] == 0.5 and rows[2]["note"] == "x"


def test_a_failing_sink_is_noted_once_and_logging_goes_on(tmp_path):
    def broken(stage, step, metrics):
        raise RuntimeError("dashboard down")
    with MetricsLogger(tmp_path, "s", sinks=[broken], tensorboard=False) as log:
        log.log(0, {"a": 1})
        log.log(1, {"a": 2})
        assert len(log.notes) == 1 and "dashboard down" in log.notes[0]
    assert len(read_metrics(tmp_path / "metrics.jsonl")) == 2


def test_two_stages_share_one_log(tmp_path):
    with MetricsLogger(tmp_path, "stage1", tensorboard=False) as a:
        a.log(0, {"loss": 2.0})
    with MetricsLogger(tmp_path, "stage2", tensorboard=False) as b:
        b.log(0, {"loss": 1.0})
    assert [r["stage"] for r in read_metrics(tmp_path / "metrics.jsonl")] == ["stage1", "stage2"]
    assert read_metrics(tmp_path / "metrics.jsonl", "stage2")[0]["loss"] == 1.0


def test_a_torn_last_line_is_skipped(tmp_path):
    with MetricsLogger(tmp_path, "stage3", tensorboard=False) as log:
        log.log(0, {"reward": 0.5})
    with open(tmp_path / "metrics.jsonl", "a", encoding="utf-8") as fh:
        fh.write('[1, 2]\n{"stage": "stage3", "step": 1, "rew')  # not an object; killed mid-write
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [0]
