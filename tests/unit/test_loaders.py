"""Benchmark loaders, schemas and the verl format.

Synthetic folders (built in tmp_path around the generated "shop" database) cover every error path;
tests marked ``spider`` read the real benchmark data in ../shared/data and skip when it is absent.
The real-data tests take ~5 s on the 2-core machine (every tables.json schema is executed).
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest

from sqlrl.db import open_session
from sqlrl.tasks.io import read_tasks, write_tasks
from sqlrl.tasks.loaders import (LOADERS, TaskSet, default_prompt, export_verl, load, load_bird,
                                 load_critic, load_jsonl, load_spider, load_verl)
from sqlrl.tasks.loaders.spider import spider_hardness
from sqlrl.tasks.schema import DatabaseSchema, quote_identifier, schemas_from_tables_json
from sqlrl.tasks.types import CriticTask, TaskError, Text2SQLTask
from tests.conftest import SHARED_DATA

SHOP_TABLES = {
    "db_id": "shop",
    "table_names_original": ["customers", "orders", "order"],
    "table_names": ["customers", "orders", "order"],
    "column_names_original": [[-1, "*"], [0, "customer_id"], [0, "name"], [1, "order_id"],
                              [1, "customer_id"], [1, "status"], [2, "Key"], [2, "group by"]],
    "column_names": [[-1, "*"], [0, "customer id"], [0, "customer name"], [1, "order id"],
                     [1, "customer id"], [1, "status"], [2, "key"], [2, "group by"]],
    "column_types": ["text", "number", "text", "number", "number", "text", "number", "others"],
    "primary_keys": [1, [3], [6, 7]],
    "foreign_keys": [[4, 1], [4, 1]],
}


def run_ddl(schema: DatabaseSchema) -> list[str]:
    """Execute the schema's CREATE TABLE statements in a fresh in-memory sqlrl session; return
    the tables that exist afterwards (asserting that no statement failed)."""
    with open_session("sqlite://") as s:
        for table in schema.tables:
            r = s.execute(table.to_create_sql("sqlite"))
            assert r.error is None, (schema.db_id, table.name, r.error)
        r = s.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY rowid")
        assert r.error is None
        return [row[0] for row in r.rows]


# -- schemas ---------------------------------------------------------------------------------------

def test_tables_json_schema_keys_types_and_quoting() -> None:
    schema = DatabaseSchema.from_tables_json(SHOP_TABLES)
    assert schema.table_names == ("customers", "orders", "order")
    orders = schema.table("ORDERS")
    assert orders.primary_key == ("order_id",)
    assert len(orders.foreign_keys) == 1  # the duplicated pair is kept once
    fk = orders.foreign_keys[0]
    assert (fk.columns, fk.ref_table, fk.ref_columns) == (("customer_id",), "customers", ("customer_id",))
    assert schema.table("order").primary_key == ("Key", "group by")
    assert schema.table("customers").column("name").description == "customer name"
    sql = schema.to_create_sql()
    assert 'CREATE TABLE "order" (' in sql and '"Key" NUMERIC' in sql and '"group by" TEXT' in sql
    assert "FOREIGN KEY (customer_id) REFERENCES customers (customer_id)" in sql
    assert sql.count("CREATE TABLE") == 3 and sql.count(";") == 3
    assert run_ddl(schema) == ["customers", "orders", "order"]
    assert "CREATE TABLE `order`" in schema.to_create_sql("mysql")
    assert "[group by]" in schema.to_create_sql("mssql")
    assert quote_identifier("plain_name", "postgresql") == "plain_name"
    assert quote_identifier('we"ird', "sqlite") == '"we""ird"'


@pytest.mark.parametrize("mutate, words", [
    (lambda e: e.pop("column_types"), ["shop", "column_types"]),
    (lambda e: e.update(foreign_keys=[[4, 99]]), ["shop", "column index 99"]),
    (lambda e: e.update(column_types=["text"]), ["shop", "column_types"]),
    (lambda e: e.pop("db_id"), ["db_id"]),
])
def test_malformed_tables_json_entry_names_database_and_field(mutate, words) -> None:
    entry = json.loads(json.dumps(SHOP_TABLES))
    mutate(entry)
    with pytest.raises(TaskError) as info:
        schemas_from_tables_json([SHOP_TABLES, entry], origin="tables.json")
    assert "tables.json[1]" in str(info.value)
    for w in words:
        assert w in str(info.value)


def test_live_sqlite_schema(demo_db_path: str) -> None:
    schema = DatabaseSchema.from_sqlite(demo_db_path, "shop")
    assert schema.table_names == ("customers", "products", "orders", "order_items")  # no view
    items = schema.table("order_items")
    assert items.primary_key == ("order_id", "product_id")
    assert {(f.columns, f.ref_table, f.ref_columns) for f in items.foreign_keys} == {
        (("order_id",), "orders", ("order_id",)), (("product_id",), "products", ("product_id",))}
    assert items.column("quantity").type == "INTEGER" and items.column("quantity").not_null
    assert run_ddl(schema) == list(schema.table_names)
    with pytest.raises(FileNotFoundError, match="missing.sqlite"):
        DatabaseSchema.from_sqlite(Path(demo_db_path).parent / "missing.sqlite")


# -- Spider layout ---------------------------------------------------------------------------------

@pytest.fixture()
def spider_root(tmp_path: Path, demo_db_path: str) -> Path:
    root = tmp_path / "spider"
    (root / "database" / "shop").mkdir(parents=True)
    (root / "database" / "ghost").mkdir()  # folder without its .sqlite file, like wta_1
    shutil.copy(demo_db_path, root / "database" / "shop" / "shop.sqlite")
    ghost = dict(SHOP_TABLES, db_id="ghost")
    (root / "tables.json").write_text(json.dumps([SHOP_TABLES, ghost]))
    dev = [{"db_id": "shop", "query": "SELECT count(*) FROM customers", "question": "How many customers?",
            "query_toks": ["SELECT"], "question_toks": ["How"]},
           {"db_id": "ghost", "query": "SELECT 1", "question": "Anything?"},
           {"db_id": "shop", "query": "SELECT count(*) FROM orders", "question": "How many orders?"},
           {"db_id": "ghost", "query": "SELECT 2", "question": "Anything else?"}]
    (root / "dev.json").write_text(json.dumps(dev))
    return root


def test_spider_loader_skips_and_counts_missing_databases(spider_root: Path) -> None:
    ts = load_spider(spider_root, "dev")
    assert isinstance(ts, TaskSet) and ts.source == "spider-dev"
    assert [t.task_id for t in ts.tasks] == ["spider-dev-0000", "spider-dev-0002"]
    assert ts.skipped == {"ghost": 2} and ts.n_skipped == 2
    assert set(ts.schemas) == {"shop"} and set(ts.catalog) == {"shop"}
    assert "query_toks" not in ts.tasks[0].meta and "question_toks" not in ts.tasks[0].meta
    # the catalog is a real Catalog whose URL runs the gold query through a session
    url, dialect = ts.to_catalog().resolve("shop", None)
    assert dialect == "sqlite"
    with open_session(url) as s:
        r = s.execute(ts.tasks[0].gold_sql)
        assert r.error is None and r.rows[0][0] == 60


def test_spider_loader_error_paths(spider_root: Path, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="Spider folder"):
        load_spider(tmp_path / "no_such_folder")
    with pytest.raises(ValueError, match="unknown Spider split 'test'"):
        load_spider(spider_root, "test")
    with pytest.raises(FileNotFoundError, match="train_spider.json or .*train_spider_syn.json"):
        load_spider(spider_root, "train")
    with pytest.raises(FileNotFoundError, match="database folder"):
        load_spider(spider_root, "dev", db_dirs=[tmp_path / "elsewhere"])

    records = json.loads((spider_root / "dev.json").read_text())
    del records[2]["query"]
    (spider_root / "dev.json").write_text(json.dumps(records))
    with pytest.raises(TaskError, match=r"dev.json\[2\]: gold_sql"):
        load_spider(spider_root, "dev")
    (spider_root / "dev.json").write_text(json.dumps({"not": "a list"}))
    with pytest.raises(TaskError, match="expected a JSON list"):
        load_spider(spider_root, "dev")
    (spider_root / "dev.json").write_text("[{")
    with pytest.raises(TaskError, match="dev.json: not valid JSON"):
        load_spider(spider_root, "dev")
    (spider_root / "tables.json").unlink()
    with pytest.raises(FileNotFoundError, match="tables.json"):
        load_spider(spider_root, "dev")


def test_extra_database_folders_are_searched_after_the_root(spider_root: Path, tmp_path: Path,
                                                           demo_db_path: str) -> None:
    extra = tmp_path / "more_dbs"
    (extra / "ghost").mkdir(parents=True)
    shutil.copy(demo_db_path, extra / "ghost" / "ghost.sqlite")
    ts = load_spider(spider_root, "dev", db_dirs=[extra])
    assert len(ts) == 4 and ts.skipped == {}
    assert ts.catalog["ghost"]["sqlite"].endswith("more_dbs/ghost/ghost.sqlite")


def test_spider_hardness_rule_on_handmade_parses() -> None:
    def sql(**kw):
        base = {"select": [False, [[0, [0, [0, 1, False], None]]]],
                "from": {"table_units": [["table_unit", 0]], "conds": []},
                "where": [], "groupBy": [], "having": [], "orderBy": [], "limit": None,
                "intersect": None, "union": None, "except": None}
        base.update(kw)
        return base
    assert spider_hardness(sql()) == "easy"
    cond = [False, 2, [0, [0, 1, False], None], 1.0, None]
    assert spider_hardness(sql(where=[cond, "and", cond])) == "medium"  # >1 where condition
    assert spider_hardness(sql(union=sql())) == "hard"  # one nested query, nothing else
    assert spider_hardness(sql(union=sql(), where=[cond, "or", cond])) == "extra"


# -- BIRD -------------------------------------------------------------------------------------------

def bird_records() -> list[dict]:
    return [{"question_id": 7, "db_id": "shop", "question": "How many customers?", "evidence": "",
             "SQL": "SELECT count(*) FROM customers", "difficulty": "simple"},
            {"question_id": 8, "db_id": "ghost", "question": "Anything?", "evidence": "e",
             "SQL": "SELECT 1", "difficulty": "challenging"}]


def test_bird_loader_dialect_from_name_and_optional_db_root(tmp_path: Path, demo_db_path: str) -> None:
    for flavour in ("sqlite", "mysql", "postgresql"):
        (tmp_path / f"mini_dev_{flavour}.json").write_text(json.dumps(bird_records()))
    (tmp_path / "dev_tables.json").write_text(json.dumps([SHOP_TABLES]))
    ts = load_bird(tmp_path / "mini_dev_mysql.json")
    assert [t.dialect for t in ts.tasks] == ["mysql", "mysql"] and ts.catalog == {}
    assert [t.task_id for t in ts.tasks] == ["7", "8"] and ts.tasks[1].difficulty == "challenging"
    assert set(ts.schemas) == {"shop"}
    assert load_bird(tmp_path / "mini_dev_mysql.json", dialect="sqlite").tasks[0].dialect == "sqlite"
    with pytest.raises(TaskError, match="dialect 'db2'"):
        load_bird(tmp_path / "mini_dev_sqlite.json", dialect="db2")

    db_root = tmp_path / "dev_databases"
    (db_root / "shop").mkdir(parents=True)
    shutil.copy(demo_db_path, db_root / "shop" / "shop.sqlite")
    lite = load_bird(tmp_path / "mini_dev_sqlite.json", db_root)
    assert [t.task_id for t in lite.tasks] == ["7"] and lite.skipped == {"ghost": 1}
    assert set(lite.catalog) == {"shop"}
    pg = load_bird(tmp_path / "mini_dev_postgresql.json", db_root)  # server flavour: nothing skipped
    assert len(pg) == 2 and pg.skipped == {} and set(pg.catalog) == {"shop"}

    with pytest.raises(FileNotFoundError, match="BIRD database folder"):
        load_bird(tmp_path / "mini_dev_sqlite.json", tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="BIRD questions file"):
        load_bird(tmp_path / "mini_dev_oracle.json")
    bad = bird_records()
    bad[1]["question"] = ""
    (tmp_path / "mini_dev_sqlite.json").write_text(json.dumps(bad))
    with pytest.raises(TaskError, match=r"mini_dev_sqlite.json\[1\]: question"):
        load_bird(tmp_path / "mini_dev_sqlite.json")


# -- BIRD-CRITIC ------------------------------------------------------------------------------------

def critic_lines() -> list[dict]:
    return [
        {"instance_id": 1, "db_id": "shop", "dialect": "SQLite", "query": "Duplicates!",
         "issue_sql": ["SELECT city FROM customers"], "sol_sql": ["SELECT DISTINCT city FROM customers"],
         "preprocess_sql": [], "clean_up_sql": [], "test_cases": [], "category": "Query",
         "efficiency": False, "conditions": {"order": False}},
        # the first release's spelling: selected_database / error_sql; no dialect field
        {"instance_id": "2_1", "selected_database": "ghost", "query": "Why does this fail?",
         "error_sql": ["SELEC 1"], "sol_sql": ["SELECT 1"], "test_cases": []},
    ]


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return path


def test_critic_loader_merges_schema_files_and_aliases(tmp_path: Path, demo_db_path: str) -> None:
    data = write_jsonl(tmp_path / "critic.jsonl", critic_lines())
    schema = write_jsonl(tmp_path / "schema.jsonl", [
        {"instance_id": 1, "original_schema": "CREATE TABLE customers (…)", "preprocess_schema": "P",
         "dialect": "PostgreSQL"},  # the instance's own fields win over the schema record's
        {"db_id": "ghost", "original_schema": "CREATE TABLE ghost (…)"}])
    ts = load_critic(data, schema, dialect="postgresql")
    a, b = ts.tasks
    assert isinstance(a, CriticTask) and a.instance_id == "1" and a.dialect == "sqlite"
    assert a.meta["original_schema"].startswith("CREATE TABLE customers")
    assert a.meta["preprocess_schema"] == "P" and a.meta["efficiency"] is False
    assert b.db_id == "ghost" and b.issue_sql == ("SELEC 1",) and b.dialect == "postgresql"
    assert b.meta["original_schema"] == "CREATE TABLE ghost (…)"
    # what we write keeps BIRD-CRITIC's keys and the merged schema text
    write_tasks(tmp_path / "out.jsonl", ts.tasks)
    back = read_tasks(tmp_path / "out.jsonl")
    assert back == list(ts.tasks) and back[0].meta["original_schema"] == a.meta["original_schema"]
    assert json.loads((tmp_path / "out.jsonl").read_text().splitlines()[1])["issue_sql"] == ["SELEC 1"]

    # the {db_id: text} form (BIRD-CRITIC's dev_schema.json)
    (tmp_path / "dev_schema.json").write_text(json.dumps({"shop": "S", "ghost": "G"}))
    by_db = load_critic(data, tmp_path / "dev_schema.json")
    assert [t.meta["original_schema"] for t in by_db.tasks] == ["S", "G"]


def test_critic_loader_db_root_and_error_paths(tmp_path: Path, demo_db_path: str) -> None:
    data = write_jsonl(tmp_path / "critic.jsonl", critic_lines())
    db_root = tmp_path / "dbs"
    (db_root / "shop").mkdir(parents=True)
    shutil.copy(demo_db_path, db_root / "shop" / "shop_template.sqlite")  # BIRD-CRITIC's name
    ts = load_critic(data, db_root=db_root)
    assert [t.task_id for t in ts.tasks] == ["1"] and ts.skipped == {"ghost": 1}
    assert ts.schemas["shop"].table("orders").primary_key == ("order_id",)
    assert ts.catalog["shop"]["sqlite"].endswith("shop_template.sqlite")
    server = load_critic(data, db_root=db_root, dialect="mysql")  # record 1 itself says SQLite
    assert [t.dialect for t in server.tasks] == ["sqlite", "mysql"] and server.skipped == {}

    lines = critic_lines()
    del lines[1]["sol_sql"]
    write_jsonl(data, lines)
    with pytest.raises(TaskError, match=r"critic.jsonl:2: sol_sql is missing"):
        load_critic(data)
    lines = critic_lines()
    lines[0]["dialect"] = "DuckDB"
    write_jsonl(data, lines)
    with pytest.raises(TaskError, match=r"critic.jsonl:1: dialect 'DuckDB'"):
        load_critic(data)
    data.write_text(json.dumps(critic_lines()[0]) + "\n{oops\n")
    with pytest.raises(TaskError, match=r"critic.jsonl:2: not valid JSON"):
        load_critic(data)
    with pytest.raises(FileNotFoundError, match="schema file"):
        load_critic(data, tmp_path / "nope.jsonl")
    write_jsonl(tmp_path / "s.jsonl", [{"original_schema": "no key"}])
    with pytest.raises(TaskError, match="needs 'instance_id' or 'db_id'"):
        load_critic(data, tmp_path / "s.jsonl")
    with pytest.raises(FileNotFoundError, match="instances file"):
        load_critic(tmp_path / "none.jsonl")


# -- JSONL and the registry --------------------------------------------------------------------------

def test_registry_and_jsonl_loader(tmp_path: Path, demo_db_path: str) -> None:
    assert {"spider", "bird", "critic", "verl", "jsonl"} <= set(LOADERS)  # the built-ins
    tasks = [Text2SQLTask("a", "shop", "q?", "SELECT 1"), Text2SQLTask("b", "ghost", "q?", "SELECT 1"),
             Text2SQLTask("c", "ghost", "q?", "SELECT 1", dialect="postgresql")]
    write_tasks(tmp_path / "t.jsonl", tasks)
    assert load("jsonl", tmp_path / "t.jsonl").tasks == tuple(tasks)
    (tmp_path / "dbs" / "shop").mkdir(parents=True)
    shutil.copy(demo_db_path, tmp_path / "dbs" / "shop" / "shop.sqlite")
    ts = load_jsonl(tmp_path / "t.jsonl", db_root=tmp_path / "dbs")
    assert [t.task_id for t in ts.tasks] == ["a", "c"] and ts.skipped == {"ghost": 1}
    with pytest.raises(ValueError, match="unknown task source 'no-such-source'"):
        load("no-such-source", tmp_path / "t.jsonl")


# -- verl ---------------------------------------------------------------------------------------------

def test_verl_round_trip_of_both_task_types(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    tasks = [Text2SQLTask("q1", "shop", "How many?", "SELECT count(*) FROM customers", evidence="e",
                          difficulty="simple", source="unit", meta={"question_id": 1, "x": [1, 2]}),
             CriticTask.from_dict(critic_lines()[0]),
             Text2SQLTask("q2", "shop", "Names?", "SELECT name FROM customers", dialect="mysql",
                          meta={"x": "a string this time"})]
    schemas = {"shop": DatabaseSchema.from_tables_json(SHOP_TABLES)}
    out = tmp_path / "verl" / "train.parquet"
    assert export_verl(tasks, out, split="test", schemas=schemas) == 3
    back = load_verl(out)
    assert back.tasks == tuple(tasks)
    assert [t.to_dict() for t in back.tasks] == [t.to_dict() for t in tasks]

    rows = pq.read_table(out).to_pylist()
    assert set(rows[0]) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
    assert rows[0]["reward_model"] == {"style": "rule", "ground_truth": "SELECT count(*) FROM customers"}
    assert json.loads(rows[1]["reward_model"]["ground_truth"]) == ["SELECT DISTINCT city FROM customers"]
    assert rows[0]["ability"] == "sql" and rows[0]["data_source"] == "unit"
    assert [m["role"] for m in rows[0]["prompt"]] == ["system", "user"]
    assert "CREATE TABLE customers" in rows[0]["prompt"][1]["content"]
    assert "Evidence: e" in rows[0]["prompt"][1]["content"]
    info = rows[1]["extra_info"]
    assert (info["index"], info["split"], info["task_kind"]) == (1, "test", "critic")
    assert info["need_tools_kwargs"] is True and info["task_id"] == "1"
    assert set(info["tools_kwargs"]) == {"execute_sql", "submit_solution"}
    assert info["tools_kwargs"]["execute_sql"]["create_kwargs"] == {
        "task_id": "1", "db_id": "shop", "dialect": "sqlite", "preprocess_sql": []}


def test_verl_custom_prompt_and_error_paths(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    task = Text2SQLTask("q1", "shop", "How many?", "SELECT 1")
    out = tmp_path / "t.parquet"
    export_verl([task], out, prompt_fn=lambda t: [{"role": "user", "content": "Q: " + t.question}],
                ability="text2sql", data_source="mine", agent_name="tool_agent")
    row = pq.read_table(out).to_pylist()[0]
    assert row["agent_name"] == "tool_agent"
    assert row["prompt"] == [{"role": "user", "content": "Q: How many?"}]
    assert (row["ability"], row["data_source"]) == ("text2sql", "mine")
    before = out.read_bytes()
    with pytest.raises(TaskError, match="prompt must be"):
        export_verl([task], out, prompt_fn=lambda t: "just a string")
    assert out.read_bytes() == before  # a failed export leaves the old file alone

    with pytest.raises(FileNotFoundError, match="verl parquet file"):
        load_verl(tmp_path / "missing.parquet")
    (tmp_path / "junk.parquet").write_text("not parquet")
    with pytest.raises(TaskError, match="not a verl parquet file"):
        load_verl(tmp_path / "junk.parquet")
    pq.write_table(pa.table({"extra_info": [{"index": 0}]}), tmp_path / "no_task.parquet")
    with pytest.raises(TaskError, match="no 'task' field"):
        load_verl(tmp_path / "no_task.parquet")
    pq.write_table(pa.table({"extra_info": [{"task": json.dumps(task.to_dict())},
                                            {"task": '{"task_id": "x"}'}]}), tmp_path / "bad.parquet")
    with pytest.raises(TaskError, match="bad.parquet row 1"):
        load_verl(tmp_path / "bad.parquet")


def test_default_prompt_for_a_critic_task() -> None:
    task = CriticTask.from_dict(critic_lines()[0])
    text = default_prompt(task)[1]["content"]
    assert "Duplicates!" in text and "```sql\nSELECT city FROM customers\n```" in text


# -- real benchmark data (../shared/data) ------------------------------------------------------------

def shared(sub: str) -> Path:
    path = SHARED_DATA / sub
    if not path.exists():
        pytest.skip(f"benchmark data not found at {path} (tests read ../shared/data)")
    return path


@pytest.mark.spider
def test_real_spider_dev(spider_dir: Path) -> None:
    raw = json.loads((spider_dir / "dev.json").read_text())
    assert len(raw) == 1034
    ts = load_spider(spider_dir, "dev")
    assert len(ts) == 972 and ts.skipped == {"wta_1": 62}
    assert len(ts.catalog) == 19 and all(
        Path(u["sqlite"].removeprefix("sqlite:///")).is_file() for u in ts.catalog.values())
    assert Counter(t.meta["hardness"] for t in ts.tasks) + Counter({"extra": 0}) == Counter(
        spider_hardness(r["sql"]) for r in raw if r["db_id"] != "wta_1")
    # Spider's published dev split by hardness, over all 1,034 questions
    assert Counter(spider_hardness(r["sql"]) for r in raw) == {
        "easy": 248, "medium": 446, "hard": 174, "extra": 166}
    assert Counter(t.difficulty for t in ts.tasks).keys() == {"simple", "moderate", "challenging"}


@pytest.mark.spider
def test_real_spider_train_syn_and_dk(spider_dir: Path) -> None:
    train = load_spider(spider_dir, "train")  # train_spider_syn.json here
    assert len(train) + train.n_skipped == 7000
    assert set(train.skipped) == {"baseball_1", "soccer_1"}
    assert all("SpiderSynQuestion" in t.meta for t in train.tasks[:50])
    syn = load_spider(spider_dir, "dev_syn")
    assert len(syn) == 972 and syn.tasks[0].question != syn.tasks[0].meta["SpiderQuestion"]
    dk = load_spider(shared("spider_dk"), "dk", db_dirs=[spider_dir / "database"])
    assert len(dk) + dk.n_skipped == 535 and dk.skipped == {"wta_1": 62}
    assert dk.catalog["new_concert_singer"]["sqlite"].endswith(
        "spider_dk/database/new_concert_singer/new_concert_singer.sqlite")


@pytest.mark.spider
def test_every_real_tables_json_schema_renders_executable_sql(spider_dir: Path) -> None:
    files = [spider_dir / "tables.json", shared("spider_dk") / "tables.json",
             shared("bird_minidev") / "dev_tables.json"]
    n = 0
    for f in files:
        schemas = schemas_from_tables_json(json.loads(f.read_text()), origin=str(f))
        for schema in schemas.values():
            created = run_ddl(schema)
            assert [c.lower() for c in created] == [t.lower() for t in schema.table_names]
            n += 1
    assert n == 166 + 169 + 11


@pytest.mark.spider
def test_live_spider_schemas_match_tables_json(spider_dir: Path) -> None:
    schemas = schemas_from_tables_json(json.loads((spider_dir / "tables.json").read_text()))
    checked = 0
    for db_file in sorted((spider_dir / "database").glob("*/*.sqlite")):
        live = DatabaseSchema.from_sqlite(db_file)
        assert {t.lower() for t in live.table_names} == {
            t.lower() for t in schemas[live.db_id].table_names}, live.db_id
        checked += 1
    assert checked == 163


def test_real_bird_minidev_flavours() -> None:
    root = shared("bird_minidev")
    ids = None
    for flavour in ("sqlite", "mysql", "postgresql"):
        ts = load_bird(root / f"mini_dev_{flavour}.json")
        assert len(ts) == 500 and ts.catalog == {} and ts.skipped == {}
        assert {t.dialect for t in ts.tasks} == {flavour}
        assert all(t.difficulty in ("simple", "moderate", "challenging") for t in ts.tasks)
        assert len(ts.schemas) == 11
        ids = ids or [t.task_id for t in ts.tasks]
        assert [t.task_id for t in ts.tasks] == ids
