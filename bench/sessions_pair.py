"""PostgreSQL per-query cost of two sqlrl versions, paired in ONE process on the same server.

    python bench/sessions_pair.py --old /path/to/old/checkout [--rounds 20] [--dbs concert_singer,sakila_1]

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

"added" = ``session.execute`` minus the raw call on the same connection (per round), and every
new-vs-old figure is the median over (query, round) pairs of the per-round difference
(``ratio_new_over_old``: of the per-round ratio ``new / old``).
Every step starts on an idle connection: a streamed result's block that the previous step left
open is ended untimed first, so no step pays (or skips) another's ``COMMIT``, and a raw call
never runs inside another statement's block. With ``--distinct``, every call's text is made
unique (a comment with a counter is appended), so nothing keyed by SQL text can be reused between
rounds. Prints a table and writes JSON (``--out``).
Needs SQLRL_PG_ADMIN_URL (scripts/dbservers.sh). Not a test: numbers depend on the machine.
The two sessions differ even with the same code (their backends, their clones): run it once with
``--old`` naming a copy of this checkout (``git archive HEAD sqlrl | tar -x -C <dir>``) to see
that bias on the machine at hand; on 2026-12-03 it was -7 / -4 µs per call (ratio 0.98-0.99),
and the CPU columns moved by up to ±35 µs (server) and +7-11 µs (client) with no code change.
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import json
import os
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import sqlglot

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sqlrl.db import open_session  # noqa: E402
from sqlrl.db.provisioning.loader import load_sqlite  # noqa: E402

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
    try:
        with open(f"/proc/{conn.info.backend_pid}/schedstat") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError):
        return 0


def settle(conn) -> None:
    """End a streamed result's block left open on ``conn`` (untimed)."""
    if conn.info.transaction_status != 0:
        cur = conn.cursor()
        cur.execute("COMMIT")
        cur.close()


def pair(old_db, admin: str, spider: Path, db_id: str, rounds: int, texts: bool,
         distinct: bool, seed: int) -> dict:
    sqlite = str(spider / "database" / db_id / f"{db_id}.sqlite")
    # the new loader first: its prepare_server takes sqlrl_owner away from old-style session roles
    new_url = load_sqlite(sqlite, admin, f"pair_new_{db_id}", replace=True).session_url
    try:  # the loader's place: sqlrl/db/ before the contracts issue, sqlrl/db/provisioning/ since
        old_loader = importlib.import_module("sqlrl_old.db.provisioning.loader")
    except ModuleNotFoundError:
        old_loader = importlib.import_module("sqlrl_old.db.loader")
    old_url = old_loader.load_sqlite(sqlite, admin, f"pair_old_{db_id}", replace=True).session_url
    new_s, old_s = open_session(new_url), old_db.open_session(old_url)
    new_c, old_c = new_s._conn, old_s._conn
    max_bytes = new_s.limits.max_bytes
    samples: dict[str, list[float]] = {}
    per_round: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}  # client thread CPU and backend CPU per step
    used = 0
    order = random.Random(seed)  # a fresh order every round: no step always follows the same one
    try:
        for q in gold_queries(spider, db_id):
            sql = sqlglot.transpile(q, read="sqlite", write="postgres")[0]
            r_new, r_old = new_s.execute(sql), old_s.execute(sql)
            if not (r_new.ok and r_old.ok):
                continue
            used += 1
            text_old, text_new = streamed_texts(sql, max_bytes)
            streamed = new_c.info.transaction_status != 0  # a cursor block was left open
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
                steps += [("text_old", lambda: send_text(new_c, text_old)),
                          ("text_new", lambda: send_text(new_c, text_new))]
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
                    cpu.setdefault(f"server_{name}", []).append((server_cpu_ns(conn) - s0) / 1e3)
                for name, us in got.items():
                    samples.setdefault(name, []).append(us)
                per_round.setdefault("added_old", []).append(got["old"] - got["raw_old"])
                per_round.setdefault("added_new", []).append(got["new"] - got["raw_new"])
                per_round.setdefault("new_minus_old", []).append(got["new"] - got["old"])
                per_round.setdefault("added_new_minus_old", []).append(
                    (got["new"] - got["raw_new"]) - (got["old"] - got["raw_old"]))
                per_round.setdefault("raw_new_minus_old", []).append(got["raw_new"] - got["raw_old"])
                per_round.setdefault("ratio_new_over_old", []).append(got["new"] / got["old"])
                if "text_new" in got:
                    per_round.setdefault("text_new_minus_old", []).append(
                        got["text_new"] - got["text_old"])
    finally:
        new_s.close()
        old_s.close()
    out = {"db": db_id, "queries": used, "rounds": rounds, "distinct": distinct}
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
    ap.add_argument("--spider", default=str(ROOT.parent / "shared" / "data" / "spider"))
    ap.add_argument("--dbs", default="concert_singer,sakila_1")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--texts", action="store_true", help="also time the two streamed texts raw")
    ap.add_argument("--distinct", action="store_true", help="a unique SQL text on every call")
    ap.add_argument("--seed", type=int, default=0, help="seeds the per-round order of the steps")
    ap.add_argument("--out", default="/tmp/sessions_pair.json")
    args = ap.parse_args()
    admin = os.environ.get("SQLRL_PG_ADMIN_URL")
    if not admin:
        sys.exit("SQLRL_PG_ADMIN_URL is not set (scripts/dbservers.sh start; source its env.sh)")
    old_db = import_old(Path(args.old))
    rows = [pair(old_db, admin, Path(args.spider), db, args.rounds, args.texts, args.distinct,
                 args.seed)
            for db in args.dbs.split(",")]
    keys = ["raw_old_us", "old_us", "raw_new_us", "new_us", "added_old_us", "added_new_us",
            "added_new_minus_old_us", "new_minus_old_us", "ratio_new_over_old",
            "raw_new_minus_old_us",
            "text_new_minus_old_us", "cpu_client_old_us", "cpu_client_new_us",
            "cpu_client_new_minus_old_us", "cpu_server_old_us", "cpu_server_new_us",
            "cpu_server_new_minus_old_us", "cpu_server_raw_new_minus_raw_old_us",
            "cpu_server_text_new_minus_text_old_us", "cpu_client_text_new_minus_text_old_us"]
    print(f"µs, medians (differences and the ratio: of per-round pairs); load {os.getloadavg()}")
    for k in keys:
        fmt = "8.3f" if k.startswith("ratio") else "8.1f"
        print(f"{k.removesuffix('_us'):45s} "
              + "  ".join(f"{r[k]:{fmt}}" if k in r else "       –" for r in rows))
    print(f"{'queries / pairs':45s} " + "  ".join(f"{r['queries']}/{r['pairs']}" for r in rows))
    Path(args.out).write_text(json.dumps({"rows": rows, "load": os.getloadavg()}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
