"""A checked demonstration of the foundation: ``python -m jobs.foundation_demo [--out runs/demo]``.

Demonstrates the foundation on a generated SQLite database:
an agent-style trajectory through the tools, isolation between sessions, a timeout that stops a
runaway query, sandbox refusals, and the session pool under concurrent load. Every step is a check;
the job prints a table and exits non-zero when any check fails. Reads top to bottom:
setup -> run -> report.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sqlite3
import statistics
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from sqlrl.db import ErrorKind, Limits, PoolConfig, SessionPool, open_session
from sqlrl.tasks.demo_db import build_demo_database
from sqlrl.tools import ToolCall, run_tool

console = Console()


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool
    detail: str


def base_checksum(path: Path) -> str:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    digest = hashlib.sha256()
    for name, sql in conn.execute("SELECT name, sql FROM sqlite_master ORDER BY name"):
        digest.update(f"{name}{sql}".encode())
        if sql and sql.startswith("CREATE TABLE"):
            for row in conn.execute(f'SELECT * FROM "{name}" ORDER BY 1, 2'):
                digest.update(repr(row).encode())
    conn.close()
    return digest.hexdigest()


def agent_trajectory(url: str) -> Check:
    """A scripted agent: explore, make a mistake, recover, submit — the observations it reads."""
    calls = [
        ToolCall("execute_sql", {"sql": "SELECT name FROM sqlite_master WHERE type = 'table'"}),
        ToolCall("execute_sql", {"sql": "SELECT city, count(*) FROM order GROUP BY city"}),
        ToolCall("execute_sql", {"sql": "CREATE TEMP TABLE delivered AS SELECT o.*, c.city FROM orders o "
                                        "JOIN customers c USING (customer_id) WHERE o.status = 'delivered'"}),
        ToolCall("execute_sql", {"sql": "SELECT city, count(*) AS n FROM delivered WHERE city IS NOT NULL "
                                        "GROUP BY city ORDER BY n DESC LIMIT 3"}),
        ToolCall("submit_solution", {"sql": "SELECT c.city FROM orders o JOIN customers c USING (customer_id) "
                                            "WHERE o.status = 'delivered' AND c.city IS NOT NULL "
                                            "GROUP BY c.city ORDER BY count(*) DESC LIMIT 1"}),
    ]
    console.rule("[bold]A trajectory: which city receives the most delivered orders?")
    outcomes = []
    with open_session(url) as session:
        for call in calls:
            outcome = run_tool(call, session)
            outcomes.append(outcome)
            console.print(f"[cyan]{call.name}[/cyan]({call.arguments['sql']})")
            console.print(outcome.observation, markup=False, highlight=False)
            console.print()
    errors = [o.is_error for o in outcomes]
    passed = errors == [False, True, False, False, False] and outcomes[-1].is_final
    return Check("agent trajectory through the tools", passed,
                 f"{len(calls)} tool calls, 1 error observation recovered from, TEMP table reused")


def isolation(url: str) -> Check:
    with open_session(url) as a, open_session(url) as b:
        a.execute("DELETE FROM orders")
        a.execute("CREATE TABLE scratch AS SELECT 1 AS x")
        seen_by_a = a.execute("SELECT count(*) FROM orders").rows[0][0]
        seen_by_b = b.execute("SELECT count(*) FROM orders").rows[0][0]
        b_sees_scratch = b.execute("SELECT * FROM scratch").ok
    return Check("sessions are isolated", seen_by_a == 0 and seen_by_b > 0 and not b_sees_scratch,
                 f"after DELETE in session A: A sees {seen_by_a} orders, B sees {seen_by_b}")


def timeout(url: str) -> Check:
    with open_session(url, limits=Limits(timeout_s=1.0)) as s:
        t0 = time.monotonic()
        r = s.execute("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c")
        took = time.monotonic() - t0
        usable = s.execute("SELECT 1").ok
    ok = r.error is not None and r.error.kind is ErrorKind.TIMEOUT and took < 2.0 and usable
    return Check("runaway query stopped by the timeout", ok,
                 f"infinite recursive CTE stopped after {took:.2f}s (limit 1s); session still usable")


def sandbox(url: str, out: Path) -> Check:
    hostile = [f"ATTACH '{out}/evil.db' AS evil", "PRAGMA writable_schema = 1",
               f"VACUUM INTO '{out}/copy.db'", "COMMIT", "SELECT load_extension('x')"]
    with open_session(url) as s:
        kinds = [s.execute(sql).error for sql in hostile]
    denied = all(k is not None and k.kind is ErrorKind.PERMISSION for k in kinds)
    no_files = not (out / "evil.db").exists() and not (out / "copy.db").exists()
    return Check("hostile SQL refused", denied and no_files,
                 f"{len(hostile)} statements (ATTACH, writable PRAGMA, VACUUM INTO, COMMIT, "
                 f"load_extension) -> permission errors, no file written")


def pool_load(url: str, threads: int = 4, per_thread: int = 250) -> tuple[Check, dict]:
    pool = SessionPool(PoolConfig(max_size=threads))
    latencies: list[float] = []
    failures: list[str] = []

    def worker() -> None:
        for i in range(per_thread):
            t0 = time.perf_counter()
            with pool.session(url) as s:
                r = s.execute(f"SELECT count(*) FROM order_items WHERE quantity > {i % 5}")
                if not r.ok:
                    failures.append(str(r.error))
            latencies.append((time.perf_counter() - t0) * 1e3)

    t0 = time.perf_counter()
    workers = [threading.Thread(target=worker) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    wall = time.perf_counter() - t0
    stats = pool.stats()
    pool.close()
    n = threads * per_thread
    ok = not failures and stats.leases == n and stats.in_use == 0
    return (Check("session pool under load", ok,
                  f"{n} sessions from {threads} threads in {wall:.2f}s; median session "
                  f"(checkout+query+close) {statistics.median(latencies):.3f} ms; "
                  f"{stats.connects} connections opened"),
            asdict(stats))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="runs/demo", help="where the generated data and report go")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    # setup: the embedded default data
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    db_path = Path(build_demo_database(str(out / "shop.sqlite"), seed=args.seed))
    url = f"sqlite:///{db_path}"
    before = base_checksum(db_path)
    console.print(f"Generated the demo database at {db_path}")

    # run
    checks = [agent_trajectory(url), isolation(url), timeout(url), sandbox(url, out)]
    pool_check, pool_stats = pool_load(url)
    checks.append(pool_check)
    checks.append(Check("base database unchanged", base_checksum(db_path) == before,
                        "checksum of every table before == after"))

    # report
    table = Table(title="sqlrl foundation: session layer on the embedded default")
    table.add_column("check")
    table.add_column("result")
    table.add_column("detail")
    for c in checks:
        table.add_row(c.name, "[green]pass" if c.passed else "[red]FAIL", c.detail)
    console.print(table)
    report = {"database": str(db_path), "checks": [asdict(c) for c in checks], "pool_stats": pool_stats}
    (out / "report.json").write_text(json.dumps(report, indent=2))
    console.print(f"Report written to {out / 'report.json'}")
    return 0 if all(c.passed for c in checks) else 1


if __name__ == "__main__":
    from jobs.stop import exit_on_sigterm

    exit_on_sigterm()  # SIGTERM unwinds through finally: engines and sessions closed
    sys.exit(main())
