"""Where the PostgreSQL row-size check's server CPU goes: its text taken apart, paired per round.

    python bench/pg_row_check.py [--spider ../shared/data/spider] [--dbs concert_singer,sakila_1] [--rounds 10]

Each Spider gold query of a database (the distinct ones that run on PostgreSQL and have no OFFSET
of their own) is sent raw, on one session's connection, in these forms -- each its cursor's
``BEGIN; DECLARE …; FETCH 16`` and then the ``COMMIT`` that ends the block, as ``execute`` sends
them:

- ``bare``: the cursor over the query itself (97f75fb's text, before issue 46);
- ``barrier``: the query behind ``SELECT * FROM (… OFFSET 0) sqlrl_r``, no check;
- ``barrier + constant qual``: the same with a WHERE that computes nothing from the row;
- ``row text length``: the WHERE measures the row's text (``octet_length((sqlrl_r.*)::text)``), no
  overflow arm;
- ``check, function call``: the check spelled as ``pg_catalog.int48pl(…)``;
- ``check, unqualified``: the check without ``pg_catalog.`` names (unsafe: a session's own
  functions could be called; here only for its cost);
- ``check (sqlrl)``: what ``postgresql_wrap.streamed_text`` sends.

Every round sends every form of a query once in an order drawn afresh (``--seed``), each after one
untimed warm-up, and reads the backend's CPU time (``/proc/<pid>/schedstat``: the server must be
on this machine) around it; reported is the median over (query, round) pairs of the per-round
difference to ``bare``. Prints a table and writes JSON. Needs SQLRL_PG_ADMIN_URL
(scripts/dbservers.sh). Not a test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
from pathlib import Path

import sqlglot

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from sqlrl.db import open_session  # noqa: E402
from sqlrl.db.dialects import postgresql as pg  # noqa: E402
from sqlrl.db.dialects.postgresql_lex import has_offset  # noqa: E402
from sqlrl.db.provisioning.loader import load_sqlite  # noqa: E402
from sessions import gold_queries  # noqa: E402
from sessions_pair import send_text, server_cpu_ns, settle  # noqa: E402

_I8_MAX = 2**63 - 1


def forms(sql: str, max_bytes: int) -> dict[str, str]:
    """The texts compared for one query (module doc)."""
    slack = _I8_MAX - max_bytes
    cursor, fetch = f"BEGIN; DECLARE {pg._CURSOR} NO SCROLL CURSOR FOR", \
        f";FETCH FORWARD {pg.FIRST_BATCH_ROWS} FROM {pg._CURSOR}"

    def wrapped(where: str) -> str:
        return f"{cursor} SELECT * FROM (\n{sql}\nOFFSET 0) sqlrl_r {where}{fetch}"

    row = "pg_catalog.octet_length((sqlrl_r.*)::pg_catalog.text)"
    return {
        "bare": f"{cursor}\n{sql}\n{fetch}",
        "barrier": wrapped(""),
        "barrier + constant qual": wrapped(f"WHERE (1 OPERATOR(pg_catalog.+) {slack}) IS NOT NULL"),
        "row text length": wrapped(f"WHERE {row} IS NOT NULL"),
        "check, function call": wrapped(f"WHERE pg_catalog.int48pl({row}, {slack}) IS NOT NULL"),
        "check, unqualified": wrapped(f"WHERE (octet_length((sqlrl_r.*)::text) + {slack}) IS NOT NULL"),
        "check (sqlrl)": pg.streamed_text(sql, pg.row_cap(max_bytes), pg.FIRST_BATCH_ROWS),
    }


def measure(admin: str, spider: Path, db_id: str, rounds: int, seed: int) -> dict:
    sqlite = str(spider / "database" / db_id / f"{db_id}.sqlite")
    url = load_sqlite(sqlite, admin, f"rowcheck_{db_id}", replace=True).session_url
    session = open_session(url)
    conn = session._conn  # the session's own login: what its queries run as
    order = random.Random(seed)
    diffs: dict[str, list[float]] = {}
    used = 0
    try:
        for q in gold_queries(spider, db_id):
            sql = sqlglot.transpile(q, read="sqlite", write="postgres")[0]
            if has_offset(sql) or not session.execute(sql).ok:
                continue
            texts = forms(sql, session.limits.max_bytes)
            settle(conn)
            used += 1
            for _ in range(rounds):
                got = {}
                for name in order.sample(list(texts), len(texts)):
                    send_text(conn, texts[name])  # warm-up
                    before = server_cpu_ns(conn)
                    send_text(conn, texts[name])
                    got[name] = (server_cpu_ns(conn) - before) / 1e3
                for name, us in got.items():
                    diffs.setdefault(name, []).append(us - got["bare"])
    finally:
        session.close()
    return {"db": db_id, "queries": used, "rounds": rounds,
            "vs_bare_us": {name: statistics.median(diffs[name]) for name in forms("SELECT 1", 1)}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spider", default=str(ROOT.parent / "shared" / "data" / "spider"))
    ap.add_argument("--dbs", default="concert_singer,sakila_1")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="/tmp/pg_row_check.json")
    args = ap.parse_args()
    admin = os.environ.get("SQLRL_PG_ADMIN_URL")
    if not admin:
        sys.exit("SQLRL_PG_ADMIN_URL is not set (scripts/dbservers.sh start; source its env.sh)")
    spider = Path(args.spider)
    if not (spider / "database").is_dir():
        sys.exit(f"Spider not found at {spider}: pass --spider PATH")
    rows = [measure(admin, spider, db, args.rounds, args.seed) for db in args.dbs.split(",")]
    if not any(v for r in rows for v in r["vs_bare_us"].values()):
        print("note: every difference is 0: is the server on another machine? (no schedstat)")
    print(f"server CPU over the bare cursor, µs (median of per-round differences); "
          f"load {os.getloadavg()}")
    print(f"{'form':28s} " + "  ".join(f"{r['db']:>16s}" for r in rows))
    for name in rows[0]["vs_bare_us"]:
        print(f"{name:28s} " + "  ".join(f"{r['vs_bare_us'][name]:+16.1f}" for r in rows))
    print(f"{'queries x rounds':28s} " + "  ".join(f"{r['queries']:>11d} x {r['rounds']:2d}"
                                                   for r in rows))
    Path(args.out).write_text(json.dumps({"rows": rows, "load": os.getloadavg()}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
