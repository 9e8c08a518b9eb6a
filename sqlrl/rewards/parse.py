"""Getting the answer out of a model response — the only place response text is interpreted.

Two response shapes exist:
- **single-turn** text (stages 3 and inference): ``<thought>…</thought><solution>…</solution>``
  (BIRD-RL's tags; SQL-R1's ``<think>``/``<answer>`` are the ``sqlr1`` style). ``extract_single``
  checks the format strictly and returns the SQL inside the solution block.
- **agentic** tool calls (stage 4): the SQL of the *last* ``submit_solution`` call
  (``extract_agentic``).

Guarantees (what makes the format part of a reward hard to game):
- A response passes the format check only when it holds exactly one thought block followed by
  exactly one solution block, nothing but whitespace outside them, no nested or stray tags, and a
  non-empty solution. Anything else is ``format_ok=False`` with a ``problem`` naming the fault;
  the SQL is then *not* extracted (``sql=None``), so a malformed response cannot still score on
  execution.
- Code fences inside the solution (```` ```sql … ``` ````; the language tag may also be any
  name or alias of a registered engine, ``sqlrl.db.dialects.descriptor.find``) are removed; with
  ``require_fence=True`` (SQL-R1) a solution without one fails the format check.
- Never raises on any input string.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from sqlrl.db.dialects.descriptor import find


@dataclass(frozen=True)
class FormatStyle:
    think_tag: str
    answer_tag: str
    require_fence: bool = False


STYLES: dict[str, FormatStyle] = {
    "birdrl": FormatStyle("thought", "solution"),  # the curriculum's stage-3 format
    "sqlr1": FormatStyle("think", "answer", require_fence=True),
}

_FENCE = re.compile(r"^\s*```[ \t]*([A-Za-z]*)[ \t]*\n?(.*?)\n?[ \t]*```\s*$", re.S)


@dataclass(frozen=True)
class Extracted:
    """What a response contains: the SQL to grade (or None), and whether the format was right."""

    sql: str | None
    format_ok: bool
    problem: str = ""  # why the format check failed ("" when it passed)
    thought_chars: int = 0
    answer_chars: int = 0  # length of the solution block's content (SQL-R1's length term)
    response_chars: int = 0


def extract_single(response: str, style: FormatStyle | str = "birdrl") -> Extracted:
    """Strictly parse ``<think_tag>…</think_tag><answer_tag>…</answer_tag>``."""
    if isinstance(style, str):
        style = STYLES[style]
    if not isinstance(response, str):
        return Extracted(None, False, f"the response is {type(response).__name__}, not text")
    n = len(response)
    t, a = re.escape(style.think_tag), re.escape(style.answer_tag)
    counts = {tag: len(re.findall(f"<{tag}>", response)) for tag in (t, a)}
    closes = {tag: len(re.findall(f"</{tag}>", response)) for tag in (t, a)}
    for tag in (t, a):
        if counts[tag] != 1 or closes[tag] != 1:
            name = tag.replace("\\", "")
            return Extracted(None, False, f"expected exactly one <{name}>…</{name}> block, found "
                                          f"{counts[tag]} opening and {closes[tag]} closing tags",
                             response_chars=n)
    m = re.fullmatch(f"\\s*<{t}>(.*?)</{t}>\\s*<{a}>(.*?)</{a}>\\s*", response, re.S)
    if m is None:
        return Extracted(None, False, f"the response must be <{style.think_tag}>…</{style.think_tag}> "
                                      f"then <{style.answer_tag}>…</{style.answer_tag}>, with nothing "
                                      "else around them", response_chars=n)
    thought, answer = m.group(1), m.group(2)
    if not thought.strip():
        return Extracted(None, False, f"the <{style.think_tag}> block is empty", response_chars=n)
    sql, fenced = _unfence(answer)
    if style.require_fence and not fenced:
        return Extracted(None, False, "the SQL must be inside a ```sql … ``` block",
                         response_chars=n)
    if not sql.strip():
        return Extracted(None, False, f"the <{style.answer_tag}> block holds no SQL", response_chars=n)
    return Extracted(sql.strip(), True, "", len(thought), len(answer), n)


def _unfence(text: str) -> tuple[str, bool]:
    m = _FENCE.match(text)
    if m and (m.group(1).lower() in ("", "sql") or find(m.group(1)) is not None):
        return m.group(2), True
    if "```" in text:
        return "", False  # a stray or unbalanced fence: not a clean solution
    return text, False


def extract_agentic(tool_calls: Iterable[Any]) -> Extracted:
    """The last ``submit_solution`` call's SQL. ``tool_calls`` holds ``sqlrl.tools.ToolCall``
    objects or ``{"name": …, "arguments": {…}}`` dicts in the order the model made them; invalid
    calls are ignored (they were already answered with an error observation)."""
    last = None
    for call in tool_calls:
        name = getattr(call, "name", None) if not isinstance(call, Mapping) else call.get("name")
        args = (getattr(call, "arguments", None) if not isinstance(call, Mapping)
                else call.get("arguments"))
        if name == "submit_solution" and isinstance(args, Mapping) and isinstance(args.get("sql"), str):
            last = args["sql"]
    if last is None:
        return Extracted(None, False, "no submit_solution call")
    if not last.strip():
        return Extracted(None, False, "submit_solution was called with empty SQL")
    return Extracted(last.strip(), True, "", 0, len(last), len(last))
