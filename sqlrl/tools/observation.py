"""The one observation format: how a tool result reads to the model, everywhere (SFT data, RL
rollouts, inference, serving).

Grammar (lines separated by ``\\n``; deterministic):

    result set   :=  header NL row* footer
    header       :=  column (" | " column)*
    row          :=  cell (" | " cell)*          cell: NULL for null, text with \\n -> "\\\\n",
                                                  cut to max_cell_chars with "…"
    footer       :=  "(N rows)" | "(1 row)"
                  |  "(first K of N rows shown)"                       display cap
                  |  "(first K rows shown; the result has more than N rows)"   session cap
    no result set:=  "OK" | "OK (N rows affected)" | "OK (1 row affected)"
    error        :=  "Error (KIND): MESSAGE"                          KIND: syntax, timeout, ...
                  |  "Error (KIND) in statement I of N: MESSAGE"      multi-statement calls
    tool error   :=  "Error (tool call): MESSAGE"                     invalid tool call

The whole text is cut to ``max_chars`` with a final "… (output cut at M characters)" line.
"""

from __future__ import annotations

from typing import Any

from sqlrl.db.types import QueryResult

MAX_ROWS = 20
MAX_CELL_CHARS = 100
MAX_CHARS = 4000


def _cell(value: Any, max_cell_chars: int) -> str:
    if value is None:
        return "NULL"
    text = str(value).replace("\r", "\\r").replace("\n", "\\n")
    return text if len(text) <= max_cell_chars else text[: max_cell_chars - 1] + "…"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _cap(text: str, max_chars: int) -> str:
    if len(text) <= max_chars:
        return text
    cut = text[:max_chars].rsplit("\n", 1)[0]
    return f"{cut}\n… (output cut at {max_chars} characters)"


def format_observation(result: QueryResult, *, max_rows: int = MAX_ROWS,
                       max_cell_chars: int = MAX_CELL_CHARS, max_chars: int = MAX_CHARS) -> str:
    if result.error is not None:
        where = (f" in statement {result.error.statement_index + 1} of {result.statements}"
                 if result.statements > 1 else "")
        return _cap(f"Error ({result.error.kind.value}){where}: {result.error.message}", max_chars)
    if not result.columns:
        affected = result.affected_rows
        return "OK" if affected is None else f"OK ({_plural(affected, 'row')} affected)"
    shown = result.rows[:max_rows]
    lines = [" | ".join(_cell(c, max_cell_chars) for c in result.columns)]
    lines += [" | ".join(_cell(v, max_cell_chars) for v in row) for row in shown]
    if result.truncated:
        lines.append(f"(first {len(shown)} rows shown; the result has more than "
                     f"{_plural(result.row_count, 'row')})")
    elif len(shown) < result.row_count:
        lines.append(f"(first {len(shown)} of {result.row_count} rows shown)")
    else:
        lines.append(f"({_plural(result.row_count, 'row')})")
    return _cap("\n".join(lines), max_chars)


def format_tool_error(message: str, *, max_chars: int = MAX_CHARS) -> str:
    return _cap(f"Error (tool call): {message}", max_chars)
