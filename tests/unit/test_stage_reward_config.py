"""The stage config's ``reward`` section reaches the job's reward scorers (``jobs.runtime.Runtime``):
``reward.test_suite`` switches test-suite execution match on for a stage (issue 47's wiring), half
set it is a clear error when the config is read, and off (the default) the scores are plain EX."""

from __future__ import annotations

from types import SimpleNamespace as NS

import pytest

from curriculum.config import load_stage_config
from tests.unit.test_test_suite import GOLD, NEAR_MISS, db, single, task, url  # noqa: F401 (fixture)


def _score(cfg, db_path):
    from jobs.runtime import Runtime

    with Runtime(cfg, NS(catalog={"co": {"sqlite": url(db_path)}}, schemas={})) as rt:
        done = NS(stop_reason="single_turn", response=lambda: single(NEAR_MISS))
        right = NS(stop_reason="single_turn", response=lambda: single(GOLD))
        return rt.score([done, right], [task(), task()], "spider_ex_single")


def test_reward_test_suite_in_a_stage_config_reaches_the_scorers(db, tmp_path):
    suites = tmp_path / "run" / "test_suite"
    cfg = load_stage_config("jobs/configs/stage3.yaml", ["reward.test_suite=true", f"reward.test_suite_dir={suites}",
                                                         f"run_dir={tmp_path / 'run'}"])
    assert cfg.reward.test_suite and cfg.reward_name == "hybrid_single"
    lucky, right = _score(cfg, db)
    assert lucky.parts["lucky_match"] == 1.0 and lucky.score == 0.0  # EX alone would have said 1
    assert right.parts["lucky_match"] == 0.0 and right.score == 1.0
    assert list((suites / "suites").glob("*.json"))  # built and cached where the config said


def test_without_the_section_the_stage_scores_plain_execution_match(db, tmp_path):
    cfg = load_stage_config("jobs/configs/stage3.yaml", [f"run_dir={tmp_path / 'run'}"])
    assert not cfg.reward.test_suite
    lucky, right = _score(cfg, db)
    assert lucky.score == right.score == 1.0 and "lucky_match" not in lucky.parts


@pytest.mark.parametrize("overrides,message", [(["reward.test_suite=true"], "test_suite_dir"),
                                               (["reward.test_suites=true"], "test_suites"),
                                               (["reward.test_suite=yes please"], "reward.test_suite")])
def test_a_half_set_or_misspelt_reward_section_is_a_clear_error(overrides, message):
    with pytest.raises(ValueError, match=message):
        load_stage_config("jobs/configs/stage3.yaml", overrides)


def test_a_stage_prebuilds_its_suites_once_and_the_scorers_read_them_back(db, tmp_path):
    """``Runtime.prebuild_suites`` (the stage's pre-step) distils each distinct gold's suite into
    the run dir once; a second prebuild and the scorers read them back instead of distilling."""
    from jobs.runtime import Runtime
    from sqlrl.rewards import Judge
    from sqlrl.suites.test_suite import TestSuites
    from sqlrl.tasks.types import CriticTask

    suites = tmp_path / "run" / "test_suite"
    cfg = load_stage_config("jobs/configs/stage3.yaml", ["reward.test_suite=true", f"reward.test_suite_dir={suites}",
                                                         f"run_dir={tmp_path / 'run'}"])
    critic = CriticTask(instance_id="c", db_id="co", query="fix", issue_sql=["SELECT 1"], sol_sql=["SELECT 1"])
    tasks = [task(), task(), task("SELECT nope FROM emp"), critic]
    with Runtime(cfg, NS(catalog={"co": {"sqlite": url(db)}}, schemas={})) as rt:
        first = rt.prebuild_suites(tasks)
        again = rt.prebuild_suites(tasks)
    assert (first.tasks, first.golds, first.distilled, first.skipped) == (3, 2, 1, 1)
    assert first.variants >= 1  # the near miss needs a variant to be caught
    assert len(first.failed) == 1 and "gold query fails" in first.failed[0][1]  # reported, not raised
    assert again.distilled == 0 and again.golds == 2  # read back from the run dir
    assert "2 test suites for 3 text-to-SQL tasks" in first.summary()
    fresh = Judge({"co": {"sqlite": url(db)}}, suites=TestSuites(suites))  # a reward actor's judge
    assert not fresh.text2sql(task(), NEAR_MISS).spider_suite
    assert fresh.suites.distilled == 0
    off = load_stage_config("jobs/configs/stage3.yaml", [f"run_dir={tmp_path / 'run2'}"])
    with Runtime(off, NS(catalog={"co": {"sqlite": url(db)}}, schemas={})) as rt:
        assert rt.prebuild_suites(tasks) is None  # option off: nothing built


def test_prebuild_needs_a_judge_with_suites(db):
    from sqlrl.rewards import Judge
    from sqlrl.rewards.prebuild import prebuild_suites

    with pytest.raises(ValueError, match="test suites"):
        prebuild_suites(Judge({"co": {"sqlite": url(db)}}), [task()])
