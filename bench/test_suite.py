"""Benchmark the reward with and without test-suite match (``reward.test_suite``), paired.

    python bench/test_suite.py [--spider ../shared/data/spider] [--dbs 6] [--rounds 5] [--out FILE]

Workload: the labelled Spider dev predictions of four published systems
(``spider_dev_predictions/exec_labels_official_testsuite.jsonl``) on the first ``--dbs``
databases of dev (in file order), scored as a trainer does: one ``compute("spider_ex_single")``
per (task, response) through a ``Judge`` (fresh session per prediction, gold once per task).

- ``ex``: the default reward, single-instance execution match.
- ``suite``: ``RewardConfig(test_suite=True)``, the Judge holding the ``TestSuites`` that a
  warm-up pass filled (variants per database and a suite per gold are built once per run; that
  one-time cost is reported separately as ``build``): a reward actor's steady state.
- ``suite-disk``: the same with a new ``TestSuites`` on the same folder each round, so every
  gold's suite is read back from its JSON file (a restarted actor, or another process).

Each round runs every mode on fresh Judges (cold gold caches, the same for all), the order
rotated by one each round, so load changes hit all alike; the median round per mode is reported
with its ratio to ``ex`` of per-sample cost (target <= 2x for ``suite``), and how many samples
the suite's reward takes the result part from (``lucky_match``).
Prints a table; writes JSON (default ``bench/results/test_suite-<timestamp>.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sqlrl.db import Limits  # noqa: E402
from sqlrl.suites.test_suite import TestSuites  # noqa: E402
from sqlrl.rewards import Judge, RewardConfig, compute  # noqa: E402
from sqlrl.tasks.types import Text2SQLTask  # noqa: E402

TARGET_RATIO = 2.0


def load(spider: Path, n_dbs: int) -> tuple[list[tuple[Text2SQLTask, str]], dict]:
    labels = spider.parent / "spider_dev_predictions" / "exec_labels_official_testsuite.jsonl"
    records = [json.loads(line) for line in labels.read_text().splitlines() if line.strip()]
    dbs = list(dict.fromkeys(r["db_id"] for r in records))[:n_dbs]
    catalog = {db: {"sqlite": f"sqlite:///{(spider / 'database' / db / f'{db}.sqlite').resolve()}"}
               for db in dbs}
    items = []
    for r in records:
        if r["db_id"] in catalog:
            task = Text2SQLTask(task_id=f"dev/{r['index']}", db_id=r["db_id"], question=r["question"],
                                gold_sql=r["gold"])
            items.append((task, f"<thought>t</thought><solution>{r['pred']}</solution>"))
    return items, catalog


def run(items, catalog, suites: TestSuites | None) -> tuple[float, list]:
    cfg = RewardConfig(test_suite=True, test_suite_dir=str(suites.cache_dir)) if suites else RewardConfig()
    judge = Judge(catalog, limits=Limits(timeout_s=30.0, max_rows=100_000), suites=suites)
    t0 = time.perf_counter()
    out = [compute("spider_ex_single", task, response, judge, cfg) for task, response in items]
    return time.perf_counter() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spider", default=str(ROOT.parent / "shared" / "data" / "spider"))
    ap.add_argument("--dbs", type=int, default=6, help="the first N dev databases")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cache", default=None, help="variants/suites folder (default: a temp dir)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    items, catalog = load(Path(a.spider), a.dbs)
    cache = Path(a.cache or tempfile.mkdtemp(prefix="sqlrl-ts-bench-"))
    print(f"{len(items)} samples, {len({t.task_id for t, _ in items})} tasks, {len(catalog)} "
          f"databases; load {os.getloadavg()}", flush=True)

    t0 = time.perf_counter()
    warm = TestSuites(cache)
    _, first = run(items, catalog, warm)  # builds variants and distils every gold's suite
    build_s = time.perf_counter() - t0

    modes = {"ex": lambda: None, "suite": lambda: warm, "suite-disk": lambda: TestSuites(cache)}
    names = list(modes)
    times: dict[str, list[float]] = {m: [] for m in names}
    scores: dict[str, list] = {}
    for r in range(a.rounds):
        for mode in names[r % 3:] + names[:r % 3]:
            elapsed, out = run(items, catalog, modes[mode]())
            times[mode].append(elapsed)
            scores[mode] = out
    n = len(items)
    med = {m: statistics.median(v) for m, v in times.items()}
    ex_right = sum(b.parts["result"] == 1.0 for b in scores["ex"])
    suite_right = sum(b.parts["result"] == 1.0 for b in scores["suite"])
    lucky = sum(b.parts["lucky_match"] == 1.0 for b in scores["suite"])
    ratio = med["suite"] / med["ex"]
    disk = med["suite-disk"] / med["ex"]
    print(f"\none-time build (variants + distillation of every gold, then scoring once): {build_s:.1f} s")
    print("| mode | samples/s | ms/sample | result=1 | lucky_match |")
    print("|---|---|---|---|---|")
    print(f"| ex (single instance) | {n / med['ex']:.0f} | {1000 * med['ex'] / n:.2f} | {ex_right} | -- |")
    print(f"| suite | {n / med['suite']:.0f} | {1000 * med['suite'] / n:.2f} | {suite_right} | {lucky} |")
    print(f"| suite, suites read from disk | {n / med['suite-disk']:.0f} | "
          f"{1000 * med['suite-disk'] / n:.2f} | {suite_right} | {lucky} |")
    print(f"\nsuite / ex cost per sample: {ratio:.2f}x (target <= {TARGET_RATIO}x: "
          f"{'met' if ratio <= TARGET_RATIO else 'NOT met'}); read from disk: {disk:.2f}x; "
          f"load {os.getloadavg()}")
    result = {"samples": n, "databases": list(catalog), "rounds": a.rounds, "times_s": times,
              "median_s": med, "ratio": ratio, "ratio_disk": disk, "target_ratio": TARGET_RATIO, "build_s": build_s,
              "ex_result_1": ex_right, "suite_result_1": suite_right, "lucky_match": lucky,
              "loadavg_end": os.getloadavg(), "machine": platform.platform(),
              "cpus": os.cpu_count()}
    out = Path(a.out or ROOT / "bench" / "results" / f"test_suite-{time.strftime('%Y%m%d-%H%M%S')}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
