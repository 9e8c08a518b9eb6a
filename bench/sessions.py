"""Benchmark the session layer against the raw drivers and against BIRD-RL's copy-and-reopen.

    python bench/sessions.py [--spider ../shared/data/spider] [--dialects sqlite,postgresql,mysql]

Per dialect, on a small and on the largest available Spider database:
- session open+close (median; new connection, and through a SessionPool), and for SQLite BIRD-RL's reset (copy the file, reopen) side by side;
- per-query time of ``session.execute`` vs the raw driver call on the *same connection* for the
  database's Spider gold queries (each query timed alternately both ways; medians), and the
  overhead ratio.
Servers are used when SQLRL_PG_ADMIN_URL / SQLRL_MYSQL_ADMIN_URL are set (scripts/dbservers.sh);
otherwise that dialect is reported as skipped. Prints a table and writes JSON (``--out``).
Not a test: numbers depend on the machine; docs/sessions.md quotes one run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

import sqlglot

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sqlrl.db import SessionPool, open_session  # noqa: E402

DATABASES = {"small": "concert_singer", "largest": "sakila_1"}
SQLGLOT = {"sqlite": "sqlite", "postgresql": "postgres", "mysql": "mysql"}
ADMIN_ENV = {"postgresql": "SQLRL_PG_ADMIN_URL", "mysql": "SQLRL_MYSQL_ADMIN_URL"}


def gold_queries(spider: Path, db_id: str) -> list[str]:
    items = json.loads((spider / "dev.json").read_text())
    items += json.loads((spider / "train_spider_syn.json").read_text())
    seen, out = set(), []
    for item in items:
        q = item["query"].strip()
        if item["db_id"] == db_id and q not in seen:
            seen.add(q)
            out.append(q)
    return out


def median_ms(fn, n: int) -> float:
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)


def raw_call(dialect: str, conn, sql: str) -> None:
    if dialect == "sqlite":
        conn.execute(sql).fetchall()
    else:
        cur = conn.cursor()
        cur.execute(sql)
        if cur.description is not None:
            cur.fetchall()
        cur.close()


def query_overheads(dialect: str, url: str, queries: list[str], reps: int) -> dict:
    session = open_session(url)
    conn = session._conn  # the raw driver connection under the session (same connection)
    raw_ms, ours_ms, ratios, used = [], [], [], 0
    try:
        for q in queries:
            sql = q if dialect == "sqlite" else sqlglot.transpile(q, read="sqlite", write=SQLGLOT[dialect])[0]
            if not session.execute(sql).ok:
                continue  # a gold query this dialect cannot run: not an overhead sample
            try:
                raw_call(dialect, conn, sql)
            except Exception:
                continue
            used += 1
            a, b = [], []
            for _ in range(reps):  # alternate so drift hits both sides equally
                t0 = time.perf_counter()
                raw_call(dialect, conn, sql)
                a.append((time.perf_counter() - t0) * 1e3)
                t0 = time.perf_counter()
                session.execute(sql)
                b.append((time.perf_counter() - t0) * 1e3)
            ra, rb = statistics.median(a), statistics.median(b)
            raw_ms.append(ra)
            ours_ms.append(rb)
            ratios.append(rb / ra)
    finally:
        session.close()
    if not used:
        return {"queries": 0}
    return {
        "queries": used,
        "raw_median_ms": statistics.median(raw_ms),
        "session_median_ms": statistics.median(ours_ms),
        "median_ratio": statistics.median(ratios),
        "total_ratio": sum(ours_ms) / sum(raw_ms),
        "median_added_us": statistics.median([(o - r) * 1e3 for o, r in zip(ours_ms, raw_ms)]),
    }


def bird_rl_reset(path: str) -> float:
    """BIRD-RL's per-trajectory reset: copy the database file, reopen it."""
    tmpdir = tempfile.mkdtemp(prefix="birdrl-")
    target = os.path.join(tmpdir, "db.sqlite")

    def once():
        shutil.copyfile(path, target)
        conn = sqlite3.connect(target)
        conn.execute("SELECT 1").fetchone()
        conn.close()

    try:
        return median_ms(once, 100)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


def server_url(dialect: str, sqlite_path: str, db_id: str) -> str | None:
    admin = os.environ.get(ADMIN_ENV[dialect])
    if not admin:
        return None
    from sqlrl.db.loader import load_sqlite
    return load_sqlite(sqlite_path, admin, f"bench_{db_id}".lower(), replace=True).agent_url


def run(spider: Path, dialects: list[str], reps: int) -> list[dict]:
    rows = []
    for dialect in dialects:
        for size, db_id in DATABASES.items():
            path = spider / "database" / db_id / f"{db_id}.sqlite"
            if not path.exists():
                rows.append({"dialect": dialect, "db": db_id, "skipped": "database file missing"})
                continue
            url = f"sqlite:///{path}" if dialect == "sqlite" else server_url(dialect, str(path), db_id)
            if url is None:
                rows.append({"dialect": dialect, "db": db_id, "skipped": f"{ADMIN_ENV[dialect]} unset"})
                continue
            open_session(url).close()  # warm caches (SQLite snapshot, server buffers)
            n_open = {"sqlite": 300, "postgresql": 100, "mysql": 20}[dialect]
            row = {"dialect": dialect, "db": db_id, "size": size, "bytes": path.stat().st_size,
                   "open_close_ms": median_ms(lambda: open_session(url).close(), n_open)}
            with SessionPool() as pool:  # what rollouts use: warm connections, reset on return
                pool.session(url).close()
                row["pooled_open_close_ms"] = median_ms(lambda: pool.session(url).close(), n_open)
            if dialect == "sqlite":
                row["bird_rl_copy_reopen_ms"] = bird_rl_reset(str(path))
                row["open_speedup_vs_bird_rl"] = row["bird_rl_copy_reopen_ms"] / row["open_close_ms"]
            row.update(query_overheads(dialect, url, gold_queries(spider, db_id), reps))
            rows.append(row)
    return rows


def print_table(rows: list[dict]) -> None:
    head = ("dialect", "db", "open+close ms", "pooled ms", "BIRD-RL copy+reopen ms", "speed-up", "queries",
            "raw ms", "session ms", "ratio (median)", "added µs")
    print(" | ".join(head))
    print(" | ".join("---" for _ in head))
    for r in rows:
        if "skipped" in r:
            print(f"{r['dialect']} | {r['db']} | skipped: {r['skipped']}")
            continue

        def f(key, fmt="{:.3f}"):
            return fmt.format(r[key]) if key in r else "–"
        print(" | ".join([r["dialect"], r["db"], f("open_close_ms"), f("pooled_open_close_ms"),
                          f("bird_rl_copy_reopen_ms"),
                          f("open_speedup_vs_bird_rl", "{:.1f}×"), str(r.get("queries", 0)),
                          f("raw_median_ms"), f("session_median_ms"), f("median_ratio", "{:.2f}"),
                          f("median_added_us", "{:.0f}")]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spider", default=str(ROOT.parent / "shared" / "data" / "spider"))
    ap.add_argument("--dialects", default="sqlite,postgresql,mysql")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "sessions.json"))
    args = ap.parse_args()
    spider = Path(args.spider)
    if not (spider / "database").is_dir():
        sys.exit(f"Spider not found at {spider}: pass --spider PATH")
    rows = run(spider, args.dialects.split(","), args.reps)
    print_table(rows)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"rows": rows, "cpus": os.cpu_count()}, indent=2))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
