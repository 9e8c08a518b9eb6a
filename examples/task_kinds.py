"""What the example agents make of a task: the kinds of task they handle, and how they say each to the model.

A task the training gateway hands out says its ``kind`` (docs/gateway.md, "Task payloads"). The
example agents handle two, each with its own prompt:

- ``text2sql``: ``question`` (+ ``evidence``) -- write SQL that answers it.
- ``critic`` (a debugging task, BIRD-CRITIC style): ``problem`` + ``issue_sql`` -- the user's SQL
  does not do what they need; write SQL that does.

Each agent module names the kinds it handles (``KINDS``), and ``examples/run_clients.py`` declares
them when it claims (``POST /v1/rollouts {"kinds": [...]}``; ``--kinds`` narrows them, e.g. a client
that only does text-to-SQL: ``--kinds text2sql``): the gateway then hands it tasks of those kinds
only. A task of another kind -- a client that declares nothing (``--kinds any``), or a gateway that
does not read the declaration -- is still refused before the agent makes a call: ``check_kind``
raises ``UnsupportedTask``; ``run_clients`` counts it ``refused`` and leaves the rollout to expire
(never scored as the policy's answer). A task without ``kind`` (one written by hand for the
command line) is a text-to-SQL task. Plain Python; no sqlrl import.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping


class UnsupportedTask(ValueError):
    """A task of a kind this agent does not handle (raised before any model call)."""


def _question(task: Mapping[str, Any]) -> str:
    return f"Question: {task['question']}\n{task.get('evidence') or ''}".strip()


def _debug(task: Mapping[str, Any]) -> str:
    issue = "\n".join(s.strip() for s in task["issue_sql"])
    return (f"Problem: {task['problem']}\n\nMy SQL, which does not do what I need:\n```sql\n{issue}\n```\n\n"
            "Write SQL that solves my problem.")


# kind -> the user's request as text (the agents' user message)
REQUESTS: dict[str, Callable[[Mapping[str, Any]], str]] = {"text2sql": _question, "critic": _debug}


def kind_of(task: Mapping[str, Any]) -> str:
    return str(task.get("kind") or "text2sql")


def check_kind(task: Mapping[str, Any], handles: tuple[str, ...] = tuple(REQUESTS)) -> str:
    """The task's kind; ``UnsupportedTask`` when it is not one of ``handles``."""
    kind = kind_of(task)
    if kind not in handles:
        raise UnsupportedTask(f"task {task.get('task_id')!r} is a {kind!r} task; this agent handles "
                              f"{', '.join(handles)}")
    return kind


def request_text(task: Mapping[str, Any]) -> str:
    """What the user asks, as the agents' user message (``check_kind`` first)."""
    return REQUESTS[check_kind(task)](task)
