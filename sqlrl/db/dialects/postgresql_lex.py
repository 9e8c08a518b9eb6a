"""PostgreSQL statements as PostgreSQL itself reads them, and the sandbox's reading of each one.

pglast wraps libpg_query, which is PostgreSQL's own scanner and grammar compiled as a library, so
no rule here is re-implemented by hand: a ``--`` comment ends at LF *or CR*, ``/* */`` comments
nest, ``''`` strings have no backslash escapes (sqlrl pins ``standard_conforming_strings = on``),
``E''`` strings do, ``$tag$`` bodies end only at the same tag, ``a$b$`` is an identifier, and so on.

Guarantees:
- ``split(sql)``: the statements the server would run, in order. A call that parses as a whole is
  cut where the grammar ends each statement (a ``BEGIN ATOMIC`` body keeps its ``;``s); otherwise
  it is cut at the scanner's ``;`` tokens. Text the scanner cannot read (an unterminated string or
  comment) is one statement. Empty statements are dropped. Never raises.
- ``lex(text)``: ``Statement.kind`` is the parse node's type (``SelectStmt``, ``TransactionStmt``,
  ``VariableSetStmt``, ``CreatedbStmt``, …) and ``node`` its tree (JSON text); a statement the
  parser rejects has ``kind == ""`` and is still sent, whole, so that the server reports the
  syntax error (a text PostgreSQL's parser rejects runs nothing). ``words`` come from the
  scanner's tokens either way. A text that parses is not scanned whole (its words need only a
  prefix, its comments come from libpg_query's list): the ``Statement`` is the same as a whole
  scan gives (``_lex_full``; tests/unit/test_pg_lex_fast.py compares them at every cut).
- ``denial(statement)``: the engine-specific sandbox reason (or None), decided on the parse node,
  with the scanner's words as the fallback for unparsed text; ``streamable(text)``: a plain query
  that ``DECLARE … CURSOR FOR`` accepts.

It does not know the server's version: the grammar is pglast's (PostgreSQL 18). A statement only a
newer grammar accepts fails on an older server; scanner rules (comments, quotes, ``;``) are the
same in every supported version except that PostgreSQL 15 does not count ``\\v`` as white space.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache

from pglast import parser as _pg

from ..statements import MAX_WORDS, Statement

_WS = " \t\n\r\f\v"
_COMMENTS = {"SQL_COMMENT", "C_COMMENT"}
_SEMICOLON = "ASCII_59"


def split(sql: str) -> list[Statement]:
    """The statements of one call (see the module docstring)."""
    if ";" not in sql:  # one statement at most: scanned once, by lex
        statement = lex(sql.strip(_WS))
        return [statement] if statement.parts else []
    try:
        tokens = _pg.scan(sql)
    except _pg.ParseError:  # unterminated literal or comment: the server rejects the whole text
        text = sql.strip(_WS)
        return [lex(text)] if text else []
    pieces = _pieces(sql, tokens)
    if len(pieces) > 1:
        try:  # the grammar's boundaries (BEGIN ATOMIC bodies hold ';' tokens)
            pieces = [sql[s].strip(_WS) for s in _pg.split(sql, with_parser=True, only_slices=True)]
        except _pg.ParseError:
            pass  # some statement does not parse: the scanner's ';' tokens delimit
    return [lex(text) for text in pieces if text]


def _pieces(sql: str, tokens: list) -> list[str]:
    """Texts between ``;`` tokens that hold something other than comments."""
    out: list[str] = []
    first = last = None
    for tok in [*tokens, None]:
        if tok is None or tok.name == _SEMICOLON:
            if first is not None:
                out.append(sql[first:last + 1])
            first = last = None
        elif first is not None:
            last = tok.end
        elif tok.name not in _COMMENTS:
            first, last = tok.start, tok.end
    return out


@lru_cache(maxsize=64)  # split, the sandbox and run() read the same statement text
def lex(text: str) -> Statement:
    """One statement text, scanned and parsed. ``node`` is the parse as libpg_query's JSON text
    (read with ``fields``); ``kind`` comes straight from it. Text that parses is read without
    scanning all of it into tokens (a third of ``lex``'s time): its comments come from
    libpg_query's comment list and its words from a prefix (``_leading_words``); the result is
    the same ``Statement`` as ``_lex_full`` gives (tests/unit/test_pg_lex_fast.py compares them)."""
    try:
        found = _pg.comments(text) if ("--" in text or "/*" in text) else ()
        tree = _pg.parse_sql_json(text)
    except _pg.ParseError:  # the whole scan's words feed ``denial``'s fallback
        return _lex_full(text)
    m = _KIND.match(tree)
    if m is None:  # nothing but comments
        return _lex_full(text)
    parts = len(json.loads(tree)["stmts"]) if ";" in text else 1
    return Statement(text, _leading_words(text), m.group(1), _blanked(text, found), parts, tree)


# The prefix ``_leading_words`` scans, in characters; when its words are fewer than 8 (4% of
# Spider dev and BIRD mini-dev queries), the whole text is scanned: at most one prefix is
# wasted, so a long text with few words costs no more than one extra short scan.
_PREFIX_CHARS = 80


def _blanked(text: str, found: tuple) -> str:
    """``text`` with each comment replaced by one space, as ``_lex_full`` builds ``code``.
    libpg_query gives a comment's text and the end of the token before it (``match_location``):
    only white space and the comments before it lie between, so the first occurrence of its text
    from there (and past the previous comment) is where it starts."""
    if not found:
        return text
    code, pos = [], 0
    for comment in found:
        start = text.find(comment.str, max(comment.match_location, pos))
        code.append(text[pos:start] + " ")
        pos = start + len(comment.str)
    code.append(text[pos:])
    return "".join(code)


def _leading_words(text: str) -> tuple[str, ...]:
    """The first ``MAX_WORDS`` keyword or identifier tokens of ``text`` (upper-cased), scanning a
    prefix of it while that is enough. PostgreSQL's scanner never backs up (scan.l's rules are
    written so, and its build checks it): a rule's match is decided by its characters and the
    one after it, and what an action gives back (``yyless``) is rescanned from there. So a token
    of the prefix followed by at least two more of its characters is a token of the whole text:
    the one rule whose token is a word and whose match is longer (``U&`` not followed by a quote,
    an identifier ``U``, the ``&`` given back) ends two characters before the cut at most. A cut
    inside a string, quoted name, comment or dollar-quoted body fails to scan (the whole text is
    scanned then); a string that continues after a newline is longer in the whole text, but it is not a
    word and only white space or comments follow it in the prefix."""
    k = _PREFIX_CHARS
    if k < len(text):
        try:
            words = _words(text, [tok for tok in _pg.scan(text[:k]) if tok.end < k - 2])
        except _pg.ParseError:
            words = ()
        if len(words) == MAX_WORDS:
            return words
    return _words(text, _pg.scan(text))


def _words(text: str, tokens: list) -> tuple[str, ...]:
    """The first ``MAX_WORDS`` keyword/identifier tokens' text, upper-cased (comments and ``;``
    are neither): what ``Statement.words`` holds, for ``lex`` and ``_lex_full`` alike."""
    words: list[str] = []
    for tok in tokens:
        if tok.kind != "NO_KEYWORD" or tok.name == "IDENT":
            words.append(text[tok.start:tok.end + 1].upper())
            if len(words) == MAX_WORDS:
                break
    return tuple(words)


def _lex_full(text: str) -> Statement:
    """``lex`` by scanning the whole text (comments blanked in ``code``, ``;`` counted)."""
    try:
        tokens = _pg.scan(text)
    except _pg.ParseError:
        words = tuple(w.upper() for w in re.findall(r"[A-Za-z_]\w*", text)[:MAX_WORDS])
        return Statement(text, words, "", text)
    code, pos, semicolons, other = [], 0, 0, 0
    for tok in tokens:
        if tok.name in _COMMENTS:
            code.append(text[pos:tok.start] + " ")
            pos = tok.end + 1
        elif tok.name == _SEMICOLON:
            semicolons += 1
        else:
            other += 1
    code.append(text[pos:])
    parts = len(_pieces(text, tokens)) if semicolons else min(other, 1)  # 0: only comments
    statement = Statement(text, _words(text, tokens), "", "".join(code), parts)
    try:
        tree = _pg.parse_sql_json(text)
    except _pg.ParseError:
        return statement  # the server reports the syntax error
    m = _KIND.match(tree)
    if m is None:  # nothing but comments
        return statement
    if semicolons:  # the grammar's count (a BEGIN ATOMIC body holds ';' tokens)
        parts = len(json.loads(tree)["stmts"])
    return Statement(text, statement.words, m.group(1), statement.code, parts, tree)


_KIND = re.compile(r'\{"version":\d+,"stmts":\[\{"stmt":\{"(\w+)"')


def fields(statement: Statement) -> dict:
    """The top-level fields of ``statement``'s (first) parse node, e.g. ``name`` of a SET."""
    if not statement.node:
        return {}
    return json.loads(statement.node)["stmts"][0]["stmt"][statement.kind]


# --- the sandbox's reading -------------------------------------------------------------------------

_ROLES = "managing roles"
_CLUSTER = "managing databases, tablespaces, replication and foreign servers"
_MAINTENANCE = "DISCARD, CHECKPOINT, VACUUM and SECURITY LABEL"
_DENIED_NODES = {
    "CopyStmt": "COPY (server files, programs and the COPY protocol)",
    "AlterSystemStmt": "ALTER SYSTEM",
    **dict.fromkeys(("ListenStmt", "UnlistenStmt", "NotifyStmt"), "LISTEN/NOTIFY"),
    "LoadStmt": "LOAD (shared libraries)",
    **dict.fromkeys(("CreateExtensionStmt", "AlterExtensionStmt", "AlterExtensionContentsStmt"),
                    "managing extensions"),
    **dict.fromkeys(("CreateRoleStmt", "AlterRoleStmt", "AlterRoleSetStmt", "DropRoleStmt",
                     "GrantRoleStmt"), _ROLES),
    **dict.fromkeys((
        "CreatedbStmt", "AlterDatabaseStmt", "AlterDatabaseSetStmt", "AlterDatabaseRefreshCollStmt",
        "DropdbStmt", "CreateTableSpaceStmt", "DropTableSpaceStmt", "AlterTableSpaceOptionsStmt",
        "CreateSubscriptionStmt", "AlterSubscriptionStmt", "DropSubscriptionStmt",
        "CreatePublicationStmt", "AlterPublicationStmt", "CreateForeignServerStmt",
        "AlterForeignServerStmt", "CreateFdwStmt", "AlterFdwStmt", "CreateUserMappingStmt",
        "AlterUserMappingStmt", "DropUserMappingStmt", "CreateEventTrigStmt", "AlterEventTrigStmt",
        "ImportForeignSchemaStmt", "CreateForeignTableStmt"), _CLUSTER),
    **dict.fromkeys(("ReassignOwnedStmt", "DropOwnedStmt"), "REASSIGN/DROP OWNED"),
    **dict.fromkeys(("DiscardStmt", "CheckPointStmt", "SecLabelStmt"), _MAINTENANCE),
}
_CLUSTER_OBJECTS = {"OBJECT_DATABASE": _CLUSTER, "OBJECT_TABLESPACE": _CLUSTER,
                    "OBJECT_SUBSCRIPTION": _CLUSTER, "OBJECT_PUBLICATION": _CLUSTER,
                    "OBJECT_FOREIGN_SERVER": _CLUSTER, "OBJECT_FDW": _CLUSTER,
                    "OBJECT_EVENT_TRIGGER": _CLUSTER, "OBJECT_ROLE": _ROLES,
                    "OBJECT_EXTENSION": "managing extensions"}
_ROLE_SETTINGS = {"role", "session_authorization"}
_TRANSACTION_SETTINGS = {"transaction", "session characteristics"}
# Unparsed text (kept for safety; the server rejects it): the same classes by leading words.
_DENIED_HEADS = {
    ("COPY",): _DENIED_NODES["CopyStmt"], ("LOAD",): _DENIED_NODES["LoadStmt"],
    ("LISTEN",): "LISTEN/NOTIFY", ("UNLISTEN",): "LISTEN/NOTIFY", ("NOTIFY",): "LISTEN/NOTIFY",
    ("DISCARD",): _MAINTENANCE, ("CHECKPOINT",): _MAINTENANCE, ("VACUUM",): _MAINTENANCE,
    ("SECURITY", "LABEL"): _MAINTENANCE, ("ALTER", "SYSTEM"): "ALTER SYSTEM",
    ("SET", "ROLE"): "switching roles", ("RESET", "ROLE"): "switching roles",
    ("SET", "SESSION"): "switching roles", ("REASSIGN", "OWNED"): "REASSIGN/DROP OWNED",
    ("DROP", "OWNED"): "REASSIGN/DROP OWNED", ("CLOSE", "ALL"): "CLOSE ALL (close cursors by name)",
    **{(verb, what): _ROLES for verb in ("CREATE", "ALTER", "DROP")
       for what in ("ROLE", "USER", "GROUP")},
    **{(verb, what): _CLUSTER for verb in ("CREATE", "ALTER", "DROP")
       for what in ("DATABASE", "TABLESPACE", "SUBSCRIPTION", "PUBLICATION", "SERVER")},
    **{(verb, "EXTENSION"): "managing extensions" for verb in ("CREATE", "ALTER", "DROP")},
}
_DENIED_ANYWHERE = re.compile(
    r"\b(pg_read_file|pg_read_binary_file|pg_ls_\w*dir|pg_stat_file|pg_file_\w+|lo_import|lo_export"
    r"|pg_terminate_backend|pg_cancel_backend|pg_signal_backend|pg_reload_conf|pg_rotate_logfile"
    r"|pg_promote|set_config|dblink\w*|standard_conforming_strings|sqlrl_sp|sqlrl_c)\b", re.I)


# The JSON key is always lower case; the setting's name is matched in any case (a scoped flag, so
# the search can skip ahead to each '"name":"' instead of trying every position).
_LIMIT_NAME = re.compile(r'"name":"(?i:(statement_timeout|lock_timeout|idle_in_transaction_session_timeout'
                         r'|idle_session_timeout|transaction_timeout|standard_conforming_strings))"')
_ANYWHERE_HINTS = ("pg_", "lo_", "set_config", "dblink", "standard_conforming", "sqlrl_")
# Text in which the parser can decode a name differently from how it is written: U&"…"/U&'…'
# (with or without UESCAPE) and E'…' escapes. Without them every name in the parse tree is written
# in the code (up to ASCII case, which the search ignores), apart from the pg_catalog names the
# grammar itself inserts (casts, EXTRACT, SUBSTRING, …), none of which is a denied name.
_DECODING = ("\\", "&")


def denial(statement: Statement | str) -> str | None:
    """Why PostgreSQL sessions refuse ``statement`` (on top of the common rules), or None."""
    s = statement if isinstance(statement, Statement) else lex(statement)
    if s.parts > 1:
        return ("the statement holds a ';' that PostgreSQL would read as a second statement; "
                "send statements separated by plain ';'")
    what = _node_denial(s) if s.kind else (
        _DENIED_HEADS.get(s.words[:1]) or _DENIED_HEADS.get(s.words[:2]))
    if what:
        return f"{what} is not allowed in a session"
    # names as written (comments removed) and, where escapes could make them differ, as the
    # parser decoded them (U&"…" identifiers, E'…' strings): the tree is searched only then
    code = s.code or s.text
    decoded = s.node if s.node and any(c in code for c in _DECODING) else ""
    for text in (code, decoded):
        lowered = text.lower()
        m = any(k in lowered for k in _ANYWHERE_HINTS) and _DENIED_ANYWHERE.search(text)
        if m:
            return f"{m.group(1)} is not allowed in a session"
    if s.node and _LIMIT_NAME.search(s.node):  # SET U&"statement\005ftimeout", a function's SET
        return "changing the session's limits (timeouts) is not allowed"
    return None


def _node_denial(s: Statement) -> str | None:
    if s.kind in _DENIED_NODES:
        return _DENIED_NODES[s.kind]
    if s.kind == "TransactionStmt":
        return "transaction control (the session manages its own transaction)"
    if s.kind not in _NODES_WITH_FIELDS:
        return None
    node = fields(s)
    if s.kind == "VariableSetStmt":
        name = str(node.get("name", "")).lower()
        if name in _ROLE_SETTINGS:
            return "switching roles"
        if name in _TRANSACTION_SETTINGS:
            return "transaction control (the session manages its own transaction)"
    if s.kind == "VacuumStmt" and node.get("is_vacuumcmd"):
        return _MAINTENANCE
    if s.kind == "ClosePortalStmt" and not node.get("portalname"):
        return "CLOSE ALL (close cursors by name)"
    if s.kind == "DropStmt":
        return _CLUSTER_OBJECTS.get(node.get("removeType", ""))
    if s.kind == "RenameStmt":
        return _CLUSTER_OBJECTS.get(node.get("renameType", ""))
    if s.kind == "AlterOwnerStmt":
        return _CLUSTER_OBJECTS.get(node.get("objectType", ""))
    return None


_NODES_WITH_FIELDS = {"VariableSetStmt", "VacuumStmt", "ClosePortalStmt", "DropStmt", "RenameStmt",
                      "AlterOwnerStmt"}
# keys of the parse tree (JSON) that make a SELECT unfit for a cursor; plain substring tests are
# several times faster than one alternation over the whole tree
_NOT_STREAMABLE = ('"InsertStmt":', '"UpdateStmt":', '"DeleteStmt":', '"MergeStmt":',
                   '"intoClause":', '"lockingClause":')


def has_offset(text: str) -> bool:
    """Whether ``text``'s parse tree has an OFFSET clause anywhere (its own or a nested
    query's; a string that spells the key is escaped in the tree and does not count)."""
    return '"limitOffset":' in lex(text).node


def streamable(text: str) -> bool:
    """A plain query (SELECT/VALUES/TABLE/WITH without data-modifying parts, INTO or FOR UPDATE):
    ``DECLARE … CURSOR FOR`` accepts it, so its rows can be streamed."""
    s = lex(text)
    return (s.kind == "SelectStmt" and s.parts == 1
            and not any(key in s.node for key in _NOT_STREAMABLE))
