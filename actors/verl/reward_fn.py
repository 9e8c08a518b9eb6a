"""sqlrl's rewards as a verl reward function: ``compute_score(data_source, solution_str,
ground_truth, extra_info, **reward_kwargs)``.

verl loads it by file path (``reward.custom_reward_function.path: actors/verl/reward_fn.py``,
``name: compute_score``) and passes ``reward.custom_reward_function.reward_kwargs`` as keyword
arguments: ``reward`` (a ``sqlrl.rewards.REWARDS`` name; ``hybrid_agentic`` for stage 4,
``hybrid_single`` for stage 3) and ``catalog`` (a JSON file or mapping ``{db_id: {dialect: url}}``).
Everything else is ``sqlrl.rewards``: parse -> ``Judge`` (execution; gold once per task per
process) -> the registry's pure scorer. No ``if data_source == …`` branch: the task's kind (from
``extra_info.task``, written by ``sqlrl.tasks.loaders.verl``) routes the hybrid rewards.

Guarantees (fail-closed, as every sqlrl reward):
- The agentic response is the trajectory's tool calls (``extra_info.sqlrl_tool_calls``, from
  ``actors.verl.agent_loop``), never a re-parse of the decoded text; no calls -> format 0, score 0.
- Returns ``{"score", <the reward's parts>, "excluded"}`` with the same keys for every call of one
  reward (verl averages them column by column). ``excluded`` is 1.0 when the sample must not be
  rewarded: a failing gold, a row without a readable task, a ``ground_truth`` that is not the
  task's own, or any error inside scoring -- always with score 0.
- Never raises for a row or a response; a ``reward`` name that is not registered raises
  ``KeyError`` (a configuration error, found on the first call).
"""

from __future__ import annotations

import json
import threading
from typing import Any, Mapping

from sqlrl.rewards import Judge, RewardBreakdown, compute, get_reward
from sqlrl.tasks.kinds import kind_of, task_from_dict

from .sessions import load_catalog

DEFAULT_REWARD = "hybrid_agentic"
_JUDGES: dict[str, Judge] = {}
_JUDGES_LOCK = threading.Lock()


def judge_for(catalog: Any) -> Judge:
    """One ``Judge`` per catalog in this process (its gold cache is shared by all calls)."""
    catalog = load_catalog(catalog)
    key = json.dumps(catalog, sort_keys=True)
    with _JUDGES_LOCK:
        if key not in _JUDGES:
            _JUDGES[key] = Judge(catalog)
        return _JUDGES[key]


def _result(b: RewardBreakdown) -> dict[str, float]:
    return {"score": float(b.score), **{k: float(v) for k, v in b.parts.items()},
            "excluded": float(b.excluded)}


def _excluded(reward: str) -> dict[str, float]:
    keys = get_reward(reward).keys
    return {"score": 0.0, **{k: 0.0 for k in keys}, "excluded": 1.0}


def compute_score(data_source: str, solution_str: str, ground_truth: str,
                  extra_info: Mapping[str, Any] | None = None, *, reward: str = DEFAULT_REWARD,
                  catalog: Any = None, **_: Any) -> dict[str, float]:
    """Score one verl sample with sqlrl's reward ``reward`` (see the module doc)."""
    spec = get_reward(reward)  # KeyError for an unknown name: configuration, not data
    extra_info = extra_info or {}
    try:
        record = extra_info.get("task")
        task = task_from_dict(json.loads(record) if isinstance(record, str) else record)
        if kind_of(task).ground_truth(task) != ground_truth:
            return _excluded(reward)  # the row's ground truth is not its task's: never reward it
        if spec.response == "agentic":
            response: Any = list(extra_info.get("sqlrl_tool_calls") or [])
        else:
            response = solution_str
        return _result(compute(reward, task, response, judge_for(catalog)))
    except Exception:  # fail closed: an error anywhere in scoring is never rewarded
        return _excluded(reward)
