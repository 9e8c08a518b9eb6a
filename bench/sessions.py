"""Benchmark the session layer against the raw drivers and against BIRD-RL's copy-and-reopen.

    python bench/sessions.py [--spider ../shared/data/spider] [--dialects sqlite,postgresql,mysql]

Per dialect, on a small and on the largest available Spider database:
- session open+close (median). On the servers every session gets its own clone and role
  (``sqlrl.db.provisioning.scratch``): "lease" is open+close when a prepared clone is ready (the hot path),
  "cold" when none is (the clone is made on the spot), "clone" the median preparation time
  (clone + connect, off the hot path), and a steady-state run of 8 threads opening, querying and
  closing sessions reports sessions/s, the share served from ready clones and the lease p50.
- SQLite: open+close against BIRD-RL's reset (copy the file, reopen it), with the copy both on
  disk (``--disk-dir``, default: the repository's filesystem) and on tmpfs (``/dev/shm``): the
  copy's cost depends on the filesystem, so both are shown with the filesystem type.
- per-query time of ``session.execute`` vs the raw driver call on the *same connection* for the
  database's Spider gold queries, and of a session that attests (``Limits.attest``: the reward
  judge's sessions): the three are timed back to back in each round, and the ratios are the
  median of the per-round ratios (paired).
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

from sqlrl.db import Limits, open_session  # noqa: E402
from sqlrl.db.dialects import descriptor  # noqa: E402
from sqlrl.db.dialects.descriptor import dialect_of, sqlglot_name  # noqa: E402
from sqlrl.db.provisioning.loader import SOURCE_DIALECT  # noqa: E402
from sqlrl.db.provisioning.scratch import SCRATCH  # noqa: E402
from sqlrl.db.url import parse_url  # noqa: E402

DATABASES = {"small": "concert_singer", "largest": "sakila_1"}


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


def raw_call(conn, sql: str) -> None:
    """The driver's cheapest call: its connection-level shortcut when it has one (sqlite3)."""
    if hasattr(conn, "execute"):
        conn.execute(sql).fetchall()
    else:
        cur = conn.cursor()
        cur.execute(sql)
        if cur.description is not None:
            cur.fetchall()
        cur.close()


def query_overheads(dialect: str, url: str, queries: list[str], reps: int) -> dict:
    """Per query, ``reps`` rounds; each round times the raw driver call, ``session.execute``
    on the same connection, and ``execute`` on a session that attests (``Limits.attest``, as the
    reward judge's sessions do; its own connection), back to back. Ratios are taken within a
    round (paired), then summarised: the median over every (query, round) pair."""
    session = open_session(url)
    attesting = open_session(url, limits=Limits(attest=True))
    conn = session._conn  # the raw driver connection under the session (same connection)
    raw_ms, ours_ms, att_ms, used = [], [], [], 0
    ratio, att_ratio, att_vs_ours = [], [], []
    try:
        for q in queries:
            sql = q if dialect == SOURCE_DIALECT else sqlglot.transpile(
                q, read=sqlglot_name(SOURCE_DIALECT), write=sqlglot_name(dialect))[0]
            if not session.execute(sql).ok or not attesting.execute(sql).ok:
                continue  # a gold query this dialect cannot run: not an overhead sample
            try:
                raw_call(conn, sql)
            except Exception:
                continue
            used += 1
            a, b, c = [], [], []
            for _ in range(reps):  # one round: the three back to back, so drift hits all alike
                t0 = time.perf_counter()
                raw_call(conn, sql)
                t1 = time.perf_counter()
                session.execute(sql)
                t2 = time.perf_counter()
                attesting.execute(sql)
                t3 = time.perf_counter()
                a.append((t1 - t0) * 1e3)
                b.append((t2 - t1) * 1e3)
                c.append((t3 - t2) * 1e3)
                ratio.append((t2 - t1) / (t1 - t0))
                att_ratio.append((t3 - t2) / (t1 - t0))
                att_vs_ours.append((t3 - t2) / (t2 - t1))
            raw_ms.append(statistics.median(a))
            ours_ms.append(statistics.median(b))
            att_ms.append(statistics.median(c))
    finally:
        session.close()
        attesting.close()
    if not used:
        return {"queries": 0}
    return {
        "queries": used,
        "rounds_per_query": reps,
        "raw_median_ms": statistics.median(raw_ms),
        "session_median_ms": statistics.median(ours_ms),
        "attest_median_ms": statistics.median(att_ms),
        "median_ratio": statistics.median(ratio),  # session / raw, paired per round
        "attest_median_ratio": statistics.median(att_ratio),  # attesting session / raw
        "attest_vs_session_median_ratio": statistics.median(att_vs_ours),
        "total_ratio": sum(ours_ms) / sum(raw_ms),
        "median_added_us": statistics.median([(o - r) * 1e3 for o, r in zip(ours_ms, raw_ms)]),
    }


def paired_reset(url: str, path: str, directory: str, rounds: int = 100) -> dict:
    """sqlrl's open+close against BIRD-RL's per-trajectory reset (copy the database file into
    ``directory``, reopen it), interleaved in rounds; the speed-up is the median of the per-round
    ratios (both timed in the same round, so drift and load hit both alike)."""
    tmpdir = tempfile.mkdtemp(prefix="birdrl-", dir=directory)
    target = os.path.join(tmpdir, "db.sqlite")

    def copy_reopen():
        shutil.copyfile(path, target)
        conn = sqlite3.connect(target)
        conn.execute("SELECT 1").fetchone()
        conn.close()

    ours, theirs, ratios = [], [], []
    try:
        for _ in range(rounds):
            t0 = time.perf_counter()
            open_session(url).close()
            t1 = time.perf_counter()
            copy_reopen()
            t2 = time.perf_counter()
            ours.append((t1 - t0) * 1e3)
            theirs.append((t2 - t1) * 1e3)
            ratios.append((t2 - t1) / (t1 - t0))
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    return {"open_close_ms": statistics.median(ours), "copy_reopen_ms": statistics.median(theirs),
            "speedup": statistics.median(ratios)}


def fs_type(directory: str) -> str:
    import subprocess
    out = subprocess.run(["stat", "-f", "-c", "%T", directory], capture_output=True, text=True)
    return out.stdout.strip() or "?"


def pct(samples: list[float], q: float) -> float:
    return sorted(samples)[min(len(samples) - 1, int(q * len(samples)))]


def server_leases(url: str, n: int) -> dict:
    """Lease (a ready clone) and cold open (none ready) open+close times, and the clone time."""
    lease, cold = [], []
    SCRATCH.settle()
    prepared_before = SCRATCH.stats().prepared
    SCRATCH.configure(prefill=1)
    for _ in range(2):
        open_session(url).close()  # a base taken twice gets clones ahead
    for _ in range(n):
        SCRATCH.settle()
        t0 = time.perf_counter()
        open_session(url).close()
        lease.append((time.perf_counter() - t0) * 1e3)
    SCRATCH.configure(prefill=0)
    SCRATCH.settle()
    for _ in range(max(5, n // 4)):
        SCRATCH.forget(url, parse_url(url).database)  # nothing ready
        t0 = time.perf_counter()
        open_session(url).close()
        cold.append((time.perf_counter() - t0) * 1e3)
    SCRATCH.settle()
    made = SCRATCH.stats().prepared - prepared_before
    clone = list(SCRATCH.stats().prepare_ms)[-min(made, 256):]  # this base's clones only
    return {"lease_p50_ms": statistics.median(lease), "lease_p90_ms": pct(lease, 0.9),
            "cold_open_ms": statistics.median(cold), "clone_ms": statistics.median(clone)}


def steady_state(url: str, threads: int = 8, per_thread: int = 10, hold_s: float = 0.3) -> dict:
    """``threads`` rollouts, each repeatedly opening a session, running 3 queries over ``hold_s``
    seconds (the policy generating between turns) and closing it; with ``hold_s=0`` the rollouts
    open and close as fast as they can, which measures the clone capacity instead."""
    import threading
    SCRATCH.configure(prefill=threads, max_ready=2 * threads)
    open_session(url).close()
    open_session(url).close()
    SCRATCH.settle()
    before = SCRATCH.stats()
    leases: list[float] = []
    lock = threading.Lock()

    def rollout():
        for _ in range(per_thread):
            t0 = time.perf_counter()
            s = open_session(url)
            dt = (time.perf_counter() - t0) * 1e3
            for _ in range(3):
                s.execute("SELECT 1")
                time.sleep(hold_s / 3)
            s.close()
            with lock:
                leases.append(dt)

    t0 = time.perf_counter()
    workers = [threading.Thread(target=rollout) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    wall = time.perf_counter() - t0
    after = SCRATCH.stats()
    hits = after.ready_hits - before.ready_hits
    total = hits + after.misses - before.misses
    SCRATCH.configure(prefill=2, max_ready=16)
    SCRATCH.settle()
    key = "steady" if hold_s else "capacity"
    return {f"{key}_sessions_per_s": len(leases) / wall, f"{key}_ready_share": hits / max(1, total),
            f"{key}_lease_p50_ms": statistics.median(leases), f"{key}_lease_p90_ms": pct(leases, 0.9)}


def server_url(dialect: str, sqlite_path: str, db_id: str) -> str | None:
    admin = os.environ.get(dialect_of(dialect).admin_url_env or "")
    if not admin:
        return None
    from sqlrl.db.provisioning.loader import load_sqlite
    return load_sqlite(sqlite_path, admin, f"bench_{db_id}".lower(), replace=True).session_url


def run(spider: Path, dialects: list[str], reps: int, disk_dir: str) -> list[dict]:
    rows = []
    for dialect in dialects:
        for size, db_id in DATABASES.items():
            path = spider / "database" / db_id / f"{db_id}.sqlite"
            if not path.exists():
                rows.append({"dialect": dialect, "db": db_id, "skipped": "database file missing"})
                continue
            engine = dialect_of(dialect)
            url = (f"{engine.name}:///{path}" if engine.file_based
                   else server_url(dialect, str(path), db_id))
            if url is None:
                rows.append({"dialect": dialect, "db": db_id, "skipped": f"{engine.admin_url_env} unset"})
                continue
            open_session(url).close()  # warm caches (SQLite snapshot, server buffers)
            row = {"dialect": dialect, "db": db_id, "size": size, "bytes": path.stat().st_size}
            if engine.file_based:
                row["open_close_ms"] = median_ms(lambda: open_session(url).close(), 300)
                for where, directory in (("disk", disk_dir), ("tmpfs", "/dev/shm")):
                    if not os.path.isdir(directory):
                        continue
                    paired = paired_reset(url, str(path), directory)
                    row[f"copy_reopen_{where}_ms"] = paired["copy_reopen_ms"]
                    row[f"copy_reopen_{where}_fs"] = fs_type(directory)
                    row[f"speedup_vs_{where}"] = paired["speedup"]  # median per-round ratio
            else:
                row.update(server_leases(url, 40))
                if size == "small":
                    row.update(steady_state(url))
                    row.update(steady_state(url, hold_s=0.0))
            row.update(query_overheads(dialect, url, gold_queries(spider, db_id), reps))
            rows.append(row)
    return rows


def print_table(rows: list[dict]) -> None:
    head = ("dialect", "db", "open+close / lease p50 ms", "lease p90", "cold open", "clone",
            "copy+reopen disk (fs)", "copy+reopen tmpfs", "queries", "raw ms", "session ms",
            "ratio (median)", "added µs", "attesting ms", "attest/raw", "attest/session")
    print(" | ".join(head))
    print(" | ".join("---" for _ in head))
    for r in rows:
        if "skipped" in r:
            print(f"{r['dialect']} | {r['db']} | skipped: {r['skipped']}")
            continue

        def f(key, fmt="{:.3f}"):
            return fmt.format(r[key]) if key in r else "–"
        disk = (f"{r['copy_reopen_disk_ms']:.2f} ({r['copy_reopen_disk_fs']}, "
                f"{r['speedup_vs_disk']:.1f}×)") if "copy_reopen_disk_ms" in r else "–"
        tmpfs = (f"{r['copy_reopen_tmpfs_ms']:.2f} ({r['speedup_vs_tmpfs']:.1f}×)"
                 if "copy_reopen_tmpfs_ms" in r else "–")
        print(" | ".join([r["dialect"], r["db"], f("open_close_ms") if "open_close_ms" in r
                          else f("lease_p50_ms"), f("lease_p90_ms"), f("cold_open_ms", "{:.1f}"),
                          f("clone_ms", "{:.1f}"), disk, tmpfs, str(r.get("queries", 0)),
                          f("raw_median_ms"), f("session_median_ms"), f("median_ratio", "{:.2f}"),
                          f("median_added_us", "{:.0f}"), f("attest_median_ms"),
                          f("attest_median_ratio", "{:.2f}"),
                          f("attest_vs_session_median_ratio", "{:.2f}")]))
    for r in rows:
        for key, what in (("steady", "8 rollouts holding each session 0.3 s"),
                          ("capacity", "8 rollouts opening and closing back to back")):
            if f"{key}_sessions_per_s" in r:
                print(f"{what}, {r['dialect']} {r['db']}: {r[f'{key}_sessions_per_s']:.0f} "
                      f"sessions/s, {100 * r[f'{key}_ready_share']:.0f}% from ready clones, "
                      f"lease p50 {r[f'{key}_lease_p50_ms']:.2f} ms, p90 {r[f'{key}_lease_p90_ms']:.2f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spider", default=str(ROOT.parent / "shared" / "data" / "spider"))
    ap.add_argument("--dialects", default=",".join(d.name for d in descriptor.dialects() if d.verified))
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "sessions.json"))
    ap.add_argument("--disk-dir", default=str(ROOT / "bench"),
                    help="where the SQLite copy-and-reopen baseline copies to on disk")
    args = ap.parse_args()
    spider = Path(args.spider)
    if not (spider / "database").is_dir():
        sys.exit(f"Spider not found at {spider}: pass --spider PATH")
    rows = run(spider, args.dialects.split(","), args.reps, args.disk_dir)
    print_table(rows)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"rows": rows, "cpus": os.cpu_count()}, indent=2))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
