"""The agent loop, driven by a scripted backend over a fake Qwen2.5-template tokenizer and real
SQLite sessions on the demo "shop" database."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sqlrl.agent import (AgentLoop, HFChatFormat, LoopConfig, State, Trajectory, Turn,
                         build_messages, tools_for)
from sqlrl.db import ErrorKind, QueryResult, open_session
from sqlrl.policy.types import Generation, SamplingParams
from sqlrl.tasks.schema import DatabaseSchema
from sqlrl.tasks.types import CriticTask, Text2SQLTask
from sqlrl.tools import format_observation
from tests.unit.test_agent_chat_format import FakeTokenizer

IM_END = FakeTokenizer.SPECIAL["<|im_end|>"]


def tc(sql: str, name: str = "execute_sql", reason: str = "Let me check.") -> str:
    """A tool call written exactly as the Qwen2.5 template renders one."""
    body = json.dumps({"name": name, "arguments": {"sql": sql}}, ensure_ascii=False)
    return f"{reason}\n<tool_call>\n{body}\n</tool_call>"


class Boom(Exception):
    pass


class ScriptedBackend:
    """Answers each prompt from the script of the task whose question it contains; the turn is
    the number of assistant turns already in the prompt. A script item is a text (ends with
    <|im_end|>, finish "eos"), a ``(finish_reason, text)`` pair (no end-of-turn token), or an
    exception to raise."""

    def __init__(self, tok: Any, scripts: dict[str, list[Any]], clock=None,
                 eot_id: int = IM_END) -> None:
        self.tok, self.scripts, self.clock, self.eot_id = tok, scripts, clock, eot_id
        self.calls: list[list[list[int]]] = []
        self.outputs: list[list[Generation]] = []

    def generate(self, prompts, params: SamplingParams) -> list[Generation]:
        self.calls.append([list(p) for p in prompts])
        if self.clock is not None:
            self.clock.now += 2.0
        out = []
        for p in prompts:
            text = self.tok.decode(p)
            key = next(k for k in self.scripts if k in text)
            item = self.scripts[key][text.count("<|im_start|>assistant") - 1]
            if isinstance(item, Exception):
                raise item
            reason, body = ("eos", item) if isinstance(item, str) else item
            ids = (self.tok.encode(body, add_special_tokens=False)
                   + ([self.eot_id] if reason == "eos" else []))
            ids = ids[:params.max_new_tokens]
            lps = [-0.5 - 0.001 * k for k in range(len(ids))]
            out.append(Generation(tuple(ids), tuple(lps), self.tok.decode(ids), reason))
        self.outputs.append(out)
        return out


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def task(q: str) -> Text2SQLTask:
    return Text2SQLTask(task_id=f"id-{q}", db_id="shop", question=q, gold_sql="SELECT 1")


@pytest.fixture()
def tok() -> FakeTokenizer:
    return FakeTokenizer()


@pytest.fixture()
def fmt(tok) -> HFChatFormat:
    return HFChatFormat(tok)


@pytest.fixture(scope="module")
def shop(demo_db_path) -> DatabaseSchema:
    return DatabaseSchema.from_sqlite(demo_db_path)


@pytest.fixture()
def sessions(demo_db_path):
    opened = []

    def make(n: int):
        for _ in range(n):
            opened.append(open_session(f"sqlite:///{demo_db_path}"))
        return opened[-n:]

    yield make
    for s in opened:
        s.close()


CFG = LoopConfig(max_turns=6, max_total_tokens=20000, sampling=SamplingParams(max_new_tokens=400))


def test_rollout_goes_through_every_state_on_a_real_session(tok, fmt, sessions, shop, demo_db_path):
    script = {"Q-every": ["I think the answer is 60.",  # plain text: malformed
                          tc("SELECT count(*) FROM customers"),
                          tc("SELECT nope FROM customers"),
                          tc("SELECT count(*)  FROM customers", "submit_solution", "Done.")]}
    backend = ScriptedBackend(tok, script)
    loop = AgentLoop([task("Q-every")], sessions(1), backend, fmt, CFG, schemas={"shop": shop},
                     policy_version=7)
    (t,) = loop.run()
    S = State
    assert loop.states[0].history == [
        S.PROMPTING, S.GENERATING, S.PARSED, S.OBSERVED,                  # malformed turn
        S.GENERATING, S.PARSED, S.EXECUTING, S.OBSERVED,                  # SQL that works
        S.GENERATING, S.PARSED, S.EXECUTING, S.OBSERVED,                  # SQL that fails
        S.GENERATING, S.PARSED, S.EXECUTING, S.DONE]                      # submit
    assert t.stop_reason == "submitted" and t.submitted_sql == "SELECT count(*)  FROM customers"
    assert (t.n_tool_calls, t.n_tool_errors, t.n_malformed) == (3, 1, 1)
    assert t.policy_version == 7 and t.task_id == "id-Q-every" and t.mode == "agentic"
    assert [x.call for x in t.turns] == [None, "execute_sql", "execute_sql", "submit_solution"]
    assert t.turns[0].error.startswith("no tool call found")
    assert t.turns[2].error.startswith("Error (runtime)") and "nope" in t.turns[2].error
    assert t.turns[1].error is None and t.turns[3].error is None
    tools = [m for m in t.messages if m["role"] == "tool"]
    assert tools[0]["content"].startswith("Error (tool call): no tool call found")
    with open_session(f"sqlite:///{demo_db_path}") as check:
        expected = format_observation(check.execute("SELECT count(*) FROM customers"))
    assert tools[1]["content"] == expected and tools[1]["name"] == "execute_sql"
    assert tools[2]["content"].startswith("Error (runtime): no such column: nope")
    assert t.messages[-1]["tool_calls"][0]["function"] == {
        "name": "submit_solution", "arguments": {"sql": "SELECT count(*)  FROM customers"}}
    assert "CREATE TABLE customers" in t.messages[0]["content"]


def test_token_ids_are_prompt_plus_generated_plus_continuations_exactly(tok, fmt, sessions, shop):
    script = {"Q-exact": ["plain words, no call",
                          tc("SELECT name FROM products ORDER BY product_id LIMIT 2"),
                          tc("SELECT 1", "submit_solution")]}
    backend = ScriptedBackend(tok, script)
    (t,) = AgentLoop([task("Q-exact")], sessions(1), backend, fmt, CFG, schemas={"shop": shop}).run()
    tools = tools_for("agentic")
    prompt = fmt.prompt_ids(build_messages(task("Q-exact"), shop), tools)
    gens = [out[0] for out in backend.outputs]
    msgs = list(t.messages)  # system, user, (assistant, tool) x2, assistant
    expected, mask, lps = list(prompt), [0] * len(prompt), [0.0] * len(prompt)
    for k, g in enumerate(gens):
        expected += g.token_ids
        mask += [1] * len(g.token_ids)
        lps += g.logprobs
        if k < 2:
            cont = fmt.continuation_ids(msgs[:3 + 2 * k], [msgs[3 + 2 * k]], tools)
            expected += cont
            mask += [0] * len(cont)
            lps += [0.0] * len(cont)
    assert list(t.token_ids) == expected
    assert list(t.loss_mask) == mask and list(t.old_logprobs) == lps
    assert t.prompt_length == len(prompt) and t.token_ids[:len(prompt)] == tuple(prompt)
    assert t.n_generated == sum(len(g.token_ids) for g in gens)
    # The generated tool calls are canonical, so the ids are the template's own rendering of
    # the messages (which ends "<|im_end|>\n" after the last turn; generation stopped at <|im_end|>).
    assert t.render(fmt) + "\n" == tok.render(list(t.messages), tools, False)
    # Each backend call saw exactly the trajectory's ids so far.
    for k, call in enumerate(backend.calls):
        assert call[0] == list(t.token_ids[:len(call[0])])
        assert t.loss_mask[len(call[0]) - 1] == 0 and t.loss_mask[len(call[0])] == 1


def test_batch_shrinks_as_rollouts_finish(tok, fmt, sessions):
    submit = tc("SELECT 1", "submit_solution")
    scripts = {"Q-one": [submit],
               "Q-two": [tc("SELECT 1"), submit],
               "Q-three": [tc("SELECT 1"), tc("SELECT 2"), submit]}
    backend = ScriptedBackend(tok, scripts)
    loop = AgentLoop([task("Q-three"), task("Q-one"), task("Q-two")], sessions(3), backend, fmt, CFG)
    trajs = loop.run()
    assert [len(c) for c in backend.calls] == [3, 2, 1] == loop.batch_sizes
    assert [len(t.turns) for t in trajs] == [3, 1, 2]
    assert all(t.stop_reason == "submitted" for t in trajs)
    assert [t.task_id for t in trajs] == ["id-Q-three", "id-Q-one", "id-Q-two"]


def test_generation_time_is_the_batch_call_and_tool_time_is_per_call(tok, fmt):
    clock = FakeClock()

    class SlowSession:
        def __init__(self, cost: float) -> None:
            self.cost = cost

        def execute(self, sql: str) -> QueryResult:
            clock.now += self.cost
            return QueryResult(columns=("x",), rows=((1,),), row_count=1)

    scripts = {"Q-a": [tc("SELECT 1"), tc("SELECT 1", "submit_solution")],
               "Q-b": [tc("SELECT 1"), tc("SELECT 1", "submit_solution")]}
    backend = ScriptedBackend(tok, scripts, clock=clock)
    a, b = AgentLoop([task("Q-a"), task("Q-b")], [SlowSession(0.25), SlowSession(0.5)], backend,
                     fmt, CFG, clock=clock).run()
    assert [x.gen_ms for x in a.turns] == [x.gen_ms for x in b.turns] == [2000.0, 2000.0]
    assert [x.tool_ms for x in a.turns] == [250.0, 0.0] and [x.tool_ms for x in b.turns] == [500.0, 0.0]
    assert a.turns[0].gen_tokens == len(backend.outputs[0][0].token_ids)


def test_single_turn_mode(tok, fmt, shop):
    scripts = {"Q-good": ["<thought>count</thought>\n<solution>SELECT count(*) FROM orders</solution>"],
               "Q-bad": ["SELECT count(*) FROM orders"]}
    backend = ScriptedBackend(tok, scripts)
    cfg = LoopConfig(mode="single", max_total_tokens=20000, sampling=SamplingParams(max_new_tokens=200))
    loop = AgentLoop([task("Q-good"), task("Q-bad")], None, backend, fmt, cfg, schemas=[shop, None])
    good, bad = loop.run()
    assert backend.calls and len(backend.calls) == 1 and "# Tools" not in tok.decode(backend.calls[0][0])
    assert good.stop_reason == bad.stop_reason == "single_turn"
    assert good.submitted_sql == "SELECT count(*) FROM orders" and good.n_malformed == 0
    assert bad.submitted_sql is None and bad.n_malformed == 1 and "expected exactly one" in bad.turns[0].error
    assert good.messages[-1] == {"role": "assistant", "content": scripts["Q-good"][0]}
    assert good.n_tool_calls == 0 and good.turns[0].call is None
    assert loop.states[0].history == [State.PROMPTING, State.GENERATING, State.PARSED, State.DONE]
    assert "schema is not given" in bad.messages[0]["content"]


def test_max_turns_ends_after_the_last_generated_token(tok, fmt, sessions):
    backend = ScriptedBackend(tok, {"Q-loop": [tc("SELECT 1")] * 5})
    cfg = LoopConfig(max_turns=2, max_total_tokens=20000, sampling=SamplingParams(max_new_tokens=400))
    (t,) = AgentLoop([task("Q-loop")], sessions(1), backend, fmt, cfg).run()
    assert t.stop_reason == "max_turns" and len(t.turns) == 2 and t.submitted_sql is None
    assert t.loss_mask[-1] == 1 and t.token_ids[-1] == IM_END  # no observation after the last turn
    assert [m["role"] for m in t.messages] == ["system", "user", "assistant", "tool", "assistant"]


def test_token_budget_before_the_first_turn(tok, fmt, sessions):
    backend = ScriptedBackend(tok, {"Q-big": [tc("SELECT 1")]})
    prompt_len = len(fmt.prompt_ids(build_messages(task("Q-big"), None), tools_for("agentic")))
    cfg = LoopConfig(max_total_tokens=prompt_len + 99, sampling=SamplingParams(max_new_tokens=100))
    (t,) = AgentLoop([task("Q-big")], sessions(1), backend, fmt, cfg).run()
    assert t.stop_reason == "token_budget" and t.turns == () and backend.calls == []
    assert len(t.token_ids) == t.prompt_length == prompt_len


def test_token_budget_mid_rollout_never_exceeds_the_limit(tok, fmt, sessions):
    prompt_len = len(fmt.prompt_ids(build_messages(task("Q-tight"), None), tools_for("agentic")))
    first = tc("SELECT name FROM customers")
    gen_len = len(tok.encode(first)) + 1
    cfg = LoopConfig(max_total_tokens=prompt_len + gen_len + 120,  # the 20-row observation won't fit
                     sampling=SamplingParams(max_new_tokens=gen_len + 5))
    backend = ScriptedBackend(tok, {"Q-tight": [first, tc("SELECT 1", "submit_solution")]})
    (t,) = AgentLoop([task("Q-tight")], sessions(1), backend, fmt, cfg).run()
    assert t.stop_reason == "token_budget" and len(t.turns) == 1 and t.n_tool_calls == 1
    assert len(t.token_ids) == prompt_len + gen_len <= cfg.max_total_tokens
    assert t.messages[-1]["role"] == "assistant"
    # With room for it, the same rollout goes on to submit.
    roomy = LoopConfig(max_total_tokens=20000, sampling=cfg.sampling)
    backend = ScriptedBackend(tok, {"Q-tight": [first, tc("SELECT 1", "submit_solution")]})
    (t,) = AgentLoop([task("Q-tight")], sessions(1), backend, fmt, roomy).run()
    assert t.stop_reason == "submitted"


def test_turn_stopped_without_end_of_turn_is_closed_by_the_continuation(tok, fmt, sessions):
    scripts = {"Q-stop": [("stop", tc("SELECT 1")),                       # stop string </tool_call>
                          ("length", 'Hmm <tool_call>{"name": "execute_sql", "argu'),  # cut off
                          tc("SELECT 1", "submit_solution")]}
    backend = ScriptedBackend(tok, scripts)
    (t,) = AgentLoop([task("Q-stop")], sessions(1), backend, fmt, CFG).run()
    assert t.stop_reason == "submitted" and t.n_malformed == 1 and t.n_tool_calls == 2
    assert "is not closed with </tool_call>" in t.turns[1].error
    assert [x.finish_reason for x in t.turns] == ["stop", "length", "eos"]
    # Right after each of the first two turns: <|im_end|> inserted by the continuation, mask 0.
    ids, mask = t.token_ids, t.loss_mask
    starts = [k for k in range(1, len(ids)) if mask[k - 1] == 1 and mask[k] == 0]
    assert len(starts) == 2 and all(ids[k] == IM_END for k in starts)
    assert all(ids[k - 1] != IM_END for k in starts)


def test_backend_exception_ends_the_rollouts_in_that_call(tok, fmt, sessions):
    scripts = {"Q-done": [tc("SELECT 1", "submit_solution")],
               "Q-crash": [tc("SELECT 1"), Boom("CUDA out of memory")],
               "Q-crash2": [tc("SELECT 2"), tc("SELECT 1", "submit_solution")]}
    backend = ScriptedBackend(tok, scripts)
    done, crash, crash2 = AgentLoop([task("Q-done"), task("Q-crash"), task("Q-crash2")],
                                    sessions(3), backend, fmt, CFG).run()
    assert done.stop_reason == "submitted" and done.error is None
    for t in (crash, crash2):
        assert t.stop_reason == "error" and t.error == "generation failed: Boom: CUDA out of memory"
        assert len(t.turns) == 1 and t.loss_mask[-1] == 0  # ended after the observation


def test_backend_breaking_its_contract_is_an_error(tok, fmt, sessions):
    class Short(ScriptedBackend):
        def generate(self, prompts, params):
            return super().generate(prompts, params)[:1]

    class BadLogprobs(ScriptedBackend):
        def generate(self, prompts, params):
            out = super().generate(prompts, params)
            return [out[0]] + [Generation(g.token_ids, g.logprobs[:-1], g.text, g.finish_reason)
                               for g in out[1:]]

    scripts = {"Q-x": [tc("SELECT 1", "submit_solution")], "Q-y": [tc("SELECT 1", "submit_solution")]}
    x, y = AgentLoop([task("Q-x"), task("Q-y")], sessions(2), Short(tok, scripts), fmt, CFG).run()
    assert x.stop_reason == y.stop_reason == "error" and "returned 1 generations for 2" in x.error
    x, y = AgentLoop([task("Q-x"), task("Q-y")], sessions(2), BadLogprobs(tok, scripts), fmt, CFG).run()
    assert x.stop_reason == "submitted"
    assert y.stop_reason == "error" and "token ids but" in y.error and y.n_generated == 0


def test_session_failures_end_only_that_rollout(tok, fmt, sessions):
    class Raising:
        def execute(self, sql):
            raise ConnectionError("pool shard died")

    class Lost:
        def execute(self, sql):
            return QueryResult.failure(ErrorKind.LEASE_EXPIRED, "lease expired after 60 s")

    submit = tc("SELECT 1", "submit_solution")
    scripts = {"Q-raise": [tc("SELECT 1"), submit], "Q-lost": [tc("SELECT 1"), submit],
               "Q-fine": [tc("SELECT 1"), submit]}
    raising, lost, fine = AgentLoop([task("Q-raise"), task("Q-lost"), task("Q-fine")],
                                    [Raising(), Lost(), sessions(1)[0]],
                                    ScriptedBackend(tok, scripts), fmt, CFG).run()
    assert raising.stop_reason == "error" and raising.error == (
        "the session failed: ConnectionError: pool shard died")
    assert raising.turns[0].error == raising.error and raising.n_tool_calls == 0
    assert lost.stop_reason == "error" and "lease-expired" in lost.error and lost.n_tool_errors == 1
    assert fine.stop_reason == "submitted"


def test_deadline_times_out_the_waiting_rollouts(tok, fmt, sessions):
    clock = FakeClock()
    scripts = {"Q-slow": [tc("SELECT 1"), tc("SELECT 1", "submit_solution")],
               "Q-fast": [tc("SELECT 1", "submit_solution")]}
    cfg = LoopConfig(max_total_tokens=20000, sampling=SamplingParams(max_new_tokens=400), deadline_s=1.0)
    slow, fast = AgentLoop([task("Q-slow"), task("Q-fast")], sessions(2),
                           ScriptedBackend(tok, scripts, clock=clock), fmt, cfg, clock=clock).run()
    assert fast.stop_reason == "submitted"
    assert slow.stop_reason == "timeout" and "deadline of 1.0 s" in slow.error and len(slow.turns) == 1


def test_prompt_failure_is_an_error_for_that_rollout(tok, sessions):
    class PickyFormat(HFChatFormat):
        def prompt_ids(self, messages, tools=None):
            if "Q-bad" in messages[1]["content"]:
                raise ValueError("template exploded")
            return super().prompt_ids(messages, tools)

    scripts = {"Q-bad": [], "Q-good": [tc("SELECT 1", "submit_solution")]}
    bad, good = AgentLoop([task("Q-bad"), task("Q-good")], sessions(2), ScriptedBackend(tok, scripts),
                          PickyFormat(tok), CFG).run()
    assert bad.stop_reason == "error" and "template exploded" in bad.error and bad.token_ids == ()
    assert good.stop_reason == "submitted"


def test_critic_task_with_preprocessed_session(tok, fmt, demo_db_path):
    t = CriticTask(instance_id="crit-1", db_id="shop", query="Q-critic: my temp table query fails",
                   issue_sql=("SELECT * FROM scratch",), sol_sql=("SELECT v FROM scratch",),
                   preprocess_sql=("CREATE TEMP TABLE scratch AS SELECT 41 + 1 AS v",))
    scripts = {"Q-critic": [tc("SELECT v FROM scratch"), tc("SELECT v FROM scratch", "submit_solution")]}
    with open_session(f"sqlite:///{demo_db_path}", preprocess_sql=list(t.preprocess_sql)) as s:
        (traj,) = AgentLoop([t], [s], ScriptedBackend(tok, scripts), fmt, CFG).run()
    assert traj.task_id == "crit-1" and traj.stop_reason == "submitted"
    assert traj.messages[3]["content"] == "v\n42\n(1 row)"


def test_trajectory_round_trips_and_renders(tok, fmt, sessions):
    backend = ScriptedBackend(tok, {"Q-rt": ["no call", tc("SELECT 1", "submit_solution")]})
    (t,) = AgentLoop([task("Q-rt")], sessions(1), backend, fmt, CFG).run()
    back = Trajectory.from_dict(json.loads(json.dumps(t.to_dict())))
    assert back == t and isinstance(back.turns[0], Turn)
    assert t.render(fmt) == tok.decode(t.token_ids)


@pytest.mark.parametrize("change, message", [
    (dict(loss_mask=(0, 1)), "must have the same length"),
    (dict(loss_mask=(1, 0, 1)), "prompt_length tokens must exist and be masked out"),
    (dict(old_logprobs=(0.0, -1.0, -0.5)), "0.0 where loss_mask is 0"),
    (dict(loss_mask=(0, 2, 1)), "only 0 and 1"),
    (dict(stop_reason="bored"), "is not one of"),
])
def test_trajectory_validates_its_invariants(change, message):
    base = dict(task_id="t", mode="agentic", messages=(), token_ids=(1, 2, 3), loss_mask=(0, 0, 1),
                old_logprobs=(0.0, 0.0, -0.5), prompt_length=1, turns=(), n_tool_calls=0,
                n_tool_errors=0, n_malformed=0, submitted_sql=None, stop_reason="max_turns")
    Trajectory(**base)
    with pytest.raises(ValueError, match=message):
        Trajectory(**{**base, **change})


@pytest.mark.parametrize("kwargs, message", [
    (dict(mode="chat"), "mode 'chat' is not one of"),
    (dict(parser="xml"), "parser 'xml' is not one of"),
    (dict(max_turns=0), "max_turns must be >= 1"),
    (dict(sampling=SamplingParams(n=4)), "sampling.n must be 1"),
    (dict(max_total_tokens=100, sampling=SamplingParams(max_new_tokens=100)), "must exceed"),
    (dict(deadline_s=0), "deadline_s must be > 0"),
    (dict(schema_style="prose"), "schema_style 'prose' is not one of compact, create"),
])
def test_loop_config_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LoopConfig(**kwargs)


def test_the_loop_prompts_with_its_configured_schema_style(tok, fmt, sessions, shop, monkeypatch):
    monkeypatch.setenv("SQLRL_SCHEMA_STYLE", "create")  # the config wins over the environment
    backend = ScriptedBackend(tok, {"Q-style": [tc("SELECT 1", "submit_solution")]})
    compact = LoopConfig(**{**CFG.__dict__, "schema_style": "compact"})
    (t,) = AgentLoop([task("Q-style")], sessions(1), backend, fmt, compact, schemas={"shop": shop}).run()
    assert shop.to_compact("sqlite") in t.messages[0]["content"] and "CREATE TABLE" not in t.messages[0]["content"]


def test_loop_construction_errors(tok, fmt):
    b = ScriptedBackend(tok, {})
    with pytest.raises(ValueError, match="2 tasks but 1 sessions"):
        AgentLoop([task("a"), task("b")], [object()], b, fmt, CFG)
    with pytest.raises(ValueError, match="needs a session for every task"):
        AgentLoop([task("a")], None, b, fmt, CFG)
    with pytest.raises(ValueError, match="1 tasks but 2 schemas"):
        AgentLoop([task("a")], [object()], b, fmt, CFG, schemas=[None, None])


def test_a_rounds_sql_runs_in_one_execute_many(tok, fmt, sessions):
    """Every execute_sql of a round goes to the session source's execute_many in one call; each
    result reaches its own rollout; submit_solution and malformed turns never reach it."""
    calls: list[list[tuple[Any, str]]] = []

    def execute_many(pairs):
        calls.append(list(pairs))
        return [s.execute(sql) for s, sql in pairs]

    scripts = {"Q-a": [tc("SELECT count(*) FROM customers"), tc("SELECT 1", "submit_solution")],
               "Q-b": [tc("SELECT count(*) FROM orders"), tc("SELECT 2"), tc("SELECT 2", "submit_solution")],
               "Q-c": ["no call here", tc("SELECT 3", "submit_solution")]}
    ss = sessions(3)
    a, b, c = AgentLoop([task("Q-a"), task("Q-b"), task("Q-c")], ss, ScriptedBackend(tok, scripts), fmt, CFG,
                        execute_many=execute_many).run()
    assert [[sql for _, sql in round_] for round_ in calls] == [
        ["SELECT count(*) FROM customers", "SELECT count(*) FROM orders"], ["SELECT 2"]]
    assert calls[0][0][0] is ss[0] and calls[0][1][0] is ss[1]  # each call on its own rollout's session
    assert "60" in a.messages[3]["content"] and "60" not in b.messages[3]["content"]
    assert (a.stop_reason, b.stop_reason, c.stop_reason) == ("submitted",) * 3
    assert a.turns[0].tool_ms == b.turns[0].tool_ms  # the round's call, shared
    assert c.n_malformed == 1 and c.n_tool_calls == 1
    # switched off: one call at a time on each session, the same trajectories
    calls.clear()
    off = AgentLoop([task("Q-a"), task("Q-b"), task("Q-c")], sessions(3), ScriptedBackend(tok, scripts), fmt,
                    LoopConfig(**{**CFG.__dict__, "batch_tools": False}), execute_many=execute_many).run()
    assert calls == [] and [t.messages for t in off] == [t.messages for t in (a, b, c)]


def test_a_failing_execute_many_ends_only_the_rollouts_in_it(tok, fmt, sessions):
    def broken(pairs):
        raise ConnectionError("shard gone")

    def short(pairs):
        return []

    scripts = {"Q-sql": [tc("SELECT 1"), tc("SELECT 1", "submit_solution")],
               "Q-submit": [tc("SELECT 1", "submit_solution")]}
    for fn, message in ((broken, "ConnectionError: shard gone"), (short, "returned 0 results for 1 calls")):
        sql, done = AgentLoop([task("Q-sql"), task("Q-submit")], sessions(2), ScriptedBackend(tok, scripts), fmt,
                              CFG, execute_many=fn).run()
        assert sql.stop_reason == "error" and message in sql.error and sql.error.startswith("the session failed")
        assert sql.turns[0].error == sql.error
        assert done.stop_reason == "submitted"
