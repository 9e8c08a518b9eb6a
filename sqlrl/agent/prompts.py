"""The prompts an agent starts from: a system message and a user message per task.

``build_messages(task, schema, mode, dialect)`` returns chat messages (``[{"role", "content"}]``);
``tools_for(mode)`` returns the tool schemas to pass to the chat template as ``tools=`` (``None``
in single-turn mode).

Guarantees:
- The system message states the role, the SQL dialect (its descriptor's ``display_name``), the
  database schema in the rendering ``schema_style()`` names (``SCHEMA_STYLES``: ``create``, the
  default -- ``CREATE TABLE`` statements, ``DatabaseSchema.to_create_sql`` -- or ``compact``, one
  line per table, ``DatabaseSchema.to_compact``, about half the tokens; both in that dialect; a
  note to explore it when no schema is given) and, per mode, how to answer: agentic -- the tools
  (names from ``sqlrl.tools.TOOLS``), one call per turn in the parser's syntax, ``submit_solution``
  ends the episode; single -- ``<thought>…</thought><solution>…</solution>``, exactly the format
  ``sqlrl.rewards.parse.extract_single`` accepts.
- The job line and the user message are the task kind's (``sqlrl.tasks.kinds``:
  ``TaskKind.job``, ``TaskKind.user_prompt``). The user message holds what a user would give and
  nothing of the answer: for a ``CriticTask`` the problem (``task.query``) and the issue SQL --
  never ``sol_sql``, test cases or ``meta`` (which may hold a bug description); for a
  ``Text2SQLTask`` the question and the evidence -- never ``gold_sql``.
- Deterministic: the same inputs give the same messages.
- A checkpoint records the rendering it was trained with (``record_schema_style`` writes
  ``<checkpoint>/sqlrl_prompt.json``; ``checkpoint_schema_style`` reads it back), so a stage that
  starts from it, inference and serving prompt it the same way; a checkpoint without the file was
  trained before the record existed, with ``$SQLRL_SCHEMA_STYLE`` or the default.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

from sqlrl.db.dialects.descriptor import dialect_of
from sqlrl.rewards.parse import STYLES
from sqlrl.tasks.kinds import kind_of
from sqlrl.tasks.schema import DatabaseSchema
from sqlrl.tasks.types import Task, norm_dialect
from sqlrl.tools import TOOLS, tool_schemas

from .parsers import get_parser

MODES = ("agentic", "single")

_STYLE = STYLES["birdrl"]

# How the schema is shown: SFT, RL, inference and serving all render it here, so a checkpoint is
# always prompted the way it was trained. A stage's ``model.schema_style`` (else $SQLRL_SCHEMA_STYLE)
# picks one (docs/curriculum.md, "Cheaper tokens"); the checkpoint records it (PROMPT_RECORD).
SCHEMA_STYLES: dict[str, Callable[[DatabaseSchema, str], str]] = {
    "compact": lambda schema, dialect: (f"The database `{schema.db_id}` has these tables "
                                        f"(column type, PK = primary key, -> = foreign key):\n"
                                        f"{schema.to_compact(dialect)}"),
    "create": lambda schema, dialect: (f"The database `{schema.db_id}` has this schema:\n\n"
                                       f"{schema.to_create_sql(dialect)}"),
}
DEFAULT_SCHEMA_STYLE = "create"  # the long preset uses compact; the 16-task default job broke with it (docs/curriculum.md)


def schema_style(name: str | None = None) -> str:
    """The schema rendering to use: ``name``, else ``$SQLRL_SCHEMA_STYLE``, else
    ``DEFAULT_SCHEMA_STYLE``; an unknown name is a ``ValueError`` listing the known ones."""
    source = "schema_style" if name else "SQLRL_SCHEMA_STYLE"
    name = name or os.environ.get("SQLRL_SCHEMA_STYLE") or DEFAULT_SCHEMA_STYLE
    if name not in SCHEMA_STYLES:
        raise ValueError(f"{source}={name!r} is not a schema style; known: {', '.join(SCHEMA_STYLES)}")
    return name


PROMPT_RECORD = "sqlrl_prompt.json"  # in a checkpoint folder: how its prompts were rendered


def record_schema_style(checkpoint: str | Path, style: str) -> None:
    """Write the rendering ``checkpoint`` was trained with next to its weights."""
    Path(checkpoint, PROMPT_RECORD).write_text(json.dumps({"schema_style": schema_style(style)}) + "\n")


def checkpoint_schema_style(checkpoint: str | Path) -> str | None:
    """The rendering a checkpoint folder records, or None (a model name, or a checkpoint made before
    the record existed). A record that cannot be read, or names an unknown style, is a ``ValueError``."""
    path = Path(checkpoint, PROMPT_RECORD)
    if not path.is_file():
        return None
    try:
        style = json.loads(path.read_text())["schema_style"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not a prompt record ({exc!r})") from None
    if style not in SCHEMA_STYLES:
        raise ValueError(f"{path}: schema_style {style!r} is not a schema style; known: {', '.join(SCHEMA_STYLES)}")
    return style


def check_checkpoint_style(checkpoint: str | Path, style: str, fix: str) -> None:
    """``ValueError`` when ``checkpoint`` records another rendering than ``style`` (``fix``: how the
    caller's user sets it); a model name or a checkpoint without a record passes."""
    trained = checkpoint_schema_style(checkpoint)
    if trained is not None and trained != style:
        raise ValueError(f"{checkpoint} was trained with schema_style {trained!r}, but the prompts would render "
                         f"{style!r}: {fix.format(trained)} so the model is prompted the way it learned")


def tools_for(mode: str) -> list[dict[str, Any]] | None:
    _check_mode(mode)
    return tool_schemas() if mode == "agentic" else None


def build_messages(task: Task | Any, schema: DatabaseSchema | None, mode: str = "agentic",
                   dialect: str | None = None, parser: str = "hermes",
                   style: str | None = None) -> list[dict[str, Any]]:
    """``style``: the schema rendering (``SCHEMA_STYLES``); None = ``schema_style()``'s choice."""
    _check_mode(mode)
    dialect = norm_dialect(dialect or task.dialect)
    style = schema_style(style)
    user = kind_of(task).user_prompt(task)  # a labelled task or an unlabelled request
    return [{"role": "system", "content": _system(task, schema, mode, dialect, parser, style)},
            {"role": "user", "content": user}]


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; known: {', '.join(MODES)}")


def _system(task: Task | Any, schema: DatabaseSchema | None, mode: str, dialect: str, parser: str,
            style: str) -> str:
    name = dialect_of(dialect).display_name
    job = kind_of(task).job
    parts = [f"You are an expert {name} database engineer. Your job: {job}. "
             f"Write SQL for {name} only."]
    if schema is not None and schema.tables:
        parts.append(SCHEMA_STYLES[style](schema, dialect))
    else:
        hint = ("explore it with execute_sql" if mode == "agentic"
                else "use the names the question suggests")
        parts.append(f"The database schema is not given; {hint}.")
    parts.append(_HOW[mode](parser))
    return "\n\n".join(parts)


def _agentic_how(parser: str) -> str:
    p = get_parser(parser)
    run, submit = TOOLS["execute_sql"].name, TOOLS["submit_solution"].name
    return (f"You work in your own session on a scratch copy of the database. Tools:\n"
            f"- {run}(sql): runs SQL and shows the result or the error. Changes persist across "
            "your calls (temporary tables, inserts, updates); the original database is never "
            "modified.\n"
            f"- {submit}(sql): submits your final SQL and ends the episode. It is graded on a fresh "
            "copy of the database, so include every statement the solution needs.\n"
            "Every turn: think briefly, then make exactly ONE tool call and stop; the result comes "
            f"back in the next message. A call looks like:\n{p.example}\n"
            f"Check your SQL with {run} before you submit it with {submit}.")


def _single_how(parser: str) -> str:
    t, a = _STYLE.think_tag, _STYLE.answer_tag
    return (f"Answer in exactly this format and nothing else:\n<{t}>your step-by-step reasoning"
            f"</{t}>\n<{a}>the final SQL</{a}>\nThe SQL may be several statements separated by ';'.")


_HOW: dict[str, Callable[[str], str]] = {"agentic": _agentic_how, "single": _single_how}

