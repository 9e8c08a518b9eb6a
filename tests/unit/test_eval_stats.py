"""sqlrl.eval.stats: the Wilson interval against its formula and known values, the paired bootstrap
(identical evaluations, a clear improvement, a clear regression, mismatched task ids, determinism),
and sqlrl.eval.strata: a stratified, deterministic held-out set."""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import dataclass

import pytest

from sqlrl.eval.stats import as_outcome, paired_difference, success_rate, wilson_interval
from sqlrl.eval.strata import allocate_kinds, stratified_sample, strata_counts

Z = 1.959963984540054


def wilson_by_hand(k: int, n: int) -> tuple[float, float]:
    p = k / n
    centre = (p + Z * Z / (2 * n)) / (1 + Z * Z / n)
    half = Z / (1 + Z * Z / n) * math.sqrt(p * (1 - p) / n + Z * Z / (4 * n * n))
    return centre - half, centre + half


@pytest.mark.parametrize("k, n, expected", [
    (0, 64, (0.0, 3.841458820694124 / (64 + 3.841458820694124))),  # 0/n: upper bound z²/(n+z²)
    (32, 64, (0.38102, 0.61898)),  # symmetric around 1/2
    (64, 64, (64 / (64 + 3.841458820694124), 1.0)),
    (1, 8, (0.02242, 0.47089)),    # the old 8-task evaluation: one task solved
])
def test_wilson_matches_the_formula_and_known_values(k, n, expected):
    low, high = wilson_interval(k, n)
    assert low == pytest.approx(expected[0], abs=1e-5) and high == pytest.approx(expected[1], abs=1e-5)
    by_hand = wilson_by_hand(k, n)
    assert low == pytest.approx(max(0.0, by_hand[0]), abs=1e-12)
    assert high == pytest.approx(min(1.0, by_hand[1]), abs=1e-12)
    assert low <= k / n <= high


def test_wilson_edges_and_errors():
    assert wilson_interval(0, 0) == (0.0, 1.0)
    assert wilson_interval(0, 64)[0] == 0.0 and wilson_interval(64, 64)[1] == 1.0
    narrow, wide = wilson_interval(32, 64, level=0.5), wilson_interval(32, 64, level=0.99)
    assert wide[0] < narrow[0] < 0.5 < narrow[1] < wide[1]
    for bad in [(-1, 4), (5, 4), (1.5, 4), (True, 4)]:
        with pytest.raises(ValueError):
            wilson_interval(*bad)
    with pytest.raises(ValueError):
        wilson_interval(1, 4, level=1.0)


def test_success_rate_skips_unscored_and_rejects_non_binary():
    r = success_rate([1, 0, True, None, 1.0, 0])
    assert (r.successes, r.n, r.rate) == (3, 5, 0.6) and r.ci95 == wilson_interval(3, 5)
    assert success_rate([]).n == 0 and success_rate([]).ci95 == (0.0, 1.0)
    with pytest.raises(ValueError, match="task '1'"):
        success_rate([1, 0.5])
    assert as_outcome(False) == 0 and as_outcome(None) is None


def ids(n: int) -> list[str]:
    return [f"t{i:03d}" for i in range(n)]


def test_paired_bootstrap_of_identical_evaluations_is_zero():
    outcomes = dict(zip(ids(64), [i % 3 == 0 for i in range(64)]))
    d = paired_difference(outcomes, dict(reversed(list(outcomes.items()))))
    assert d.diff == 0.0 and d.ci95 == (0.0, 0.0) and d.n == 64 and d.matched
    assert d.gained == d.lost == 0 and d.before == d.after == pytest.approx(22 / 64)


def test_a_clear_improvement_has_an_interval_above_zero_and_a_regression_below():
    before = {t: 0 for t in ids(64)}
    after = {t: int(i < 20) for i, t in enumerate(ids(64))}  # 0/64 -> 20/64, no task lost
    up = paired_difference(before, after)
    assert up.diff == pytest.approx(20 / 64) and up.gained == 20 and up.lost == 0
    assert 0 < up.ci95[0] < up.diff < up.ci95[1] < 1
    down = paired_difference(after, before)
    assert down.ci95[1] < 0 and down.diff == pytest.approx(-20 / 64)


def test_a_small_change_on_few_tasks_is_not_called_an_improvement():
    before = {t: 0 for t in ids(8)}
    after = {**before, "t000": 1}  # one task of eight: the old evaluation's resolution
    d = paired_difference(before, after)
    assert d.ci95[0] == 0.0 < d.ci95[1]  # the interval includes zero
    swapped = {**before, "t000": 1}, {**before, "t001": 1}  # one gained, one lost
    d2 = paired_difference(*swapped)
    assert d2.diff == 0 and d2.ci95[0] < 0 < d2.ci95[1]


def test_the_bootstrap_is_deterministic_and_the_seed_matters():
    rng = random.Random(7)
    before = {t: rng.random() < 0.3 for t in ids(64)}
    after = {t: rng.random() < 0.45 for t in ids(64)}
    a = paired_difference(before, after, seed=3)
    assert paired_difference(dict(sorted(before.items(), reverse=True)), after, seed=3) == a
    many = {t: i % 2 for i, t in enumerate(ids(500))}, {t: int(i % 3 == 0) for i, t in enumerate(ids(500))}
    assert paired_difference(*many, seed=3).ci95 != paired_difference(*many, seed=4).ci95  # fine grid
    assert a.ci95[0] <= a.diff <= a.ci95[1]
    # against a plain index bootstrap: the same distribution, so close intervals
    import numpy as np

    d = np.array([int(after[t]) - int(before[t]) for t in sorted(before)])
    idx = np.random.default_rng(0).integers(0, len(d), size=(20000, len(d)))
    ref = np.quantile(d[idx].mean(axis=1), [0.025, 0.975])
    assert a.ci95[0] == pytest.approx(ref[0], abs=0.025) and a.ci95[1] == pytest.approx(ref[1], abs=0.025)


def test_mismatched_task_ids_are_reported_or_refused():
    before = {"a": 1, "b": 0, "c": 1, "x": 0}
    after = {"a": 1, "b": 1, "c": None, "y": 1}
    d = paired_difference(before, after)
    assert d.n == 2 and d.only_before == ("x",) and d.only_after == ("y",) and d.unscored == ("c",)
    assert not d.matched and d.to_dict()["only_after"] == ["y"]
    with pytest.raises(ValueError, match="1 only before"):
        paired_difference(before, after, strict=True)
    with pytest.raises(ValueError, match="no task is scored in both"):
        paired_difference({"a": 1}, {"b": 1})
    with pytest.raises(ValueError, match="task 'a'"):
        paired_difference({"a": 2}, {"a": 1})


# -- stratified held-out selection


@dataclass(frozen=True)
class T:
    task_id: str
    kind: str
    difficulty: str | None
    db_id: str


DOMAINS = ("clinic", "flights", "library", "music", "shop", "university")
LEVELS = ("simple", "moderate", "challenging")


def pool(per_stratum: int = 2) -> list[T]:
    """Like the generated test split at 60 tasks per domain: 2 per (kind, difficulty, domain)."""
    return [T(f"{kind}/{db}/{lvl}/{i}", kind, lvl, db)
            for kind in ("text2sql", "critic") for db in DOMAINS for lvl in LEVELS for i in range(per_stratum)]


def test_sixty_four_tasks_are_balanced_across_kind_difficulty_and_domain():
    tasks = pool()
    picked = stratified_sample(tasks, 64, seed=1, weights={"text2sql": 0.5, "critic": 0.5})
    assert len(picked) == 64 and len({t.task_id for t in picked}) == 64
    kinds = Counter(t.kind for t in picked)
    assert kinds == {"text2sql": 32, "critic": 32}
    for kind in kinds:
        mine = [t for t in picked if t.kind == kind]
        per_stratum = Counter(strata_counts(mine).values())
        assert set(per_stratum) == {1, 2} and sum(per_stratum.values()) == 18  # every stratum, 1 or 2
        for values in (Counter(t.difficulty for t in mine), Counter(t.db_id for t in mine)):
            assert max(values.values()) - min(values.values()) <= 1, values
    for values in (Counter(t.difficulty for t in picked), Counter(t.db_id for t in picked)):
        assert max(values.values()) - min(values.values()) <= 2, values  # the whole set, too


@pytest.mark.parametrize("n", [7, 12, 30, 36, 50, 64, 70])
def test_difficulty_and_domain_spread_on_a_full_grid(n):
    for seed in range(10):
        picked = stratified_sample(pool(), n, seed=seed, weights={"text2sql": 0.5, "critic": 0.5})
        assert len(picked) == n
        for kind in ("text2sql", "critic"):
            mine = [t for t in picked if t.kind == kind]
            assert max(strata_counts(mine).values()) - (1 if len(mine) < 18 else min(strata_counts(mine).values())) <= 1
            for values in (Counter(t.difficulty for t in mine), Counter(t.db_id for t in mine)):
                assert max(values.values()) - min(values.values()) <= 1, (seed, kind, values)
        for values in (Counter(t.difficulty for t in picked), Counter(t.db_id for t in picked)):
            assert max(values.values()) - min(values.values()) <= 2, (seed, values)


def test_the_selection_is_deterministic_and_order_independent():
    tasks = pool(3)
    a = stratified_sample(tasks, 40, seed=5)
    shuffled = list(tasks)
    random.Random(0).shuffle(shuffled)
    assert [t.task_id for t in stratified_sample(shuffled, 40, seed=5)] == [t.task_id for t in a]
    assert {t.task_id for t in stratified_sample(tasks, 40, seed=6)} != {t.task_id for t in a}
    # the same weights written in another key order are the same config: the same tasks, in order
    for n in (9, 16, 40):
        one = stratified_sample(tasks, n, seed=1, weights={"text2sql": 0.5, "critic": 0.5})
        two = stratified_sample(tasks, n, seed=1, weights={"critic": 0.5, "text2sql": 0.5})
        assert [t.task_id for t in one] == [t.task_id for t in two]


def test_kind_shares_shortfalls_and_small_pools():
    for weights in ({"text2sql": 0.5, "critic": 0.5}, {"critic": 0.5, "text2sql": 0.5}):
        assert allocate_kinds({"critic": 50, "text2sql": 50}, 9, weights) == \
            {"text2sql": 4, "critic": 5}  # the tie goes to the alphabetically first kind, in any key order
    assert allocate_kinds({"critic": 3, "text2sql": 50}, 10, {"text2sql": 1, "critic": 1}) == \
        {"text2sql": 7, "critic": 3}  # critic's shortfall goes to text2sql
    assert allocate_kinds({"critic": 3, "text2sql": 50}, 10, {"critic": 1.0}) == {"critic": 3}
    tasks = pool(1)  # 36 tasks
    assert len(stratified_sample(tasks, 100)) == 36  # everything, once
    assert {t.kind for t in stratified_sample(tasks, 10, weights={"critic": 1.0})} == {"critic"}
    unknown = [T("u1", "text2sql", None, "shop"), T("u2", "text2sql", None, "shop")]
    assert len(stratified_sample(unknown, 1)) == 1
    with pytest.raises(ValueError, match="appears twice"):
        stratified_sample(tasks + tasks[:1], 4)
    with pytest.raises(ValueError, match="positive weight"):
        allocate_kinds({"critic": 3}, 2, {"critic": 0})
