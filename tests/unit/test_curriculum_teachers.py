"""Teachers: the programmatic teacher on generated data (formats the loop's parsers accept,
determinism, varied turn counts) and the OpenAI-compatible teacher against a local fake server
(retries on 429/5xx/timeouts, the resumable cache, the rate limit)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable

import pytest

from curriculum.openai_teacher import (OpenAIConfig, OpenAITeacher, RateLimiter, TeacherError,
                                       cache_key, to_plain_messages)
from curriculum.teachers import (ProgrammaticTeacher, reference_sql, sql_diff, sql_facts,
                                 tool_call_text)
from sqlrl.agent import build_messages, get_parser
from sqlrl.rewards import extract_single
from sqlrl.tasks.io import read_tasks
from sqlrl.synth import build_default_dataset
from sqlrl.tasks.types import CriticTask, Text2SQLTask

HERMES = get_parser("hermes")


@pytest.fixture(scope="module")
def synth(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("synth")
    build_default_dataset(out, seed=0, n_per_domain=10, domains=["shop", "library"], scale=0.2)
    return out


@pytest.fixture(scope="module")
def tasks(synth: Path) -> list[Any]:
    return read_tasks(synth / "text2sql_train.jsonl") + read_tasks(synth / "critic_train.jsonl")


# -- programmatic teacher --------------------------------------------------------------------------

def test_reasoning_is_the_single_turn_format_with_the_reference_sql(tasks):
    teacher = ProgrammaticTeacher(seed=0)
    assert {t.kind for t in tasks} == {"text2sql", "critic"}
    for task in tasks:
        got = extract_single(teacher.reasoning(task, None))
        assert got.format_ok, got.problem
        assert got.sql == reference_sql(task)


def test_reasoning_names_what_the_gold_sql_uses():
    task = Text2SQLTask(task_id="t1", db_id="shop", question="Max stock per category?",
                        gold_sql="SELECT category, MAX(stock) FROM products WHERE price > 3 "
                                 "GROUP BY category")
    text = ProgrammaticTeacher().reasoning(task, None)
    for part in ("`products`", "`category`", "`stock`", "`price > 3`", "`MAX(stock)`"):
        assert part in text


def test_critic_reasoning_names_the_difference_between_issue_and_solution():
    task = CriticTask(instance_id="c1", db_id="shop", query="I want the largest stock.",
                      issue_sql=["SELECT MIN(stock) FROM products"],
                      sol_sql=["SELECT MAX(stock) FROM products"])
    assert "`MIN` should be `MAX`" in ProgrammaticTeacher().reasoning(task, None)


def test_brief_reasoning_is_short_well_formed_and_keeps_the_fix(tasks):
    full, brief = ProgrammaticTeacher(seed=0), ProgrammaticTeacher(seed=0, brief=True)
    for task in tasks:
        short, long = brief.reasoning(task, None), full.reasoning(task, None)
        got = extract_single(short)
        assert got.format_ok, got.problem
        assert got.sql == reference_sql(task)
        assert len(short) < len(long)
        question = task.question if isinstance(task, Text2SQLTask) else task.query
        assert question.strip() not in short  # no restating of the question
    critic = CriticTask(instance_id="c1", db_id="shop", query="I want the largest stock.",
                        issue_sql=["SELECT MIN(stock) FROM products"],
                        sol_sql=["SELECT MAX(stock) FROM products"])
    assert "Fix: `MIN` should be `MAX`." in brief.reasoning(critic, None)
    t2s = Text2SQLTask(task_id="t1", db_id="shop", question="Max stock per category?",
                       gold_sql="SELECT category, MAX(stock) FROM products WHERE price > 3 GROUP BY category")
    text = brief.reasoning(t2s, None)
    for part in ("`products`", "`price > 3`", "`category`"):
        assert part in text
    # stage 2's trajectories do not depend on brief
    assert brief.plan(critic) == full.plan(critic) and brief.plan(t2s) == full.plan(t2s)


def test_explore_caps_the_exploration_calls_and_keeps_check_then_submit(tasks):
    drawn = ProgrammaticTeacher(seed=0)
    lengths = {task.kind: set() for task in tasks}
    for task in tasks:
        full, none, one = (drawn.plan(task), ProgrammaticTeacher(seed=0, explore=0).plan(task),
                           ProgrammaticTeacher(seed=0, explore=1).plan(task))
        lengths[task.kind].add(len(full))
        gold = reference_sql(task)
        # explore=0: (debugging: run the given SQL,) run the answer, submit it -- nothing else
        assert [s.tool for s in none][-2:] == ["execute_sql", "submit_solution"]
        assert none[-1].sql == none[-2].sql == gold
        assert len(none) == (3 if task.kind == "critic" else 2)
        assert len(none) <= len(one) <= len(full) and len(one) <= len(none) + 1
        assert [(s.tool, s.sql) for s in none[-2:]] == [(s.tool, s.sql) for s in full[-2:]]
    # the cap bites: without it the drawn plans are longer for some tasks of each kind
    assert max(lengths["text2sql"]) > 2 and max(lengths["critic"]) > 3
    for bad in (-1, 1.5, True, "0"):
        with pytest.raises(ValueError, match="explore must be None or an integer >= 0"):
            ProgrammaticTeacher(explore=bad)


def test_every_turn_parses_to_exactly_one_call_and_ends_with_the_submission(tasks):
    teacher = ProgrammaticTeacher(seed=1)
    for task in tasks:
        plan = teacher.plan(task)
        messages = build_messages(task, None, "agentic")
        for k in range(len(plan)):
            text = teacher.next_turn(task, None, messages)
            parsed = HERMES.parse(text)
            assert parsed.ok, parsed.errors
            call = parsed.calls[0]
            assert call.name == ("submit_solution" if k == len(plan) - 1 else "execute_sql")
            messages = messages + [{"role": "assistant", "content": parsed.content},
                                   {"role": "tool", "name": call.name, "content": "x\n1\n(1 row)"}]
        assert call.arguments["sql"] == reference_sql(task)
        # asked past its plan, the teacher submits again
        assert HERMES.parse(teacher.next_turn(task, None, messages)).calls[0].name == "submit_solution"


def test_turn_counts_vary_and_are_deterministic_per_seed(tasks):
    def calls(seed: int, task: Any) -> int:
        return len(ProgrammaticTeacher(seed).plan(task)) - 1  # exploration calls
    t2s = [t for t in tasks if t.kind == "text2sql"]
    crit = [t for t in tasks if t.kind == "critic"]
    assert {calls(0, t) for t in t2s} == {1, 2, 3}
    assert {calls(0, t) for t in crit} <= {2, 3} and len({calls(0, t) for t in crit}) == 2
    assert [calls(0, t) for t in tasks] == [calls(0, t) for t in tasks]
    assert ([ProgrammaticTeacher(0).plan(t) for t in tasks] != [ProgrammaticTeacher(5).plan(t) for t in tasks])
    assert ProgrammaticTeacher(3).plan(tasks[0]) == ProgrammaticTeacher(3).plan(tasks[0])


def test_critic_trajectory_runs_the_issue_sql_first_and_tests_the_fix():
    task = CriticTask(instance_id="c1", db_id="shop", query="Largest stock please.",
                      issue_sql=["SELECT MIN(stock) FROM products;"], sol_sql=["SELECT MAX(stock) FROM products;"])
    plan = ProgrammaticTeacher().plan(task)
    assert plan[0].sql == "SELECT MIN(stock) FROM products"
    assert plan[-2].sql == plan[-1].sql == "SELECT MAX(stock) FROM products"
    assert "`MIN` should be `MAX`" in plan[-2].reason


def test_next_turn_reads_the_last_observation():
    task = Text2SQLTask(task_id="t", db_id="shop", question="How many?", gold_sql="SELECT 1")
    base = build_messages(task, None, "agentic") + [{"role": "assistant", "content": "x"}]
    teacher = ProgrammaticTeacher()
    err = teacher.next_turn(task, None, base + [{"role": "tool", "content": "Error (syntax): near x"}])
    assert err.startswith("That gave an error: Error (syntax): near x.")
    rows = teacher.next_turn(task, None, base + [{"role": "tool", "content": "a\n1\n2\n(2 rows)"}])
    assert rows.startswith("It returned 2 rows.")


def test_unparsable_reference_sql_still_gives_valid_responses():
    task = Text2SQLTask(task_id="odd", db_id="shop", question="Odd?", gold_sql="SELECT ((( FROM")
    teacher = ProgrammaticTeacher()
    assert sql_facts(task.gold_sql) is None
    assert extract_single(teacher.reasoning(task, None)).sql == "SELECT ((( FROM"
    assert HERMES.parse(teacher.next_turn(task, None, build_messages(task, None))).ok


def test_sql_facts_and_diff():
    f = sql_facts("WITH per AS (SELECT a FROM t1) SELECT x.b FROM t2 AS x JOIN per ON per.a = x.a "
                  "WHERE x.c = 'k' ORDER BY x.b DESC LIMIT 2")
    assert f.tables == ("t2", "t1") and f.joins == 1 and f.limit == "2"
    assert f.filters == (("t2", "c", False),) and f.order_by == ("x.b DESC",)
    assert sql_diff("SELECT a FROM t", "SELECT a FROM t") == []
    assert sql_diff("SELECT a FROM t", "SELECT a FROM t WHERE b = 1") == ["`WHERE b = 1` is missing after `t`"]
    assert sql_diff("SELECT a, b FROM t", "SELECT a FROM t") == ["`, b` should not be there"]


def test_inspection_queries_are_written_in_the_task_dialect():
    task = Text2SQLTask(task_id="m", db_id="shop", question="Top?", dialect="mssql",
                        gold_sql="SELECT name FROM products WHERE price > 3")
    sqls = [s.sql for s in ProgrammaticTeacher().plan(task)[:-2]]
    sqls += [s.sql for seed in range(1, 8) for s in ProgrammaticTeacher(seed).plan(task)[:-2]]
    assert any("TOP 3" in s for s in sqls) and not any("LIMIT" in s for s in sqls)


def test_tool_call_text_is_the_qwen_layout():
    assert tool_call_text("Check.", "execute_sql", "SELECT 'é'") == (
        'Check.\n<tool_call>\n{"name": "execute_sql", "arguments": {"sql": "SELECT \'é\'"}}\n</tool_call>')


# -- the OpenAI-compatible teacher -----------------------------------------------------------------

class FakeServer:
    """A local /v1/chat/completions: ``script`` is consumed one item per request -- an int is an
    HTTP error status, "sleep" stalls past the client timeout, "junk" is a 200 without a
    completion; when it is empty, ``reply(body)`` answers."""

    def __init__(self, reply: Callable[[dict], str]) -> None:
        self.reply, self.script, self.requests, self.headers = reply, [], [], []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append(body)
                server.headers.append(dict(self.headers))
                item = server.script.pop(0) if server.script else None
                if item == "sleep":
                    time.sleep(0.6)
                if isinstance(item, int):
                    data = json.dumps({"error": {"message": f"status {item} from the fake"}}).encode()
                    self.send_response(item)
                    if item == 429:
                        self.send_header("Retry-After", "0")
                else:
                    payload = ({"nothing": True} if item == "junk" else
                               {"choices": [{"message": {"role": "assistant",
                                                         "content": server.reply(body)}}]})
                    data = json.dumps(payload).encode()
                    self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                try:
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def echo(body: dict) -> str:
    return "echo: " + body["messages"][-1]["content"]


@pytest.fixture()
def server():
    s = FakeServer(echo)
    yield s
    s.close()


def make(server: FakeServer, tmp_path: Path, sleeps: list[float] | None = None, **kw: Any) -> OpenAITeacher:
    kw = {"backoff_s": 0.5, "workers": 3, **kw}
    cfg = OpenAIConfig(base_url=server.url, model="fake-model", cache_path=str(tmp_path / "cache.jsonl"),
                       **kw)
    return OpenAITeacher(cfg, progress=False, sleep=(sleeps.append if sleeps is not None else time.sleep))


def msgs(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def test_retries_429_and_5xx_with_exponential_backoff(server, tmp_path):
    server.script = [429, 429, 500, 503]
    sleeps: list[float] = []
    teacher = make(server, tmp_path, sleeps)
    assert teacher.complete(msgs("hi")) == "echo: hi"
    assert len(server.requests) == 5 and teacher.retries == 4
    assert sleeps == [0.5, 1.0, 2.0, 4.0]


def test_a_client_error_fails_at_once_with_the_servers_message(server, tmp_path):
    server.script = [400]
    teacher = make(server, tmp_path, [])
    with pytest.raises(TeacherError, match="HTTP 400: status 400 from the fake"):
        teacher.complete(msgs("bad"))
    assert len(server.requests) == 1


def test_gives_up_after_max_retries_and_caches_no_failure(server, tmp_path):
    server.script = [500, 500, 500]
    teacher = make(server, tmp_path, [], max_retries=2)
    with pytest.raises(TeacherError, match="gave up after 3 attempts; last: HTTP 500"):
        teacher.complete(msgs("x"))
    assert not (tmp_path / "cache.jsonl").exists()
    assert teacher.complete(msgs("x")) == "echo: x"  # the script is used up: the server answers


def test_timeouts_and_junk_bodies_are_retried(server, tmp_path):
    server.script = ["sleep", "junk"]
    teacher = make(server, tmp_path, [], timeout_s=0.2)
    assert teacher.complete(msgs("slow")) == "echo: slow"
    assert teacher.retries == 2


def test_cache_makes_a_rerun_skip_finished_calls(server, tmp_path):
    server.script = [429, 500]
    batch = [msgs(f"q{i}") for i in range(6)]
    first = make(server, tmp_path, [], api_key="sk-secret").complete_many(batch)
    assert first == [f"echo: q{i}" for i in range(6)]
    assert len(server.requests) == 8  # 6 calls + 2 retried failures
    assert server.headers[0]["Authorization"] == "Bearer sk-secret"
    assert "sk-secret" not in (tmp_path / "cache.jsonl").read_text()
    rerun = make(server, tmp_path, [])
    assert rerun.complete_many(batch + [msgs("new")]) == first + ["echo: new"]
    assert len(server.requests) == 9 and rerun.cache_hits == 6  # only the new call went out


def test_cache_key_covers_model_messages_and_params(server, tmp_path):
    k = cache_key("m", msgs("a"), {"temperature": 0.7})
    assert k != cache_key("m2", msgs("a"), {"temperature": 0.7})
    assert k != cache_key("m", msgs("b"), {"temperature": 0.7})
    assert k != cache_key("m", msgs("a"), {"temperature": 0.0})
    make(server, tmp_path, [], temperature=0.7).complete(msgs("a"))
    make(server, tmp_path, [], temperature=0.1).complete(msgs("a"))
    assert len(server.requests) == 2


def test_a_torn_cache_line_is_skipped_and_counted(server, tmp_path):
    make(server, tmp_path, []).complete(msgs("a"))
    with (tmp_path / "cache.jsonl").open("a") as f:
        f.write('{"key": "abc", "te')
    teacher = make(server, tmp_path, [])
    assert teacher.cache_bad_lines == 1
    assert teacher.complete(msgs("a")) == "echo: a" and len(server.requests) == 1


def test_complete_many_returns_errors_in_place(server, tmp_path):
    server.reply = lambda body: "ok"
    server.script = [400]
    got = make(server, tmp_path, [], workers=1).complete_many([msgs("a"), msgs("b")])
    assert isinstance(got[0], TeacherError) and got[1] == "ok"


def test_rate_limiter_spaces_requests():
    now = [10.0]
    sleeps: list[float] = []
    limiter = RateLimiter(2.0, clock=lambda: now[0], sleep=sleeps.append)
    for _ in range(3):
        limiter.acquire()
    assert sleeps == [0.5, 1.0]
    now[0] = 20.0
    limiter.acquire()
    assert sleeps == [0.5, 1.0]
    unlimited = RateLimiter(None, clock=lambda: 0.0, sleep=sleeps.append)
    unlimited.acquire()
    assert sleeps == [0.5, 1.0]


@pytest.mark.parametrize("kw, match", [({"base_url": "localhost:8000"}, "http"),
                                       ({"model": ""}, "model"), ({"rate_per_s": 0}, "rate_per_s"),
                                       ({"workers": 0}, "workers")])
def test_bad_config_is_an_error(kw, match):
    with pytest.raises(ValueError, match=match):
        OpenAIConfig(**{"base_url": "http://x/v1", "model": "m", **kw})


def test_guided_prompts_and_plain_messages(server, tmp_path):
    task = CriticTask(instance_id="c", db_id="shop", query="Fix it.", issue_sql=["SELECT MIN(a) FROM t"],
                      sol_sql=["SELECT MAX(a) FROM t"])
    teacher = make(server, tmp_path, [])
    m = teacher.reasoning_messages(task, None)
    assert m[:1] == build_messages(task, None, "single")[:1]
    assert "SELECT MAX(a) FROM t" in m[1]["content"] and "never mention" in m[1]["content"]
    loop_messages = build_messages(task, None) + [
        {"role": "assistant", "content": "Run it.", "tool_calls": [
            {"type": "function", "function": {"name": "execute_sql", "arguments": {"sql": "SELECT 1"}}}]},
        {"role": "tool", "name": "execute_sql", "content": "1\n1\n(1 row)"}]
    plain = to_plain_messages(loop_messages)
    assert plain[2] == {"role": "assistant", "content": tool_call_text("Run it.", "execute_sql", "SELECT 1")}
    assert plain[3] == {"role": "user", "content": "<tool_response>\n1\n1\n(1 row)\n</tool_response>"}
    assert teacher.next_turn(task, None, loop_messages).startswith("echo: <tool_response>")
    unguided = make(server, tmp_path, [], guided=False)
    assert unguided.reasoning_messages(task, None) == build_messages(task, None, "single")
