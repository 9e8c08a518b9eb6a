"""Benchmark execution-match reward labelling: sqlrl's Spider evaluator vs a naive baseline.

    python bench/rewards.py [--spider ../shared/data/spider] [--workers 1,2] [--out FILE]

Workload: the 3,888 labelled predictions of four published systems on Spider dev
(``../shared/data/spider_dev_predictions/exec_labels_official_testsuite.jsonl``), 972 questions.
Modes, run side by side in one process:

- ``naive``: what a straightforward reward function does, single process, one pair at a time:
  prepare both queries (test-suite rules), open a new ``sqlite3`` connection per query as the
  official ``exec_eval.exec_on_db_`` does (read-only, ``errors="ignore"`` text decoding, a 30 s
  progress-handler guard), execute gold then prediction, compare with the official semantics
  (``spider_ex``). The gold is re-executed for every pair.
- ``sqlrl-batch/wN``: ``label_pairs`` on all pairs at once with N worker threads: sessions from a
  pool, each distinct (database, query) executed once (gold cache; identical predictions too).
- ``sqlrl-batch/pN``: the same split by database over N forked processes (``label_in_processes``;
  SQLite work is CPU-bound and its timeout check is a Python callback, so threads cannot use the
  second core).
- ``sqlrl-stream``: one ``label_pairs`` call per pair sharing one ``QueryRunner`` (its cache),
  single thread: the per-reward latency a trainer sees once a question's gold has been seen.

Every mode runs once per round, ``--rounds`` rounds (default 5); each mode's median round is
reported. Reported: pairs/s, median and p90 ms per pair (batch modes: wall time / pairs), speed-up over naive,
and whether every mode's verdicts are identical to the naive ones and to the official labels.
The preparation cache (``spider_prepare``) is cleared before each mode.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sqlite3
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sqlrl.eval.compare import spider_ex, spider_prepare  # noqa: E402
from sqlrl.eval.spider import (QueryRunner, SpiderPair, eval_limits, label_in_processes,  # noqa: E402
                               label_pairs)

TARGET_SPEEDUP = 5.0
TIMEOUT_S = 30.0


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))] if s else float("nan")


def naive_exec(path: Path, sql: str) -> tuple[list | None, bool]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    conn.text_factory = lambda b: b.decode(errors="ignore")
    deadline = time.monotonic() + TIMEOUT_S
    conn.set_progress_handler(lambda: time.monotonic() > deadline, 10_000)
    try:
        return conn.execute(sql).fetchall(), True
    except Exception:
        return None, False
    finally:
        conn.close()


def naive_label(pair: SpiderPair, db_dir: Path) -> bool:
    prepare = spider_prepare.__wrapped__  # uncached: the naive path prepares every time
    path = db_dir / pair.db_id / f"{pair.db_id}.sqlite"
    gold_sql = prepare(pair.gold)
    gold, ok = naive_exec(path, gold_sql)
    if not ok:
        raise RuntimeError(f"gold failed: {pair.gold}")
    try:
        pred_sql = prepare(pair.pred)
    except ValueError:
        return False
    pred, ok = naive_exec(path, pred_sql)
    return ok and spider_ex(pred, gold, "order by" in gold_sql.lower())


def run_naive(pairs: list[SpiderPair], db_dir: Path) -> tuple[dict, list[bool]]:
    lat, out = [], []
    t0 = time.perf_counter()
    for p in pairs:
        t = time.perf_counter()
        out.append(naive_label(p, db_dir))
        lat.append((time.perf_counter() - t) * 1e3)
    wall = time.perf_counter() - t0
    return {"mode": "naive", "wall_s": wall, "pairs_s": len(pairs) / wall,
            "median_ms": pct(lat, 50), "p90_ms": pct(lat, 90), "executed": 2 * len(pairs)}, out


def run_batch(pairs: list[SpiderPair], db_dir: Path, workers: int) -> tuple[dict, list[bool]]:
    spider_prepare.cache_clear()
    runner = QueryRunner(eval_limits(TIMEOUT_S), workers)
    t0 = time.perf_counter()
    verdicts = label_pairs(pairs, db_dir, runner=runner)
    wall = time.perf_counter() - t0
    runner.close()
    per = wall * 1e3 / len(pairs)
    return {"mode": f"sqlrl-batch/w{workers}", "wall_s": wall, "pairs_s": len(pairs) / wall,
            "median_ms": per, "p90_ms": per, "executed": runner.executed}, [v.match for v in verdicts]


def run_processes(pairs: list[SpiderPair], db_dir: Path, n: int) -> tuple[dict, list[bool]]:
    spider_prepare.cache_clear()
    t0 = time.perf_counter()
    verdicts, executed = label_in_processes(pairs, db_dir, n, TIMEOUT_S, False)
    wall = time.perf_counter() - t0
    per = wall * 1e3 / len(pairs)
    return {"mode": f"sqlrl-batch/p{n}", "wall_s": wall, "pairs_s": len(pairs) / wall,
            "median_ms": per, "p90_ms": per, "executed": executed}, [v.match for v in verdicts]


def run_stream(pairs: list[SpiderPair], db_dir: Path) -> tuple[dict, list[bool]]:
    spider_prepare.cache_clear()
    runner = QueryRunner(eval_limits(TIMEOUT_S), 1)
    lat, out = [], []
    t0 = time.perf_counter()
    for p in pairs:
        t = time.perf_counter()
        out.append(label_pairs([p], db_dir, runner=runner)[0].match)
        lat.append((time.perf_counter() - t) * 1e3)
    wall = time.perf_counter() - t0
    runner.close()
    return {"mode": "sqlrl-stream", "wall_s": wall, "pairs_s": len(pairs) / wall,
            "median_ms": pct(lat, 50), "p90_ms": pct(lat, 90), "executed": runner.executed}, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spider", default=str(ROOT.parent / "shared" / "data" / "spider"))
    ap.add_argument("--workers", default="1,2", help="thread counts for the batch mode")
    ap.add_argument("--processes", default="2", help="process counts for the batch mode ('' for none)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds; each mode's median round is reported")
    ap.add_argument("--out", default=None, help="default: bench/results/rewards-<timestamp>.json")
    args = ap.parse_args()
    spider = Path(args.spider)
    labels_path = spider.parent / "spider_dev_predictions" / "exec_labels_official_testsuite.jsonl"
    if not (spider / "database").is_dir() or not labels_path.is_file():
        sys.exit(f"Spider data not found at {spider} (or {labels_path}): pass --spider PATH")
    db_dir = spider / "database"
    records = [json.loads(line) for line in labels_path.read_text().splitlines() if line.strip()]
    pairs = [SpiderPair(r["db_id"], r["gold"], r["pred"]) for r in records]
    official = [bool(r["exec_match"]) for r in records]
    out = Path(args.out or ROOT / "bench" / "results" / f"rewards-{time.strftime('%Y%m%d-%H%M%S')}.json")

    print(f"{len(pairs)} pairs, {len({(p.db_id, p.gold) for p in pairs})} distinct golds, "
          f"{len({(p.db_id, p.pred) for p in pairs})} distinct predictions", flush=True)
    modes = [lambda: run_naive(pairs, db_dir)]
    modes += [lambda w=w: run_batch(pairs, db_dir, w) for w in (int(x) for x in args.workers.split(","))]
    modes += [lambda n=n: run_processes(pairs, db_dir, n)
              for n in (int(x) for x in args.processes.split(",") if x)]
    modes += [lambda: run_stream(pairs, db_dir)]
    runs: dict[str, list[dict]] = {}
    verdicts: dict[str, list[bool]] = {}
    for r in range(args.rounds):  # every mode once per round, so drift hits all modes alike
        for mode in modes:
            row, v = mode()
            runs.setdefault(row["mode"], []).append(row)
            if verdicts.setdefault(row["mode"], v) != v:
                sys.exit(f"{row['mode']} gave different verdicts in round {r + 1}")
        print(f"  round {r + 1}: " + ", ".join(f"{m} {x[-1]['pairs_s']:.0f}/s" for m, x in runs.items()),
              flush=True)
    rows = []
    for mode, xs in runs.items():  # the median round of each mode
        row = sorted(xs, key=lambda x: x["wall_s"])[len(xs) // 2]
        rows.append({**row, "rounds_pairs_s": [round(x["pairs_s"]) for x in xs]})
    naive = rows[0]

    for r in rows:
        r["speedup"] = r["pairs_s"] / naive["pairs_s"]
        r["same_as_naive"] = verdicts[r["mode"]] == verdicts["naive"]
        r["agree_official"] = sum(a == b for a, b in zip(verdicts[r["mode"]], official))
        r["ex"] = sum(verdicts[r["mode"]]) / len(pairs)
    print("\nmode | pairs/s | median ms/pair | p90 ms/pair | queries run | speed-up | "
          "same verdicts as naive | agree with official")
    print(" | ".join(["---"] * 8))
    for r in rows:
        print(" | ".join([r["mode"], f"{r['pairs_s']:.0f}", f"{r['median_ms']:.3f}",
                          f"{r['p90_ms']:.3f}", str(r["executed"]), f"{r['speedup']:.1f}x",
                          str(r["same_as_naive"]), f"{r['agree_official']}/{len(pairs)}"]))
    best = max(rows[1:], key=lambda r: r["pairs_s"])
    targets = {"speedup": {"target": TARGET_SPEEDUP, "best": best["speedup"], "best_mode": best["mode"],
                           "met": best["speedup"] >= TARGET_SPEEDUP},
               "identical_verdicts": all(r["same_as_naive"] for r in rows)}
    print("\ntargets:", json.dumps(targets))
    result = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                          "python": platform.python_version(), "sqlite": sqlite3.sqlite_version},
              "pairs": len(pairs), "targets": targets, "modes": rows}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
