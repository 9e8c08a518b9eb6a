"""The gateway under a hostile client, part 3: the same attacks on rollout sessions that are
PostgreSQL / MariaDB clones (docs/gateway.md "Attacks tried"): a burst of concurrent statements on
ONE rollout's server session is serialised (each gets its own answer; a server connection used by
two threads at once would mix their results), and SQL with a NUL byte (each server reads it its
own way) or that tries to leave the clone is an observation, never a 500."""

from __future__ import annotations

import concurrent.futures

import pytest

from sqlrl.policy.scripted import ScriptedEngine

from .conftest import GOLD, SCRIPT, gateway, shop_task
from .test_gw_sql_servers import server_shop  # noqa: F401  (the module-scoped server fixture)

FILE_READ = {"postgresql": "SELECT pg_read_file('/etc/passwd')", "mysql": "SELECT LOAD_FILE('/etc/passwd')"}


@pytest.mark.slow
def test_a_burst_of_statements_on_one_server_session_and_sql_the_server_refuses(tiny, server_shop):  # noqa: F811
    dialect, admin, catalog = server_shop
    engine = ScriptedEngine(tiny.tokenizer, tiny.eos_token_ids, script=SCRIPT)
    with gateway(tiny, engine, catalog) as gw:
        gw.rollouts.offer("g", shop_task(dialect=dialect), 2)
        rid = gw.claim()["rollout_id"]
        path = f"/v1/rollouts/{rid}/sql"
        with concurrent.futures.ThreadPoolExecutor(20) as pool:
            answers = list(pool.map(lambda i: gw.post(path, {"sql": f"SELECT {i} AS n"}), range(40)))
        assert [a.json() for a in answers] == [{"observation": f"n\n{i}\n(1 row)", "is_error": False}
                                               for i in range(40)]
        for sql in ("SELECT 1\x00", "SELECT 'a\x00b' AS s", FILE_READ[dialect]):
            r = gw.post(path, {"sql": sql})
            assert r.status_code == 200 and "root:" not in r.json()["observation"], (sql, r.text)
        assert gw.post(path, {"sql": GOLD}).json()["observation"].endswith("\n60\n(1 row)")
        # each server decides what a NUL byte means, and the Judge scores what it ran: PostgreSQL cuts
        # the text there (a syntax error: 0), MariaDB takes the query before it (the gold's answer: 1)
        nul = gw.post(f"/v1/rollouts/{gw.claim()['rollout_id']}/complete",
                      {"sql": "SELECT count(*) FROM customers\x00"})
        assert nul.status_code == 200 and nul.json()["reward"] == {"postgresql": 0.0, "mysql": 1.0}[dialect]
        assert gw.post(f"/v1/rollouts/{rid}/complete", {"sql": GOLD}).json()["reward"] == 1.0
        assert gw.pool.stats().in_use == 0
