"""Teachers: who writes the assistant side of the curriculum's SFT data.

A ``Teacher`` answers two questions about a task (and its schema, possibly ``None``):

- ``reasoning(task, schema) -> str``: a stage-1 single-turn response,
  ``<thought>…</thought>\\n<solution>…</solution>`` -- the format
  ``sqlrl.rewards.parse.extract_single`` (the loop's single-turn parser) accepts;
- ``next_turn(task, schema, messages) -> str``: the next assistant message of a multi-turn tool
  trajectory, given the conversation so far as ``AgentLoop`` keeps it (system, user, then
  assistant messages with ``tool_calls`` and ``tool`` messages). The text is exactly what the model
  should emit in the hermes syntax: a short reasoning, then ``\\n<tool_call>\\n{"name": …,
  "arguments": {…}}\\n</tool_call>`` (the layout Qwen2.5's template renders a call in, so the SFT
  rendering of the parsed message reproduces the text).

``ProgrammaticTeacher`` (the default) is offline and deterministic: it reads the ground truth.
Text-to-SQL: the tables, columns, conditions, grouping and ordering of the gold SQL (parsed with
sqlglot) become the thought; a trajectory makes 1–3 ``execute_sql`` calls (a look at a relevant
table, distinct values of a filtered column, a row count, and always a run of the gold query as
the last check) and then submits the gold SQL. Debugging (``CriticTask``): it runs the issue SQL,
sometimes inspects a table, names the differences between the issue and the solution (a token
diff with sqlglot's tokenizer), tests the fix and submits ``sol_sql``: 2–3 calls.
``brief=True`` keeps stage-1 thoughts short (text-to-SQL: where the data is and the conditions,
grouping and ordering; debugging: only the fix) -- for micro-scale models whose generation budget
is a few hundred tokens; the trajectories of stage 2 are the same either way. ``explore=N`` caps a
trajectory's exploration calls (the looks before the final check) at N: ``explore=0`` makes every
trajectory "run the answer, submit it" (debugging: run the given SQL, test the fix, submit) -- short
trajectories for models that otherwise imitate the exploring and never submit within ``max_turns``
(measured on the long preset, issue 19); ``None`` keeps the drawn 0-2. The teacher reads
a task through its kind (``sqlrl.tasks.kinds``: ``problem``, ``reference``, ``given_sql``): a task
that hands over SQL to fix gets the debugging flow, any other the text-to-SQL one, so a new task
kind needs no edit here.

Guarantees:
- Deterministic: the output depends only on (``seed``, the task, and for ``next_turn`` the
  conversation); the number and choice of exploration calls is drawn from a generator seeded by
  (``seed``, ``task_id``), so data varies across tasks but not across runs or processes.
- Never reads the database (it needs no session); SQL that sqlglot cannot parse still gets a
  response (with less specific reasoning). What a teacher returns is *not* trusted: the stage
  builders (``curriculum.builders``) parse, execute and grade every response before keeping it.
- Each ``next_turn`` response holds exactly one tool call; the last planned turn is
  ``submit_solution`` with the reference SQL, and asking beyond the plan repeats it.
"""

from __future__ import annotations

import difflib
import json
import random
import re
from dataclasses import dataclass
from typing import Any, Protocol, Sequence

import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError

from sqlrl.db.dialects.descriptor import sqlglot_name
from sqlrl.rewards.parse import STYLES
from sqlrl.tasks.schema import DatabaseSchema
from sqlrl.tasks.kinds import joined_sql, kind_of
from sqlrl.tasks.types import Task

__all__ = ["Teacher", "ProgrammaticTeacher", "SqlFacts", "sql_facts", "sql_diff", "tool_call_text",
           "single_turn_text", "reference_sql"]

_STYLE = STYLES["birdrl"]


class Teacher(Protocol):
    """Writes assistant turns for SFT data (see the module doc)."""

    def reasoning(self, task: Task, schema: DatabaseSchema | None) -> str: ...

    def next_turn(self, task: Task, schema: DatabaseSchema | None,
                  messages: Sequence[dict[str, Any]]) -> str: ...


# -- formats ---------------------------------------------------------------------------------------

def single_turn_text(thought: str, sql: str) -> str:
    """``<thought>…</thought>\\n<solution>…</solution>`` (the single-turn format)."""
    t, a = _STYLE.think_tag, _STYLE.answer_tag
    return f"<{t}>\n{thought.strip()}\n</{t}>\n<{a}>\n{sql.strip()}\n</{a}>"


def tool_call_text(reason: str, name: str, sql: str) -> str:
    """A hermes tool-call turn laid out as Qwen2.5's chat template renders a parsed call."""
    body = json.dumps({"name": name, "arguments": {"sql": sql}}, ensure_ascii=False)
    head = reason.strip()
    return f"{head}\n<tool_call>\n{body}\n</tool_call>" if head else f"<tool_call>\n{body}\n</tool_call>"


def reference_sql(task: Task) -> str:
    """The task's reference answer as one SQL text (``TaskKind.reference``: a debugging task's
    statements joined by ';')."""
    return kind_of(task).reference(task)



# -- what a SQL text contains (sqlglot) --------------------------------------------------------------

@dataclass(frozen=True)
class SqlFacts:
    tables: tuple[str, ...]  # base tables in order of appearance (CTE names left out)
    columns: tuple[str, ...]
    conditions: tuple[str, ...]  # WHERE / HAVING predicates as SQL
    group_by: tuple[str, ...]
    aggregates: tuple[str, ...]
    order_by: tuple[str, ...]
    limit: str | None
    joins: int
    table_nodes: tuple[Any, ...] = ()  # sqlglot Table nodes (alias removed), for building queries
    filters: tuple[tuple[str, str, bool], ...] = ()  # (table, column, quoted): compared with a literal


def _uniq(items: Sequence[str]) -> tuple[str, ...]:
    seen: dict[str, None] = {}
    for item in items:
        if item and item not in seen:
            seen[item] = None
    return tuple(seen)


def sql_facts(sql: str, dialect: str = "sqlite") -> SqlFacts | None:
    """What ``sql`` reads and how; ``None`` when sqlglot cannot parse it."""
    read = sqlglot_name(dialect)
    try:
        trees = [t for t in sqlglot.parse(sql, read=read) if t is not None]
    except (SqlglotError, ValueError, RecursionError):
        return None
    if not trees:
        return None
    tables, nodes, columns, conds, groups, aggs, orders, filters = [], [], [], [], [], [], [], []
    limit, joins = None, 0
    for tree in trees:
        ctes = {c.alias_or_name.lower() for c in tree.find_all(exp.CTE)}
        aliases: dict[str, str] = {}
        for t in tree.find_all(exp.Table):
            if not t.name or t.name.lower() in ctes:
                continue
            aliases[(t.alias or t.name).lower()] = t.name
            if t.name not in tables:
                tables.append(t.name)
                node = t.copy()
                node.set("alias", None)
                nodes.append(node)
        columns += [c.name for c in tree.find_all(exp.Column) if c.name and c.name != "*"]
        for clause in (*tree.find_all(exp.Where), *tree.find_all(exp.Having)):
            conds.append(clause.this.sql(dialect=read))
        for cmp in tree.find_all(exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.Like):
            col, lit = cmp.this, cmp.expression
            if isinstance(col, exp.Column) and isinstance(lit, exp.Literal):
                table = aliases.get(col.table.lower()) if col.table else (tables[0] if len(aliases) == 1 and tables else None)
                if table:
                    filters.append((table, col.name, bool(col.this.args.get("quoted"))))
        groups += [g.sql(dialect=read) for grp in tree.find_all(exp.Group) for g in grp.expressions]
        aggs += [a.sql(dialect=read) for a in tree.find_all(exp.AggFunc)]
        orders += [o.sql(dialect=read) for ordr in tree.find_all(exp.Order) for o in ordr.expressions]
        lim = tree.find(exp.Limit)
        if lim is not None and lim.expression is not None:
            limit = lim.expression.sql(dialect=read)
        joins += len(list(tree.find_all(exp.Join)))
    return SqlFacts(tuple(tables), _uniq(columns), _uniq(conds), _uniq(groups), _uniq(aggs),
                    _uniq(orders), limit, joins, tuple(nodes), tuple(dict.fromkeys(filters)))


def _tokens(sql: str, read: str) -> list[str]:
    try:
        toks = sqlglot.Dialect.get_or_raise(read).tokenize(sql)
    except (SqlglotError, ValueError):
        return sql.split()
    out = []
    for t in toks:
        name = t.token_type.name
        out.append(f"'{t.text}'" if name == "STRING" else t.text)
    return out


def sql_diff(before: str, after: str, dialect: str = "sqlite", limit: int = 4) -> list[str]:
    """Token-level differences from ``before`` to ``after`` (sqlglot's tokenizer), as short
    sentences such as "`MIN` should be `MAX`"; at most ``limit`` of them."""
    read = sqlglot_name(dialect)
    a, b = _tokens(before, read), _tokens(after, read)
    out: list[str] = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        old, new = " ".join(a[i1:i2]), " ".join(b[j1:j2])
        if tag == "replace":
            out.append(f"`{_cut(old)}` should be `{_cut(new)}`")
        elif tag == "delete":
            out.append(f"`{_cut(old)}` should not be there")
        elif tag == "insert":
            where = f" after `{a[i1 - 1]}`" if i1 > 0 else " at the start"
            out.append(f"`{_cut(new)}` is missing{where}")
    if len(out) > limit:
        out = out[:limit] + [f"and {len(out) - limit} more change(s)"]
    return out


def _cut(text: str, n: int = 80) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def _listing(items: Sequence[str], n: int = 4) -> str:
    items = [f"`{i}`" for i in items[:n]]
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


# -- observations ----------------------------------------------------------------------------------

_ROWS = re.compile(r"^\((?:first \d+ of )?(\d+) rows?(?: shown)?\)$")
_MORE = re.compile(r"^\(first \d+ rows shown; the result has more than (\d+) rows?\)$")


def _observed(messages: Sequence[dict[str, Any]]) -> str:
    """One sentence about the last tool result in ``messages`` ('' when there is none)."""
    if not messages or messages[-1].get("role") != "tool":
        return ""
    text = str(messages[-1].get("content", "")).strip()
    first, last = text.split("\n", 1)[0], text.rsplit("\n", 1)[-1]
    if text.startswith("Error"):
        return f"That gave an error: {_cut(first, 160)}."
    if text.startswith("OK"):
        return "That ran without an error."
    m = _ROWS.match(last)
    if m:
        n = int(m.group(1))
        return "It returned no rows." if n == 0 else f"It returned {n} row{'s' if n != 1 else ''}."
    m = _MORE.match(last)
    if m:
        return f"It returned more than {m.group(1)} rows."
    return "I see the result."


# -- the programmatic teacher ----------------------------------------------------------------------

@dataclass(frozen=True)
class _Step:
    reason: str
    tool: str
    sql: str


class ProgrammaticTeacher:
    """Ground-truth teacher: deterministic, offline (see the module doc)."""

    name = "programmatic"

    def __init__(self, seed: int = 0, brief: bool = False, explore: int | None = None) -> None:
        self.seed = int(seed)
        self.brief = bool(brief)  # short thoughts: what changes / where the data is, no restating
        if explore is not None and (isinstance(explore, bool) or not isinstance(explore, int) or explore < 0):
            raise ValueError(f"explore must be None or an integer >= 0, got {explore!r}")
        self.explore = explore  # cap on exploration calls per trajectory (None: as drawn, 0-2)

    def _cap(self, n: int) -> int:
        return n if self.explore is None else min(n, self.explore)

    def _rng(self, task: Task, what: str) -> random.Random:
        return random.Random(f"{self.seed}:{what}:{type(task).kind}:{task.task_id}")

    # -- stage 1 --

    def reasoning(self, task: Task, schema: DatabaseSchema | None) -> str:
        thought = self._fix_thought if _given_sql(task) else self._write_thought
        return single_turn_text(thought(task), reference_sql(task))

    def _write_thought(self, task: Task) -> str:
        """The thought for a task whose answer is written from scratch (text-to-SQL)."""
        facts = sql_facts(reference_sql(task), task.dialect)
        if self.brief:
            return "\n".join(_describe(facts, brief=True) or ["I write the query from the question."])
        lines = [f"The question asks: {kind_of(task).problem(task).strip()}"]
        evidence = getattr(task, "evidence", "").strip()
        if evidence:
            lines.append(f"The evidence tells me: {evidence}")
        lines += _describe(facts)
        lines.append("Putting this together gives the query below.")
        return "\n".join(lines)

    def _fix_thought(self, task: Task) -> str:
        """The thought for a task that hands over SQL to fix (debugging)."""
        issue, sol = joined_sql(_given_sql(task)), reference_sql(task)
        if self.brief:
            changes = sql_diff(issue, sol, task.dialect)
            return ("Fix: " + "; ".join(changes) + "." if changes
                    else "The SQL has to be rewritten for what the user needs.")
        lines = [f"The user needs: {_first_sentence(kind_of(task).problem(task))}"]
        if sql_facts(issue, task.dialect) is None:
            lines.append("Their SQL does not even parse, so there is a syntax problem to fix.")
        changes = sql_diff(issue, sol, task.dialect)
        if changes:
            lines.append("Comparing their SQL with what the task needs: " + "; ".join(changes) + ".")
        lines += _describe(sql_facts(sol, task.dialect))
        lines.append("With these changes the SQL does what the user asked.")
        return "\n".join(lines)

    # -- stage 2 --

    def next_turn(self, task: Task, schema: DatabaseSchema | None,
                  messages: Sequence[dict[str, Any]]) -> str:
        plan = self.plan(task)
        k = sum(1 for m in messages if m.get("role") == "assistant")
        step = plan[min(k, len(plan) - 1)]
        reason = " ".join(p for p in (_observed(messages), step.reason) if p)
        return tool_call_text(reason, step.tool, step.sql)

    def plan(self, task: Task) -> list[_Step]:
        """The whole trajectory this teacher makes for ``task``: calls, then the submission."""
        return self._fix_plan(task) if _given_sql(task) else self._write_plan(task)

    def _write_plan(self, task: Task) -> list[_Step]:
        rng = self._rng(task, "plan")
        gold = reference_sql(task)
        facts = sql_facts(gold, task.dialect)
        explore = _inspections(facts, task.dialect)
        rng.shuffle(explore)
        n = rng.randint(1, 3)
        steps = explore[: self._cap(n - 1)]
        need = _describe(facts, brief=True)
        check = rng.choice(["Let me run my query to check its result.",
                            "Let me try the query before submitting it.",
                            "I'll run the query to make sure it works."])
        steps.append(_Step(" ".join(need + [check]), "execute_sql", gold))
        done = rng.choice(["The result answers the question, so I submit the query.",
                           "This is what the question asks for; submitting.",
                           "The query works, so I submit it."])
        steps.append(_Step(done, "submit_solution", gold))
        return steps

    def _fix_plan(self, task: Task) -> list[_Step]:
        rng = self._rng(task, "plan")
        issue, sol = joined_sql(_given_sql(task)), reference_sql(task)
        steps = [_Step(rng.choice(["Let me first run the user's SQL to see what it does.",
                                   "First I'll run the SQL as given to see the problem."]),
                       "execute_sql", issue)]
        if rng.randint(2, 3) == 3 and self._cap(1):
            explore = _inspections(sql_facts(sol, task.dialect) or sql_facts(issue, task.dialect),
                                   task.dialect)
            if explore:
                steps.append(rng.choice(explore))
        changes = sql_diff(issue, sol, task.dialect)
        why = ("Looking at the SQL: " + "; ".join(changes) + "." if changes
               else "The SQL needs to be rewritten.")
        steps.append(_Step(f"{why} Let me test the corrected SQL.", "execute_sql", sol))
        steps.append(_Step(rng.choice(["The corrected SQL behaves as the user needs, so I submit it.",
                                       "That fixes the problem; submitting the corrected SQL."]),
                           "submit_solution", sol))
        return steps


def _given_sql(task: Task) -> tuple[str, ...]:
    """The SQL the task hands over to be fixed (``TaskKind.given_sql``); () for a task whose
    answer is written from scratch. It picks the teacher's flow: fix, or write."""
    return kind_of(task).given_sql(task)


def _first_sentence(text: str, n: int = 300) -> str:
    text = " ".join(text.split())
    m = re.search(r"(?<=[.?!])\s", text)
    return _cut(text[: m.start()] if m and m.start() > 20 else text, n)


def _describe(facts: SqlFacts | None, brief: bool = False) -> list[str]:
    if facts is None:
        return [] if brief else ["I write the SQL directly from the requirement."]
    out = []
    if facts.tables:
        how = f", joined ({facts.joins} join{'s' if facts.joins != 1 else ''})" if facts.joins else ""
        out.append(f"The data is in {_listing(facts.tables)}{how}.")
    if facts.columns and not brief:
        out.append(f"The columns involved are {_listing(facts.columns, 6)}.")
    if facts.conditions:
        out.append(f"Rows must satisfy {_listing(facts.conditions, 2)}.")
    if facts.group_by:
        out.append(f"Results are grouped by {_listing(facts.group_by)}.")
    if facts.aggregates and not brief:
        out.append(f"It needs the aggregate(s) {_listing(facts.aggregates)}.")
    if facts.order_by:
        lim = f", keeping {facts.limit} row(s)" if facts.limit else ""
        out.append(f"The result is ordered by {_listing(facts.order_by, 2)}{lim}.")
    return out


def _inspections(facts: SqlFacts | None, dialect: str) -> list[_Step]:
    """Exploratory queries on the tables and filtered columns the reference uses."""
    if facts is None:
        return []
    write = sqlglot_name(dialect)
    steps = []
    for node, name in list(zip(facts.table_nodes, facts.tables))[:2]:
        steps.append(_Step(f"Let me look at a few rows of `{name}`.", "execute_sql",
                           exp.select("*").from_(node.copy()).limit(3).sql(dialect=write)))
        steps.append(_Step(f"How many rows does `{name}` have?", "execute_sql",
                           exp.select(exp.Count(this=exp.Star())).from_(node.copy()).sql(dialect=write)))
    nodes = {n: node for node, n in zip(facts.table_nodes, facts.tables)}
    for table, column, quoted in facts.filters[:1]:
        if table in nodes:
            sql = (exp.select(exp.column(column, quoted=quoted)).distinct()
                   .from_(nodes[table].copy()).limit(5).sql(dialect=write))
            steps.append(_Step(f"Let me see which values `{column}` takes.", "execute_sql", sql))
    return steps
