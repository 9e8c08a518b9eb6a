"""Debugging tasks generated from Spider dev gold SQL on the real Spider databases (skips when
../shared/data/spider is absent). Four databases, ~90 source tasks: a few seconds on 2 cores."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from sqlrl.eval.critic import run_critic
from sqlrl.tasks.loaders.spider import load_spider
from sqlrl.synth.critic_gen import spider_critic_tasks

pytestmark = pytest.mark.spider
DBS = ("concert_singer", "pets_1", "flight_2", "dog_kennels")


@pytest.mark.slow
def test_spider_dev_critic_tasks_are_verified(spider_dir: Path) -> None:
    tasks, report = spider_critic_tasks(spider_dir, "dev", seed=0, per_task=2, db_ids=DBS)
    catalog = load_spider(spider_dir, "dev").catalog
    usable = report.tasks - report.rejected["sol_fails"]
    assert report.tasks >= 80 and usable > 0
    # (nearly) every source task whose gold passes its own test case yields two instances
    assert report.kept >= 1.8 * usable, report.summary()
    assert report.rejected["error"] == 0, report.messages
    categories = Counter(t.meta["bug_category"] for t in tasks)
    assert len(categories) >= 8, categories
    for t in tasks:
        url = catalog[t.db_id]["sqlite"]
        assert t.db_id in DBS and t.source == "spider-dev/critic"
        assert run_critic(t, t.sol_sql, url, timeout_s=5.0).solved, t.instance_id
        assert not run_critic(t, t.issue_sql, url, timeout_s=5.0).solved, t.instance_id
