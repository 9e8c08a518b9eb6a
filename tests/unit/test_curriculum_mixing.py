"""Zeno / Talon task mixing: exact counts, sampling without replacement while possible, balanced
repetition when a pool is too small, seeding, and clear errors for bad weights."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from curriculum.mixing import (TALON, ZENO, MixtureConfig, MixtureError, allocate, mix,
                               mix_with_report, mixtures_from_config, pools_by_kind)
from sqlrl.tasks.types import CriticTask, Text2SQLTask


def t2s(i: int) -> Text2SQLTask:
    return Text2SQLTask(task_id=f"t{i}", db_id="shop", question=f"Q{i}?", gold_sql="SELECT 1")


def crit(i: int) -> CriticTask:
    return CriticTask(instance_id=f"c{i}", db_id="shop", query=f"Fix {i}.", issue_sql=["SELEC 1"],
                      sol_sql=["SELECT 1"])


POOLS = {"text2sql": [t2s(i) for i in range(50)], "critic": [crit(i) for i in range(30)]}


def test_largest_remainder_gives_exact_counts():
    assert allocate({"a": 1, "b": 1, "c": 1}, 10) == {"a": 4, "b": 3, "c": 3}
    assert allocate({"a": 0.5, "b": 0.5}, 7) == {"a": 4, "b": 3}
    assert allocate({"a": 0.15, "b": 0.85}, 10) == {"a": 2, "b": 8}  # remainders .5 vs .5: first wins
    assert allocate({"a": 0.14, "b": 0.86}, 10) == {"a": 1, "b": 9}
    assert allocate({"a": 2, "b": 0}, 5) == {"a": 5, "b": 0}
    rng = random.Random(0)
    for _ in range(300):
        w = {f"p{k}": rng.random() * rng.choice([1, 10, 1000]) for k in range(rng.randint(1, 6))}
        size = rng.randint(0, 500)
        counts = allocate(w, size)
        assert sum(counts.values()) == size
        total = sum(w.values())
        assert all(abs(counts[k] - size * v / total) < 1 for k, v in w.items())


def test_zeno_mix_samples_without_replacement_when_pools_are_big_enough():
    tasks, report = mix_with_report(POOLS, MixtureConfig(ZENO, size=40, seed=1))
    kinds = Counter(t.kind for t in tasks)
    assert kinds == {"critic": 20, "text2sql": 20} and report.counts == {"critic": 20, "text2sql": 20}
    assert len({t.task_id for t in tasks}) == 40 and report.repeated == ()
    assert {t.kind for t in tasks[:10]} == {"critic", "text2sql"}  # interleaved, not in blocks


def test_a_small_pool_is_repeated_evenly():
    tasks, report = mix_with_report(POOLS, MixtureConfig({"critic": 0.8, "text2sql": 0.2}, size=100, seed=3))
    crit_ids = Counter(t.task_id for t in tasks if t.kind == "critic")
    assert sum(crit_ids.values()) == 80 and set(crit_ids) == {f"c{i}" for i in range(30)}
    assert set(crit_ids.values()) == {2, 3}  # 80 of 30: every task 2 or 3 times
    assert report.repeated == ("critic",) and report.available == {"critic": 30, "text2sql": 50}
    assert len({t.task_id for t in tasks if t.kind == "text2sql"}) == 20


def test_talon_is_debugging_only():
    tasks = mix(POOLS, MixtureConfig(TALON, size=25, seed=0))
    assert len(tasks) == 25 and {t.kind for t in tasks} == {"critic"}


def test_mixing_is_seeded():
    a = mix(POOLS, MixtureConfig(ZENO, size=30, seed=7))
    assert a == mix(POOLS, MixtureConfig(ZENO, size=30, seed=7))
    assert a != mix(POOLS, MixtureConfig(ZENO, size=30, seed=8))
    swapped = {"critic": POOLS["critic"], "text2sql": POOLS["text2sql"]}
    assert a == mix(swapped, MixtureConfig(ZENO, size=30, seed=7))  # pool order does not matter
    reordered = dict(reversed(list(ZENO.items())))  # nor the key order of the weights (a YAML dump sorts them)
    assert list(reordered) != list(ZENO) and a == mix(POOLS, MixtureConfig(reordered, size=30, seed=7))
    assert allocate({"b": 0.5, "a": 0.5}, 7) == {"a": 4, "b": 3}  # a tie goes to the first name, in any order
    assert mix(POOLS, MixtureConfig(ZENO, size=0)) == []


def test_unweighted_pools_are_not_used_and_pools_by_kind_splits():
    pools = pools_by_kind(POOLS["critic"][:3] + POOLS["text2sql"][:4] + POOLS["critic"][3:5])
    assert {k: len(v) for k, v in pools.items()} == {"critic": 5, "text2sql": 4}
    assert pools["critic"] == POOLS["critic"][:5]
    assert {t.kind for t in mix(pools, MixtureConfig({"text2sql": 1.0}, size=6))} == {"text2sql"}


@pytest.mark.parametrize("weights, size, match", [
    ({"critic": -0.5, "text2sql": 1.0}, 10, "weight of pool 'critic' is negative"),
    ({"critic": 0, "text2sql": 0.0}, 10, "all weights are zero"),
    ({}, 10, "non-empty mapping"),
    ({"critic": float("nan")}, 10, "finite number"),
    ({"critic": True}, 10, "finite number"),
    ({"critic": "0.5"}, 10, "finite number"),
    ({"critic": 1.0}, -1, "size must be a non-negative integer"),
    ({"critic": 1.0}, 2.5, "size must be a non-negative integer"),
])
def test_bad_weights_and_sizes_are_clear_errors(weights, size, match):
    with pytest.raises(MixtureError, match=match):
        MixtureConfig(weights, size)
    with pytest.raises(MixtureError, match=match):
        allocate(weights, size)


def test_unknown_or_empty_pools_are_errors():
    with pytest.raises(MixtureError, match=r"unknown pool\(s\) \['spider'\]"):
        mix(POOLS, MixtureConfig({"critic": 0.5, "spider": 0.5}, size=10))
    with pytest.raises(MixtureError, match=r"pool\(s\) \['critic'\] are empty"):
        mix({"critic": [], "text2sql": POOLS["text2sql"]}, MixtureConfig(ZENO, size=10))
    assert len(mix({"critic": [], "text2sql": POOLS["text2sql"]},
                   MixtureConfig({"critic": 0.0, "text2sql": 1.0}, size=10))) == 10


def test_per_stage_mixtures_from_config():
    cfg = mixtures_from_config({"stage3": {"weights": ZENO, "size": 100, "seed": 2},
                                "stage4": {"weights": TALON, "size": 50}})
    assert cfg["stage3"] == MixtureConfig(ZENO, 100, 2) and cfg["stage4"].to_dict() == {
        "weights": {"critic": 1.0}, "size": 50, "seed": 0}
    with pytest.raises(MixtureError, match="mixture 'stage3': unknown key"):
        mixtures_from_config({"stage3": {"weights": ZENO, "size": 1, "sizes": 2}})
    with pytest.raises(MixtureError, match="mixture 'stage4': needs 'weights' and 'size'"):
        mixtures_from_config({"stage4": {"weights": ZENO}})
    with pytest.raises(MixtureError, match="mixture 'stage4': the weight of pool 'critic' is negative"):
        mixtures_from_config({"stage4": {"weights": {"critic": -1}, "size": 3}})
