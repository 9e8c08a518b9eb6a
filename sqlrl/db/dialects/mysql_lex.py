"""MariaDB / MySQL statements as the server's lexer reads them (``sql/sql_lex.cc``), and the
sandbox's reading of each one.

The rules, each checked on MariaDB 10.11 by experiment (tests/dialects/test_lexer_differential.py
and tests/unit/test_lexers.py keep them checked):

- ``--`` starts a comment only when followed by a space or any control character (every byte
  0x00-0x1f, 0x20 and 0x7f; the end of the text counts too), otherwise it is two minus signs
  (``5 --1`` is 6). A ``--`` or ``#`` comment ends at LF or at a NUL byte — not at CR.
- ``/* … */`` does not nest. ``/*!`` and (MariaDB) ``/*M!`` comments are **code**: the server runs
  their contents. With a version (5 digits, MariaDB: or 6) the contents run only when the version
  is at most the server's, and MariaDB ignores ``/*!50700``-``/*!99999`` (MySQL 5.7+ syntax); an
  ignored one is a comment that may hold one nested ``/* */``. ``/*+ … */`` is a comment.
- ``'…'`` and ``"…"`` are strings (no ANSI_QUOTES) with backslash escapes (unless
  NO_BACKSLASH_ESCAPES) and doubled quotes; `` `…` `` names double their backtick; ``x'…'`` and
  ``b'…'`` end at the next quote.
- ``;`` outside strings, names and comments — inside an executable comment too — ends a statement.
  A NUL byte outside strings and comments ends the server's reading of the text: a syntax error
  unless it is the last byte or follows a ``;`` (the rest is then ignored). The filter leaves it in
  the statement, so the server reports that error.

Guarantees:
- ``split(sql, flavor)`` never raises; empty statements are dropped; text with an unterminated
  string, name or comment is one statement, which the server rejects whole.
- ``lex(text, flavor)``: ``words`` are the leading bare words of the code (comments skipped,
  executable comments' contents read), ``code`` the text with comments and executable-comment
  markers blanked, ``parts`` the number of statements in ``text``.
- ``denial(statement)``: the engine's sandbox reason, or None.

The session's ``sql_mode`` is fixed by the adapter (no NO_BACKSLASH_ESCAPES, no ANSI_QUOTES; the
sandbox refuses changing it), and the connection's character set is utf8mb4, whose multi-byte
characters hold no ASCII bytes, so reading Python text is reading the server's bytes.
MySQL's own rules (``/*M!`` is a comment there, 5-digit versions) are **unverified** here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from ..statements import MAX_WORDS, Statement
from .contract import SCRATCH_PREFIX

_WS = " \t\n\r\x0b\x0c"


@dataclass(frozen=True)
class Flavor:
    """What the lexer needs to know about the server."""

    mariadb: bool = True
    version: int = 101100  # MYSQL_VERSION_ID: 10.11.0 -> 101100
    backslash_escapes: bool = True


DEFAULT = Flavor()


def server_flavor(server_info: str) -> Flavor:
    """The flavor of a server from its version string (``5.5.5-10.11.19-MariaDB-…``)."""
    mariadb = "mariadb" in server_info.lower()
    info = server_info[6:] if server_info.startswith("5.5.5-") else server_info
    m = re.match(r"(\d+)\.(\d+)\.(\d+)", info)
    version = int(m.group(1)) * 10000 + int(m.group(2)) * 100 + int(m.group(3)) if m else 0
    return Flavor(mariadb, version or DEFAULT.version)


_TOKEN = re.compile(r"""[;'"`#]|--|/\*|\*/|[xXbB]'""")
_RUN = re.compile(r"[0-9A-Za-z_$\x80-\U0010ffff]+")  # an identifier, keyword or number
_STRING = {
    ("'", True): re.compile(r"(?:[^'\\]|\\.|'')*'", re.S), ("'", False): re.compile(r"(?:[^']|'')*'"),
    ('"', True): re.compile(r'(?:[^"\\]|\\.|"")*"', re.S), ('"', False): re.compile(r'(?:[^"]|"")*"'),
    ("`", True): re.compile(r"(?:[^`]|``)*`"), ("`", False): re.compile(r"(?:[^`]|``)*`"),
}
_LINE_END = re.compile(r"[\n\x00]")
_NESTED = re.compile(r"/\*|\*/")
_VERSION = re.compile(r"\d{5}")


def _comment_starts(sql: str, pos: int) -> bool:
    """``--`` at ``pos`` starts a comment: followed by the end, a space or a control character."""
    return pos + 2 >= len(sql) or sql[pos + 2] <= " " or sql[pos + 2] == "\x7f"


def _executable(sql: str, pos: int, flavor: Flavor) -> tuple[int, bool] | None:
    """For ``/*`` at ``pos``: (end of the marker and version, whether the contents run) when it
    is an executable comment, else None."""
    maria = flavor.mariadb and sql.startswith("/*M!", pos)
    if not (maria or sql.startswith("/*!", pos)):
        return None
    start = pos + (4 if maria else 3)
    if not _VERSION.match(sql, start):
        return start, True
    end = start + (6 if flavor.mariadb and sql[start + 5:start + 6].isdigit() else 5)
    version = int(sql[start:end])
    runs = version <= flavor.version
    if flavor.mariadb and not maria and 50700 <= version <= 99999:
        runs = False  # MySQL 5.7+ syntax: MariaDB skips it
    return end, runs


def _comment_end(sql: str, pos: int, nesting: int) -> int:
    """End of a ``/* */`` comment whose body starts at ``pos`` (``nesting`` levels allowed), or
    -1."""
    depth = 0
    while True:
        m = _NESTED.search(sql, pos)
        if m is None:
            return -1  # unterminated: the server rejects the text
        if m.group() == "/*":
            if depth < nesting:
                depth += 1
            pos = m.start() + 1 if depth == 0 else m.end()
            continue
        if depth == 0:
            return m.end()
        depth -= 1
        pos = m.end()


def _scan(sql: str, flavor: Flavor) -> tuple[str, str, list[int]]:
    """(``sql`` with comments and executable-comment markers blanked, the same with strings and
    quoted names blanked too, positions of the ``;`` that end statements). Blanks keep lengths,
    so positions agree across the three. Text the server rejects as a whole (an unterminated
    string, name or comment) comes back as it is, with no ``;``."""
    code: list[str] = []
    bare: list[str] = []
    ends: list[int] = []
    pos, in_exec, n = 0, False, len(sql)
    while pos < n:
        m = _TOKEN.search(sql, pos)
        if m is None:
            code.append(sql[pos:])
            bare.append(sql[pos:])
            break
        at, tok, end = m.start(), m.group(), m.end()
        if len(tok) == 2 and tok[1] == "'" and at and _RUN.match(sql, at - 1, at):
            at, tok = at + 1, "'"  # "ax'..": a name, then a string
        kind = "code"  # what sql[at:end] is: code, literal (string/name) or blank (comment)
        if tok == ";":
            ends.append(at)
            in_exec = False  # the next statement is read by a fresh lexer
        elif tok[-1] in "'\"`":
            kind = "literal"
            if len(tok) == 2:  # x'..' / b'..'
                close = sql.find("'", end)
                end = -1 if close < 0 else close + 1
            else:
                body = _STRING[tok, flavor.backslash_escapes].match(sql, end)
                end = body.end() if body else -1
        elif tok == "#" or (tok == "--" and _comment_starts(sql, at)):
            line = _LINE_END.search(sql, at)
            end, kind = (line.start() if line else n), "blank"
        elif tok == "--":
            end = at + 1  # a minus sign; the second '-' may start a comment
        elif tok == "*/":
            if in_exec:
                in_exec, kind = False, "blank"
            else:
                end = at + 1  # '*'; the '/' may open a comment
        else:  # "/*"
            executable = _executable(sql, at, flavor)
            kind = "blank"
            if executable is not None and executable[1]:
                in_exec, end = True, executable[0]
            else:
                body = executable[0] if executable else at + 2
                end = _comment_end(sql, body, 1 if executable else 0)
        if end < 0:  # an unterminated string, name or comment: the server rejects the text
            return sql, sql, []
        piece = sql[at:end]
        code.append(sql[pos:at] + (" " * len(piece) if kind == "blank" else piece))
        bare.append(sql[pos:at] + (piece if kind == "code" else " " * len(piece)))
        pos = end
    if in_exec:  # an unterminated executable comment: the server rejects the text
        return sql, sql, []
    return "".join(code), "".join(bare), ends


def _words(bare: str) -> tuple[str, ...]:
    """The first bare words (runs of name characters starting with a letter or ``_``)."""
    words: list[str] = []
    for m in _RUN.finditer(bare):
        first = m.group()[0]
        if first.isascii() and (first.isalpha() or first == "_"):
            words.append(m.group().upper())
            if len(words) == MAX_WORDS:
                break
    return tuple(words)


def split(sql: str, flavor: Flavor = DEFAULT) -> list[Statement]:
    """The statements of one call (see the module docstring)."""
    if ";" not in sql:  # one statement at most: scanned once, by lex
        statement = lex(sql.strip(_WS), flavor)
        return [statement] if statement.code.strip(_WS) else []
    code, bare, ends = _scan(sql, flavor)
    out: list[Statement] = []
    start = 0
    for end in [*ends, len(sql)]:
        if code[start:end].strip(_WS):
            out.append(lex(sql[start:end].strip(_WS), flavor))
        start = end + 1
    return out


@lru_cache(maxsize=64)
def lex(text: str, flavor: Flavor = DEFAULT) -> Statement:
    """One statement text, as the server reads it."""
    code, bare, ends = _scan(text, flavor)
    words = _words(bare)
    parts = 1
    if ends:
        parts = sum(1 for a, b in zip([-1, *ends], [*ends, len(text)]) if code[a + 1:b].strip(_WS))
    return Statement(text, words, words[0] if words else "", code, parts)


# --- the sandbox's reading -------------------------------------------------------------------------

_SQL_MODE = re.compile(r"\bsql_mode\b", re.I)
_LABEL = re.compile(r"\s*[A-Za-z0-9_$]+\s*:(?!=)")
_DENIED_FIRST = {
    "USE": "USE (the session works in its own database)",
    "PREPARE": "dynamic SQL (PREPARE/EXECUTE)", "EXECUTE": "dynamic SQL (PREPARE/EXECUTE)",
    "DEALLOCATE": "dynamic SQL (PREPARE/EXECUTE)", "LOAD": "LOAD DATA/XML/INDEX",
    "HANDLER": "HANDLER", "KILL": "KILL", "FLUSH": "FLUSH", "LOCK": "LOCK TABLES",
    "UNLOCK": "UNLOCK TABLES", "SHUTDOWN": "SHUTDOWN", "RESTART": "RESTART",
    "GRANT": "GRANT", "REVOKE": "REVOKE", "INSTALL": "plugins", "UNINSTALL": "plugins",
    "XA": "XA transactions", "BINLOG": "replication commands", "PURGE": "replication commands",
    "RESET": "RESET", "CHANGE": "replication commands", "START": "replication commands",
    "STOP": "replication commands", "CACHE": "CACHE INDEX", "BACKUP": "BACKUP",
    **{w: "compound statements" for w in (
        "IF", "WHILE", "LOOP", "REPEAT", "CASE", "DECLARE", "SIGNAL", "RESIGNAL", "LEAVE",
        "ITERATE", "RETURN", "FOR")},
}
_DDL_VERBS = {"CREATE", "ALTER", "DROP", "RENAME"}
_DENIED_OBJECTS = {"USER", "ROLE", "DATABASE", "SCHEMA", "SERVER", "TABLESPACE", "LOGFILE",
                   "PROCEDURE", "FUNCTION", "TRIGGER", "EVENT", "PACKAGE", "PREPARE", "AGGREGATE"}
_ALLOWED_OBJECTS = {"TABLE", "TABLES", "VIEW", "INDEX", "SEQUENCE", "TEMPORARY", "UNIQUE",
                    "FULLTEXT", "SPATIAL"}
_DENIED_ANYWHERE = [
    (re.compile(r"\bINTO\s+(OUTFILE|DUMPFILE)\b", re.I), "SELECT … INTO OUTFILE/DUMPFILE"),
    (re.compile(r"\bLOAD_FILE\b", re.I), "LOAD_FILE"),
    (re.compile(r"\bLOAD\s+(DATA|XML)\b", re.I), "LOAD DATA/XML"),
    (re.compile(r"\bPROCESSLIST\b", re.I), "the process list"),
    (re.compile(r"\bEXECUTE\s+IMMEDIATE\b", re.I), "dynamic SQL (EXECUTE IMMEDIATE)"),
    (re.compile(r"\bDEFINER\s*=", re.I), "DEFINER= clauses"),
]
_ANYWHERE_HINTS = ("into", "load", "processlist", "immediate", "definer")
# SET NAMES / CHARACTER SET would make the server decode the text differently from how the client
# encodes it (a GBK trail byte can swallow a backslash), so the sandbox's reading would drift.
_SET_DENIED = re.compile(r"@@GLOBAL\b|\bGLOBAL\b|\bPERSIST(_ONLY)?\b|^\s*SET\s+(PASSWORD|ROLE|DEFAULT"
                         r"|STATEMENT)\b|\b(NAMES|CHARACTER\s+SET|CHARSET|character_set_\w+"
                         r"|collation_connection)\b", re.I)


def denial(statement: Statement | str) -> str | None:
    """Why MariaDB/MySQL sessions refuse ``statement`` (on top of the common rules), or None."""
    s = statement if isinstance(statement, Statement) else lex(statement)
    if SCRATCH_PREFIX in s.text.lower():
        return (f"naming a session scratch database ({SCRATCH_PREFIX}…) is not allowed: "
                "use unqualified table names")
    if "sql_mode" in s.text.lower() and _SQL_MODE.search(s.text):
        return "changing sql_mode is not allowed in a session"
    if s.parts > 1:
        return "the statement holds a ';' that the server would read as a second statement"
    if _LABEL.match(s.code):
        return "compound statements are not allowed in a session"
    words = s.words
    if not words:
        return None
    first = words[0]
    if first in _DENIED_FIRST:
        return f"{_DENIED_FIRST[first]} is not allowed in a session"
    if first in _DDL_VERBS:
        for word in words[1:7]:
            if word in _DENIED_OBJECTS:
                return f"{first} {word} is not allowed in a session"
            if word in _ALLOWED_OBJECTS:
                break
    if first == "SET" and _SET_DENIED.search(s.code):
        return ("SET GLOBAL/PERSIST/PASSWORD/ROLE/STATEMENT and character set changes are not "
                "allowed in a session")
    lowered = s.code.lower()
    if any(hint in lowered for hint in _ANYWHERE_HINTS):
        for pattern, what in _DENIED_ANYWHERE:
            if pattern.search(s.code):
                return f"{what} is not allowed in a session"
    return None
