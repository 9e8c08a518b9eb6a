"""Per-query cost of two sqlrl versions, paired in ONE process on the same server.

    python bench/sessions_pair.py --old /path/to/old/checkout [--engine postgresql|mysql] [--rounds 20] [--dbs concert_singer,sakila_1]

The old checkout's ``sqlrl/db`` is copied into a temporary folder as the package ``sqlrl_old``
(its module-name strings rewritten), so both versions run side by side: each loads its own base
(``pair_old_<db>`` / ``pair_new_<db>``) with its own loader and opens its own session. Per Spider
gold query (the database's distinct ones that run on PostgreSQL), ``--rounds`` rounds; in every
round, in an order drawn afresh per round (``--seed``), it times:

- ``raw_old`` / ``raw_new``: the raw driver call (``cursor.execute`` + ``fetchall``) on the old /
  new session's own connection;
- ``old`` / ``new``: ``session.execute`` of that version;
- ``text_old`` / ``text_new`` (``--texts``): exactly the text each version's adapter sends for a
  streamed query (``BEGIN; DECLARE …; FETCH``, with and without the row-size wrapper), sent raw on
  the NEW session's connection, each followed by its ``COMMIT`` (as the next call's prelude would).

With ``--tables``, the queries are ``SELECT * FROM <table>`` for every table of the database
instead (results of every size up to the row cap; the gold queries mostly return a few rows).
With ``--leases N``, session open+close is paired too (``pair_leases``): N rounds with a
prepared clone ready ("lease", the hot path), then N/4 (at least 5) with none ready ("cold": the
clone is made on the spot), each version once per round in a drawn order.

"added" = ``session.execute`` minus the raw call on the same connection (per round), and every
new-vs-old figure is the median over (query, round) pairs of the per-round difference
(``ratio_new_over_old``: of the per-round ratio ``new / old``).
Every step starts on an idle connection: a streamed result's block that the previous step left
open is ended untimed first, so no step pays (or skips) another's ``COMMIT``, and a raw call
never runs inside another statement's block. With ``--distinct``, every call's text is made
unique (a comment with a counter is appended), so nothing keyed by SQL text can be reused between
rounds. Prints a table and writes JSON (``--out``).
Needs SQLRL_PG_ADMIN_URL (``--engine mysql``: SQLRL_MYSQL_ADMIN_URL; scripts/dbservers.sh). On
MariaDB/MySQL there is no streamed text to send raw (``--texts`` is PostgreSQL's), no per-step
settling (a session's connection is idle between calls) and no server CPU column (the server's
connections are threads of one process). Not a test: numbers depend on the machine.
The two sessions differ even with the same code (their backends, their clones): run it once with
``--old`` naming a copy of this checkout (``git archive HEAD sqlrl | tar -x -C <dir>``) to see
that bias on the machine at hand; on 2026-12-03 it was -7 / -4 µs per call (ratio 0.98-0.99),
and the CPU columns moved by up to ±35 µs (server) and +7-11 µs (client) with no code change.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import itertools
import json
import os
import random
import re
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psycopg2
import psycopg2.extensions
import sqlglot

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sqlrl.db import open_session  # noqa: E402
from sqlrl.db.dialects.descriptor import dialect_of, dialects  # noqa: E402
from sqlrl.db.provisioning.loader import load_sqlite  # noqa: E402
from sqlrl.db.provisioning.scratch import SCRATCH  # noqa: E402
from sqlrl.db.url import parse_url  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sessions import gold_queries, raw_call  # noqa: E402

_COUNTER = itertools.count()


def import_old(checkout: Path) -> object:
    """The old checkout's ``sqlrl`` as the package ``sqlrl_old`` (its ``db`` subpackage only)."""
    tmp = Path(tempfile.mkdtemp(prefix="sqlrl-old-"))
    pkg = tmp / "sqlrl_old"
    shutil.copytree(checkout / "sqlrl" / "db", pkg / "db")
    (pkg / "__init__.py").write_text('"""97f75fb-style old sqlrl, for pairing only."""\n')
    for path in pkg.rglob("*.py"):
        text = path.read_text()
        new = re.sub(r"\bsqlrl\.db\b", "sqlrl_old.db", text)
        if new != text:
            path.write_text(new)
    sys.path.insert(0, str(tmp))
    return importlib.import_module("sqlrl_old.db")


def streamed_texts(sql: str, max_bytes: int) -> tuple[str, str]:
    """The text 97f75fb's adapter sends for a streamed query, and this version's (with the
    row-size wrapper), both for a call's first statement (no prelude)."""
    from sqlrl.db.dialects import postgresql as pg
    old = (f"BEGIN; DECLARE {pg._CURSOR} NO SCROLL CURSOR FOR\n{sql}\n"
           f";FETCH FORWARD {pg.FIRST_BATCH_ROWS} FROM {pg._CURSOR}")
    new = pg.streamed_text(sql, pg.row_cap(max_bytes), pg.FIRST_BATCH_ROWS)
    return old, new


def send_text(conn, text: str) -> None:
    """``text``, its rows read, then the ``COMMIT`` that ends its block (the connection must be
    idle: ``settle``)."""
    cur = conn.cursor()
    cur.execute(text)
    cur.fetchall()
    cur.close()
    cur = conn.cursor()
    cur.execute("COMMIT")
    cur.close()


def server_cpu_ns(conn) -> int:
    """CPU time the connection's backend has used (ns, ``/proc/<pid>/schedstat``); 0 when the
    server is not on this machine or not readable."""
    pid = backend_pid(conn)
    if pid is None:
        return 0
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError):
        return 0


def backend_pid(conn) -> int | None:
    """The process that serves ``conn`` on the server, when the driver says (psycopg2)."""
    return conn.info.backend_pid if isinstance(conn, psycopg2.extensions.connection) else None


def in_block(conn) -> bool:
    """Whether ``conn`` is inside a transaction block (a streamed result's, on psycopg2)."""
    return (isinstance(conn, psycopg2.extensions.connection)
            and conn.info.transaction_status != psycopg2.extensions.TRANSACTION_STATUS_IDLE)


def settle(conn) -> None:
    """End a streamed result's block left open on ``conn`` (untimed)."""
    if in_block(conn):
        cur = conn.cursor()
        cur.execute("COMMIT")
        cur.close()


def old_module(name: str):
    """``sqlrl_old.db.<name>``, which was ``sqlrl/db/<name>`` before the contracts issue moved it
    to ``sqlrl/db/provisioning/``."""
    try:
        return importlib.import_module(f"sqlrl_old.db.provisioning.{name}")
    except ModuleNotFoundError:
        return importlib.import_module(f"sqlrl_old.db.{name}")


def load_pair(admin: str, spider: Path, db_id: str) -> tuple[str, str]:
    """The database loaded once by each version: (new session URL, old session URL)."""
    sqlite = str(spider / "database" / db_id / f"{db_id}.sqlite")
    # the new loader first: its prepare_server takes sqlrl_owner away from old-style session roles
    new_url = load_sqlite(sqlite, admin, f"pair_new_{db_id}", replace=True).session_url
    old_url = old_module("loader").load_sqlite(
        sqlite, admin, f"pair_old_{db_id}", replace=True).session_url
    return new_url, old_url


def pair_leases(old_db, new_url: str, old_url: str, rounds: int, seed: int) -> dict:
    """Session open+close of the two versions, paired per round in a drawn order: "lease" with a
    prepared clone ready (the hot path), then "cold" with none ready (the clone is made on the
    spot: its database, role and connection, and since issue 46 the ownership hand-over). Both
    versions' background work is settled before every timed step."""
    new_scratch, old_scratch = SCRATCH, old_module("scratch").SCRATCH
    scratches = {"new": (new_scratch, new_url, open_session),
                 "old": (old_scratch, old_url, old_db.open_session)}

    def settle_all() -> None:
        new_scratch.settle()
        old_scratch.settle()

    order = random.Random(seed)
    per_round: dict[str, list[float]] = {}
    for phase in ("lease", "cold"):
        for scratch, url, opener in scratches.values():
            scratch.configure(prefill=1 if phase == "lease" else 0)
            for _ in range(2):
                opener(url).close()  # a base taken twice gets clones ahead
        for _ in range(rounds if phase == "lease" else max(5, rounds // 4)):
            got = {}
            for name in order.sample(list(scratches), 2):
                scratch, url, opener = scratches[name]
                settle_all()
                if phase == "cold":
                    scratch.forget(url, parse_url(url).database)  # nothing ready
                t0 = time.perf_counter()
                opener(url).close()
                got[name] = (time.perf_counter() - t0) * 1e3
            for name, ms in got.items():
                per_round.setdefault(f"{phase}_{name}", []).append(ms)
            per_round.setdefault(f"{phase}_ratio_new_over_old", []).append(got["new"] / got["old"])
    for scratch, _, _ in scratches.values():
        scratch.configure(prefill=2)
    settle_all()
    out = {(k if "ratio" in k else f"{k}_ms"): statistics.median(v) for k, v in per_round.items()}
    out["lease_rounds"], out["cold_rounds"] = len(per_round["lease_new"]), len(per_round["cold_new"])
    return out


def table_queries(spider: Path, db_id: str) -> list[str]:
    """``SELECT * FROM <table>`` for every table of the database: results of every size (the
    row cap is 10,000), where the gold queries are mostly a few rows."""
    path = spider / "database" / db_id / f"{db_id}.sqlite"
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
        names = [r[0] for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' "
            "ORDER BY name")]
    return [f'SELECT * FROM "{name}"' for name in names]


def pair(old_db, new_url: str, old_url: str, spider: Path, db_id: str, rounds: int, texts: bool,
         distinct: bool, seed: int, engine: str = "postgresql", tables: bool = False) -> dict:
    new_s, old_s = open_session(new_url), old_db.open_session(old_url)
    new_c, old_c = new_s._conn, old_s._conn
    max_bytes = new_s.limits.max_bytes
    write = dialect_of(engine).sqlglot
    samples: dict[str, list[float]] = {}
    per_round: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}  # client thread CPU and backend CPU per step
    per_query: list[dict] = []  # each query's own medians (what --tables reports)
    used = 0
    order = random.Random(seed)  # a fresh order every round: no step always follows the same one
    try:
        for q in (table_queries(spider, db_id) if tables else gold_queries(spider, db_id)):
            sql = sqlglot.transpile(q, read="sqlite", write=write)[0]
            r_new, r_old = new_s.execute(sql), old_s.execute(sql)
            if not (r_new.ok and r_old.ok):
                continue
            used += 1
            # a cursor block was left open (PostgreSQL's streamed query)
            streamed = in_block(new_c)
            new_s.execute("SELECT 1")
            old_s.execute("SELECT 1")

            def tag(text: str) -> str:
                return f"{text}\n-- {next(_COUNTER)}" if distinct else text

            def t_raw_old():
                raw_call(old_c, tag(sql))

            def t_raw_new():
                raw_call(new_c, tag(sql))

            def t_old():
                old_s.execute(tag(sql))

            def t_new():
                new_s.execute(tag(sql))

            steps = [("raw_old", t_raw_old), ("old", t_old), ("raw_new", t_raw_new), ("new", t_new)]
            if texts and streamed:  # the texts are sent only on an idle connection
                text_old, text_new = streamed_texts(sql, max_bytes)
                steps += [("text_old", lambda: send_text(new_c, text_old)),
                          ("text_new", lambda: send_text(new_c, text_new))]
            mine: dict[str, list[float]] = {"ratio": [], "diff": []}
            for rnd in range(rounds):
                got: dict[str, float] = {}
                for name, fn in order.sample(steps, len(steps)):
                    conn = old_c if name in ("old", "raw_old") else new_c
                    settle(conn)  # every step starts idle: none pays another's COMMIT
                    s0 = server_cpu_ns(conn)
                    c0 = time.thread_time()
                    t0 = time.perf_counter()
                    fn()
                    got[name] = (time.perf_counter() - t0) * 1e6
                    cpu.setdefault(f"client_{name}", []).append((time.thread_time() - c0) * 1e6)
                    if backend_pid(conn) is not None:  # a server process per connection
                        cpu.setdefault(f"server_{name}", []).append(
                            (server_cpu_ns(conn) - s0) / 1e3)
                for name, us in got.items():
                    samples.setdefault(name, []).append(us)
                per_round.setdefault("added_old", []).append(got["old"] - got["raw_old"])
                per_round.setdefault("added_new", []).append(got["new"] - got["raw_new"])
                per_round.setdefault("new_minus_old", []).append(got["new"] - got["old"])
                per_round.setdefault("added_new_minus_old", []).append(
                    (got["new"] - got["raw_new"]) - (got["old"] - got["raw_old"]))
                per_round.setdefault("raw_new_minus_old", []).append(got["raw_new"] - got["raw_old"])
                per_round.setdefault("ratio_new_over_old", []).append(got["new"] / got["old"])
                mine["ratio"].append(got["new"] / got["old"])
                mine["diff"].append(got["new"] - got["old"])
                if "text_new" in got:
                    per_round.setdefault("text_new_minus_old", []).append(
                        got["text_new"] - got["text_old"])
            per_query.append({"sql": sql, "rows": r_new.row_count, "truncated": r_new.truncated,
                              "ratio_new_over_old": statistics.median(mine["ratio"]),
                              "new_minus_old_us": statistics.median(mine["diff"])})
    finally:
        new_s.close()
        old_s.close()
    out = {"engine": engine, "db": db_id, "queries": used, "rounds": rounds, "distinct": distinct,
           "per_query": per_query}
    out.update({f"{k}_us": statistics.median(v) for k, v in samples.items()})
    out.update({(k if k.startswith("ratio") else f"{k}_us"): statistics.median(v)
                for k, v in per_round.items()})
    out.update({f"cpu_{k}_us": statistics.median(v) for k, v in cpu.items()})
    for side in ("client", "server"):  # paired per round: new minus old
        for a, b in (("new", "old"), ("raw_new", "raw_old"), ("text_new", "text_old")):
            if f"{side}_{a}" in cpu:
                out[f"cpu_{side}_{a}_minus_{b}_us"] = statistics.median(
                    x - y for x, y in zip(cpu[f"{side}_{a}"], cpu[f"{side}_{b}"]))
    out["pairs"] = len(per_round["added_old"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--old", required=True, help="checkout of the old version (e.g. a worktree at 97f75fb)")
    ap.add_argument("--engine", default="postgresql",
                    choices=[d.name for d in dialects() if d.verified and d.admin_url_env])
    ap.add_argument("--spider", default=str(ROOT.parent / "shared" / "data" / "spider"))
    ap.add_argument("--dbs", default="concert_singer,sakila_1")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--texts", action="store_true", help="also time the two streamed texts raw")
    ap.add_argument("--distinct", action="store_true", help="a unique SQL text on every call")
    ap.add_argument("--seed", type=int, default=0, help="seeds the per-round order of the steps")
    ap.add_argument("--tables", action="store_true",
                    help="time SELECT * of every table (results of every size) instead of the gold queries")
    ap.add_argument("--leases", type=int, default=0,
                    help="also pair session open+close (ready clone, then none ready) in this many rounds")
    ap.add_argument("--out", default="/tmp/sessions_pair.json")
    args = ap.parse_args()
    env = dialect_of(args.engine).admin_url_env
    admin = os.environ.get(env)
    if not admin:
        sys.exit(f"{env} is not set (scripts/dbservers.sh start; source its env.sh)")
    old_db = import_old(Path(args.old))
    rows = []
    for db in args.dbs.split(","):
        new_url, old_url = load_pair(admin, Path(args.spider), db)
        row = pair(old_db, new_url, old_url, Path(args.spider), db, args.rounds, args.texts, args.distinct,
                   args.seed, args.engine, args.tables)
        if args.leases:
            row.update(pair_leases(old_db, new_url, old_url, args.leases, args.seed))
        rows.append(row)
    keys = ["raw_old_us", "old_us", "raw_new_us", "new_us", "added_old_us", "added_new_us",
            "added_new_minus_old_us", "new_minus_old_us", "ratio_new_over_old",
            "raw_new_minus_old_us",
            "text_new_minus_old_us", "cpu_client_old_us", "cpu_client_new_us",
            "cpu_client_new_minus_old_us", "cpu_server_old_us", "cpu_server_new_us",
            "cpu_server_new_minus_old_us", "cpu_server_raw_new_minus_raw_old_us",
            "cpu_server_text_new_minus_text_old_us", "cpu_client_text_new_minus_text_old_us"]
    print(f"{args.engine}: µs, medians (differences and the ratio: of per-round pairs); "
          f"load {os.getloadavg()}")
    for k in keys:
        fmt = "8.3f" if k.startswith("ratio") else "8.1f"
        print(f"{k.removesuffix('_us'):45s} "
              + "  ".join(f"{r[k]:{fmt}}" if k in r else "       –" for r in rows))
    print(f"{'queries / pairs':45s} " + "  ".join(f"{r['queries']}/{r['pairs']}" for r in rows))
    if args.tables:  # results of every size: each query on its own line
        print("per query (rows returned, truncated): new - old µs, ratio new / old")
        for r in rows:
            for q in sorted(r["per_query"], key=lambda q: q["rows"]):
                print(f"  {r['db']:16s} {q['sql'][:40]:40s} {q['rows']:6d}{'+' if q['truncated'] else ' '}"
                      f" {q['new_minus_old_us']:+10.1f} {q['ratio_new_over_old']:7.3f}")
    if args.leases:
        print("ms, medians (the ratio: of per-round pairs)")
        for k in ("lease_old_ms", "lease_new_ms", "lease_ratio_new_over_old",
                  "cold_old_ms", "cold_new_ms", "cold_ratio_new_over_old"):
            print(f"{k.removesuffix('_ms'):45s} " + "  ".join(f"{r[k]:8.3f}" for r in rows))
        print(f"{'rounds (lease / cold)':45s} "
              + "  ".join(f"{r['lease_rounds']}/{r['cold_rounds']}" for r in rows))
    Path(args.out).write_text(json.dumps({"rows": rows, "load": os.getloadavg()}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
