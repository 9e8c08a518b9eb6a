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
