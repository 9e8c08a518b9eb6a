"""Rewards: a registry of pure scoring functions, each returning a breakdown of named parts.

A reward is computed in three steps, only the middle one touching a database:
``extract`` (parse.py: the SQL in a response, and whether its format is right) →
``Judge`` (judge.py: execute prediction and gold → a verdict) → ``score`` (here: a pure function
of task, extraction, verdict and config → ``RewardBreakdown``). ``compute``/``compute_batch`` run
the three; tests call the scorers directly with hand-made verdicts.

Registered rewards (``REWARDS``):

| name | task | response | score |
|---|---|---|---|
| ``critic_single`` | debugging | ``<thought>…</thought><solution>…</solution>`` | share of test cases passed |
| ``critic_agentic`` | debugging | tool calls; the last ``submit_solution`` | share of test cases passed |
| ``bird_ex_single`` / ``spider_ex_single`` | text-to-SQL | thought/solution | 1 on EX match |
| ``bird_ex_agentic`` / ``spider_ex_agentic`` | text-to-SQL | tool calls | 1 on EX match |
| ``sqlr1`` | text-to-SQL | ``<think>…</think><answer>```sql…```</answer>`` | SQL-R1 composite |
| ``hybrid_single`` / ``hybrid_agentic`` | any kind | either | the reward the task's kind names (``TaskKind.rewards``); one more part per ``RewardSpec.flag`` (``is_critic``): 1 for the reward it routed to |
| ``hybrid_single_shaped`` / ``hybrid_agentic_shaped`` | any kind | either | the hybrid score ``s`` lifted to ``0.1 + 0.9 s`` when the answer is well-formed, its SQL ran and the engine attested it only read |

Guarantees — **fail-closed**, the property every reward here is tested for:
- A malformed response scores 0 (SQL-R1: −1 format, nothing else): its SQL is never executed.
- A prediction that errors, times out or returns too many rows scores 0 (SQL-R1: −2 execution,
  no result or length term). There is no consolation reward for an error, whatever the gold
  returns (BIRD-RL gives 0.1, and 1.0 when the gold result is empty).
- A gold (or BIRD-CRITIC ``sol_sql``) that errors makes the sample ``excluded=True`` with score 0:
  flagged, never rewarded (SQL-R1's comparator calls a failing gold a match).
- Within one reward, every breakdown has the same ``parts`` keys (hybrid included), so a batch's
  parts can be averaged and logged column by column.
- Shaping (``RewardSpec.executed_floor``, the ``*_shaped`` rewards, for RL only): a well-formed
  answer whose SQL ran **and that the database engine attested only read** (the verdict's
  ``read_only`` is True: ``QueryResult.read_only``, docs/rewards.md) earns at least the floor, so
  a group whose samples all fail still ranks "submitted a runnable query" above "ran out of
  turns" or "malformed". A write, DDL or PRAGMA, or an answer the engine did not attest (``None``:
  MariaDB/MySQL, SQL Server, Oracle, PostgreSQL statements that are not streamed) gets the plain
  score: the floor is never read from the SQL text. The fail-closed rules above still hold --
  malformed, erroring, timed-out and excluded samples score 0 -- the ``result`` part is unchanged
  (success and pass rates never count the floor), and a solved task still scores exactly 1,
  whatever its SQL is (a debugging task's fix may be DML), so solving stays the only way to the
  top score.
- Test-suite match (``RewardConfig.test_suite``, off by default): a text-to-SQL answer earns the
  result part only when it matches the gold on the original database **and** on every variant of
  the gold's distilled suite (the ``Judge`` runs them: it must be built with ``suites``, else
  scoring raises ``ValueError``); every breakdown then has a ``lucky_match`` part, 1 when the
  original's match would have earned a result part the suite takes away (reason
  ``lucky-match: …``), 0 otherwise (debugging tasks included).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Sequence

from sqlrl.eval.critic import CriticVerdict, OutcomeKind
from sqlrl.tasks.kinds import kind_of
from sqlrl.tasks.types import CriticTask, Text2SQLTask

from .judge import ExecVerdict, Judge
from .parse import Extracted, extract_agentic, extract_single


@dataclass(frozen=True)
class SQLR1Config:
    """SQL-R1's progressive reward (Ma et al., 2025, §2.3.3). Lengths are in characters here
    (the paper counts tokens; the reward actor has no tokenizer), so ``max_length`` should be the
    response budget in characters (≈ 4 × the token budget)."""

    format: float = 1.0  # ±format when the format is right / wrong
    execution: float = 2.0  # ±execution when the SQL runs / fails
    result: float = 3.0  # ±result when the result matches / does not
    max_length: int = 8192
    length_weight: float = 1.0  # scales the length term, which lies in [0, 1] (times this)
    over_length: float = -0.5  # the length term when the response exceeds max_length
    length_needs_match: bool = True  # only a correct answer earns the length term (our choice)
    semantics: str = "bird"  # which EX decides "result": "bird" (set) or "spider" (bag/order)


@dataclass(frozen=True)
class RewardConfig:
    format_style: str = "birdrl"  # parse.STYLES key for single-turn rewards
    sqlr1: SQLR1Config = field(default_factory=SQLR1Config)
    # test-suite execution match (module doc): the result part only for a match on the original
    # database and every variant of the gold's distilled suite; built and cached in test_suite_dir
    test_suite: bool = False
    test_suite_dir: str = ""

    def __post_init__(self) -> None:
        if self.test_suite and not self.test_suite_dir:
            raise ValueError("reward.test_suite needs reward.test_suite_dir (a folder in the run "
                             "dir where database variants and suites are cached)")


@dataclass(frozen=True)
class RewardBreakdown:
    score: float
    parts: dict[str, float]
    excluded: bool = False  # the reference is broken: drop from the learning signal
    reason: str = ""  # why the score is what it is ("ok", "format", "pred-error", "gold-error", …)
    sql: str | None = None  # the SQL that was graded
    read_only: bool | None = None  # the engine attested the graded SQL only read (None: unknown)


# -- scorers (pure) -------------------------------------------------------------------------------

_BASIC_KEYS = ("format", "executed", "result")


def _basic(score_ok: float, ex: Extracted, executed: bool, reason: str, excluded: bool = False,
           read_only: bool | None = None) -> RewardBreakdown:
    score = 0.0 if (excluded or not ex.format_ok) else score_ok
    return RewardBreakdown(score, {"format": float(ex.format_ok), "executed": float(executed),
                                   "result": 0.0 if excluded else score_ok},
                           excluded, reason, ex.sql, read_only if executed else None)


def score_critic(task: CriticTask, ex: Extracted, verdict: CriticVerdict | None,
                 config: RewardConfig) -> RewardBreakdown:
    if not ex.format_ok or verdict is None:
        return _basic(0.0, ex, False, f"format: {ex.problem}")
    if verdict.sol_error is not None:
        return _basic(0.0, ex, False, f"gold-error: {verdict.sol_error}", excluded=True)
    failed = {o.kind for o in verdict.outcomes}
    executed = not failed & {OutcomeKind.PRED_ERROR, OutcomeKind.PRED_TIMEOUT}
    reason = "ok" if verdict.solved else ",".join(sorted(k.value for k in failed - {OutcomeKind.PASSED}))
    return _basic(verdict.score, ex, executed, reason, read_only=verdict.read_only)


def _ex_scorer(semantics: str) -> Callable[..., RewardBreakdown]:
    def score(task: Text2SQLTask, ex: Extracted, verdict: ExecVerdict | None,
              config: RewardConfig) -> RewardBreakdown:
        if not ex.format_ok or verdict is None:
            return _basic(0.0, ex, False, f"format: {ex.problem}")
        if verdict.gold_error is not None:
            return _basic(0.0, ex, verdict.executed, f"gold-error: {verdict.gold_error}", True)
        if not verdict.executed:
            return _basic(0.0, ex, False, f"pred-error: {verdict.pred_error}")
        match = verdict.bird_match if semantics == "bird" else verdict.spider_match
        return _basic(float(match), ex, True, "ok" if match else "wrong-result",
                      read_only=verdict.read_only)
    return score


def score_sqlr1(task: Text2SQLTask, ex: Extracted, verdict: ExecVerdict | None,
                config: RewardConfig) -> RewardBreakdown:
    c = config.sqlr1
    parts = {"format": -c.format, "execution": 0.0, "result": 0.0, "length": 0.0}
    if not ex.format_ok or verdict is None:
        return RewardBreakdown(sum(parts.values()), parts, False, f"format: {ex.problem}", ex.sql)
    parts["format"] = c.format
    if verdict.gold_error is not None:
        zero = {k: 0.0 for k in parts}
        return RewardBreakdown(0.0, zero, True, f"gold-error: {verdict.gold_error}", ex.sql)
    if not verdict.executed:
        parts["execution"] = -c.execution
        return RewardBreakdown(sum(parts.values()), parts, False,
                               f"pred-error: {verdict.pred_error}", ex.sql)
    parts["execution"] = c.execution
    match = verdict.bird_match if c.semantics == "bird" else verdict.spider_match
    parts["result"] = c.result if match else -c.result
    if match or not c.length_needs_match:
        parts["length"] = c.length_weight * sqlr1_length(ex, c)
    return RewardBreakdown(sum(parts.values()), parts, False,
                           "ok" if match else "wrong-result", ex.sql, verdict.read_only)


def sqlr1_length(ex: Extracted, c: SQLR1Config) -> float:
    """SQL-R1's length term in [0, 1]: half from the response length relative to the maximum,
    half from the share of the answer block that is SQL (penalising prose around the SQL);
    ``c.over_length`` when the response is longer than ``c.max_length``."""
    if ex.response_chars > c.max_length:
        return c.over_length
    total = min(1.0, ex.response_chars / c.max_length)
    sql_share = min(1.0, len(ex.sql or "") / ex.answer_chars) if ex.answer_chars else 0.0
    return 0.5 * total + 0.5 * sql_share


# -- test-suite match (an option of every text-to-SQL scorer) ---------------------------------------

def _on_suite(scorer: Callable[..., RewardBreakdown], task: Any, ex: Extracted, verdict: Any,
              config: RewardConfig) -> RewardBreakdown:
    """``scorer``'s breakdown judged on the test suite (``config.test_suite``): the matches become
    the suite's, and ``lucky_match`` is 1 when the original's match earned a result part the
    suite takes away. Without the option the breakdown is ``scorer``'s own."""
    plain = scorer(task, ex, verdict, config)
    if not config.test_suite:
        return plain
    if not isinstance(verdict, ExecVerdict):  # a debugging task, or nothing ran: no lucky match
        return RewardBreakdown(plain.score, {**plain.parts, "lucky_match": 0.0}, plain.excluded,
                               plain.reason, plain.sql, plain.read_only)
    if (verdict.bird_match or verdict.spider_match) and not verdict.suite_checked:
        raise ValueError("reward.test_suite is on but the Judge has no test suites "
                         "(Judge(..., suites=TestSuites(test_suite_dir)))")
    b = scorer(task, ex, replace(verdict, bird_match=verdict.bird_suite,
                                 spider_match=verdict.spider_suite), config)
    lucky = plain.parts.get("result", 0.0) > b.parts.get("result", 0.0)
    reason = f"lucky-match: differs on {verdict.suite_failed_on}" if lucky else b.reason
    return RewardBreakdown(b.score, {**b.parts, "lucky_match": float(lucky)}, b.excluded, reason,
                           b.sql, b.read_only)


# -- the registry ------------------------------------------------------------------------------

@dataclass(frozen=True)
class RewardSpec:
    name: str
    task_kind: str  # the TaskKind.scored_as it scores ("text2sql", "critic"), or "any"
    response: str  # "single" (text) or "agentic" (tool calls)
    scorer: Callable[..., RewardBreakdown] | None  # None: hybrid (routes by the task's kind)
    keys: tuple[str, ...] = _BASIC_KEYS
    style: str | None = None  # a fixed single-turn format style (sqlr1), else config.format_style
    executed_floor: float = 0.0  # shaping: a well-formed answer whose SQL ran read-only scores >= this (module doc)
    flag: str = ""  # a hybrid reward's part that is 1.0 when it routes a task here, else 0.0 ("is_critic")

    def __post_init__(self) -> None:
        if not 0.0 <= self.executed_floor < 1.0:
            raise ValueError(f"reward {self.name!r}: executed_floor must be in [0, 1), got {self.executed_floor!r}")


_SCORED = (  # the rewards that score a kind of task themselves
    RewardSpec("critic_single", "critic", "single", score_critic, flag="is_critic"),
    RewardSpec("critic_agentic", "critic", "agentic", score_critic, flag="is_critic"),
    RewardSpec("bird_ex_single", "text2sql", "single", _ex_scorer("bird")),
    RewardSpec("bird_ex_agentic", "text2sql", "agentic", _ex_scorer("bird")),
    RewardSpec("spider_ex_single", "text2sql", "single", _ex_scorer("spider")),
    RewardSpec("spider_ex_agentic", "text2sql", "agentic", _ex_scorer("spider")),
    RewardSpec("sqlr1", "text2sql", "single", score_sqlr1,
               ("format", "execution", "result", "length"), style="sqlr1"),
)
FLAGS = tuple(dict.fromkeys(s.flag for s in _SCORED if s.flag))  # every hybrid breakdown has each
_HYBRID_KEYS = _BASIC_KEYS + FLAGS

REWARDS: dict[str, RewardSpec] = {s.name: s for s in (
    *_SCORED,
    RewardSpec("hybrid_single", "any", "single", None, _HYBRID_KEYS),
    RewardSpec("hybrid_agentic", "any", "agentic", None, _HYBRID_KEYS),
    # BIRD-RL gives a runnable-but-wrong answer a small reward too (0.1); here only when it is
    # well-formed and ran, and the engine attested it only read; never for an error.
    RewardSpec("hybrid_single_shaped", "any", "single", None, _HYBRID_KEYS, executed_floor=0.1),
    RewardSpec("hybrid_agentic_shaped", "any", "agentic", None, _HYBRID_KEYS, executed_floor=0.1),
)}


def _scores(spec: RewardSpec, task: Any) -> bool:
    """Whether ``spec`` (a non-hybrid reward) scores ``task``: its kind is scored as the reward's."""
    try:
        return kind_of(task).scored_as == spec.task_kind
    except TypeError:  # not a task
        return False


def get_reward(name: str) -> RewardSpec:
    if name not in REWARDS:
        raise KeyError(f"unknown reward {name!r}; registered: {', '.join(REWARDS)}")
    return REWARDS[name]


def excluded(name: str, reason: str) -> RewardBreakdown:
    """The breakdown of a row reward ``name`` does not score (``reason``: a failed rollout, a scorer
    that raised or timed out): excluded -- neither reward nor penalty --, every part of the reward 0."""
    return RewardBreakdown(0.0, {k: 0.0 for k in get_reward(name).keys}, True, reason)


def extract(spec: RewardSpec, response: Any, config: RewardConfig) -> Extracted:
    if spec.response == "agentic":
        if isinstance(response, (str, bytes)) or not isinstance(response, Iterable):
            return Extracted(None, False, "an agentic reward needs the trajectory's tool calls")
        return extract_agentic(response)
    return extract_single(response, spec.style or config.format_style)


def judge_task(task: Any, ex: Extracted, judge: Judge) -> Any:
    """Run the prediction (nothing is executed for a malformed response)."""
    if not ex.format_ok:
        return None
    return kind_of(task).judge(judge, task, ex.sql)


def score(name: str, task: Any, ex: Extracted, verdict: Any,
          config: RewardConfig = RewardConfig()) -> RewardBreakdown:
    """The pure part: a breakdown from an extraction and a verdict."""
    spec = get_reward(name)
    kind = getattr(task, "kind", None)
    if spec.scorer is None:  # hybrid: the reward the task's kind names for this response shape
        routed = get_reward(kind_of(task).rewards[spec.response])
        b = _on_suite(routed.scorer, task, ex, verdict, config)
        parts = {k: b.parts.get(k, 0.0) for k in _BASIC_KEYS}
        parts.update({f: float(f == routed.flag) for f in FLAGS})
        if config.test_suite:
            parts["lucky_match"] = b.parts["lucky_match"]
        return _shaped(spec, RewardBreakdown(b.score, parts, b.excluded, b.reason, b.sql,
                                             b.read_only))
    if not _scores(spec, task):
        raise ValueError(f"reward {name!r} scores {spec.task_kind} tasks, got a {kind} task "
                         f"(use a hybrid reward for mixed batches)")
    b = _on_suite(spec.scorer, task, ex, verdict, config)
    assert tuple(b.parts) == spec.keys + (("lucky_match",) if config.test_suite else ()), (b.parts, spec.keys)
    return _shaped(spec, b)


def _shaped(spec: RewardSpec, b: RewardBreakdown) -> RewardBreakdown:
    """``spec.executed_floor`` applied: the score ``s`` of a well-formed, executed, non-excluded
    answer that the engine attested only read (``b.read_only is True``; None is not enough)
    becomes ``floor + (1 - floor) * s``; every other breakdown, and every part, is unchanged."""
    f = spec.executed_floor
    if (f <= 0.0 or b.excluded or b.read_only is not True or b.parts.get("format", 0.0) < 1.0
            or b.parts.get("executed", 0.0) < 1.0):
        return b
    return RewardBreakdown(f + (1.0 - f) * b.score, b.parts, b.excluded, b.reason, b.sql,
                           b.read_only)


def compute(name: str, task: Any, response: Any, judge: Judge,
            config: RewardConfig = RewardConfig()) -> RewardBreakdown:
    """Extract, execute, score one response."""
    spec = get_reward(name)
    if spec.scorer is not None and not _scores(spec, task):
        return score(name, task, Extracted(None, False), None, config)  # raises the type error
    ex = extract(spec, response, config)
    return score(name, task, ex, judge_task(task, ex, judge), config)


def compute_batch(name: str, items: Sequence[tuple[Any, Any]], judge: Judge,
                  config: RewardConfig = RewardConfig()) -> list[RewardBreakdown]:
    return [compute(name, task, response, judge, config) for task, response in items]


def batch_means(breakdowns: Sequence[RewardBreakdown]) -> dict[str, float]:
    """Mean score and parts over the non-excluded samples, plus the excluded count (for logs)."""
    kept = [b for b in breakdowns if not b.excluded]
    out: dict[str, float] = {"excluded": float(len(breakdowns) - len(kept))}
    if kept:
        out["score"] = sum(b.score for b in kept) / len(kept)
        for key in kept[0].parts:
            out[key] = sum(b.parts.get(key, 0.0) for b in kept) / len(kept)
    return out
