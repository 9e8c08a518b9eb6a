"""``postgresql_lex.lex`` reads text that parses without scanning all of it (its comments from
libpg_query's comment list, its words from a prefix): it must give exactly the ``Statement`` that
scanning the whole text gives (``_lex_full``), for every text and every place the prefix can end.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from sqlrl.db.dialects import postgresql_lex as lx

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"

# Texts around every scanner rule whose match is longer than its token, or that reads past a
# token: U& (an identifier U when no quote follows), N'', E'' escapes, quotes continued after a
# newline (and followed by a comment), dollar quotes and failed ones, numbers next to '..' and
# exponents, hex/octal/binary integers, parameters, quoted names with doubled quotes, operators
# holding comment starts, nested comments, non-ASCII names.
_SEVEN = "SELECT a, b, c, d, e, f, "  # the eighth word is the next one: the cut matters there
TRICKY = [
    _SEVEN + 'U&"x" FROM t',
    _SEVEN + "U&'y' FROM t",
    _SEVEN + "N'n' FROM t",
    _SEVEN + "E'\\\\'' FROM t",
    _SEVEN + '$$d$$ FROM t',
    _SEVEN + '$t$d$t$ FROM t',
    _SEVEN + "'s'\n'c' FROM t",
    _SEVEN + '"q""q" FROM t',
    _SEVEN + '1.5e3 FROM t',
    _SEVEN + '0x1F FROM t',
    _SEVEN + "x'1F' FROM t",
    _SEVEN + '1 .. 2 FROM t',
    _SEVEN + '$1 FROM t',
    _SEVEN + 'a+/*c*/b FROM t',
    _SEVEN + 'a--c\n FROM t',
    _SEVEN + 'U&"x", U&\'y\', u&"z" UESCAPE \'!\', N\'n\', E\'\\\'\', x\'1F\', b\'1\', $$d$$ FROM t',
    _SEVEN + "'s'\n'continued' -- c\n'again', \"q\"\"q\", 1.5e3, 0x1F, $1, 1 .. 2 FROM t",
    'SELECT U&"d\\0061t\\+000061" AS u, U&\'d!0061t\' UESCAPE \'!\' , u & 1 FROM t WHERE a = b',
    "SELECT u&x, U& y, U&\"x\", N'abc', n, E'it\\'s', e'\\\\', b'0101', x'1F', X FROM t",
    "SELECT 'a'\n  'b' -- c\n 'd' AS s, 'e' -- only\n, f FROM t WHERE g = 'h'\n\n'i' AND j",
    "SELECT $$a;b$$, $tag$ x $tag$ AS d, $1 + $2, a$b$c, $q$ $$ $q$ FROM t WHERE k = l AND m",
    "SELECT 1..2, 1.5e10, 1e-3, .5, 5., 0x1F, 0o17, 0b101, 1_000, 3.14::numeric FROM t WHERE a",
    'SELECT "a""b" AS "C""", "über", ñame, _x1, "" IS NULL FROM "T" JOIN u ON "T".x = u.x',
    "SELECT a+/*c*/b, a-/*c /* nested */ d */-b, a <-> b, a @@ b, a !~~* b, a--x\n, c FROM t",
    "SELECT /* c */ a /* d */ , /* e */ b -- f\n FROM /*g*/ t -- h",
    "  SELECT\tA\r\nFROM\fT  WHERE  X  =  'Y'  ORDER  BY  Z  DESC  LIMIT  1  OFFSET  2",
    "WITH x AS (SELECT 1 AS a) SELECT a, b, c, d, e, f, g, h, i, j, k FROM x",
    "SELECT 'x' -\n 'y', a FROM t",
    "VALUES (1, 'a'), (2, 'b')",
    "SELECT 1",
    "SELECT ';' AS semi, \"--\" AS dash, '/*' AS star FROM t",
    "SET search_path = public, pg_catalog",
    "begin",
    "SELECT 1; SELECT 2",
    "SELECT 1;",
    "CREATE FUNCTION f() RETURNS int LANGUAGE sql BEGIN ATOMIC SELECT 1; SELECT 2; END",
    "DO $$ BEGIN EXECUTE 'SET ROLE x'; END $$",
    "SELECT 'unterminated",
    "SELECT \"x",
    "SELECT * FROM",
    "-- only a comment",
    "SELECT 1abc",
]


def _same(text: str) -> None:
    assert lx.lex.__wrapped__(text) == lx._lex_full(text), repr(text)


@pytest.mark.parametrize("text", TRICKY)
def test_every_prefix_gives_the_whole_texts_words(text, monkeypatch):
    """Every cut of the prefix, from 1 character to the whole text."""
    for k in range(1, len(text) + 2):
        monkeypatch.setattr(lx, "_PREFIX_CHARS", k)
        _same(text)


def test_random_expressions_every_cut(monkeypatch):
    """Random select lists built from the tricky atoms, operators, casts, comments and line
    breaks (they parse), at every cut. Seeded."""
    atoms = ["a", "U&\"x\"", "'y'", "'z'\n'zz'", "'s' -- c\n'ss'", "U&'w'", "N'v'", "E'\\''",
             "$$q$$", "$t$r$t$", "$1", "1.5e3", "0x1F", ".5", '"a""b"', "über", "u", "n", "e",
             "x'1F'", "b'01'", "(a)", "f(a, b)", "a.b"]
    ops = [" + ", "-", " || ", "/*c*/+", " <-> ", "::int ", " AND ", "\n-- d\n=", " = "]
    rng = random.Random(46)
    parsed = 0
    for _ in range(120):
        items = []
        for _ in range(rng.randint(1, 5)):
            expr = rng.choice(atoms)
            for _ in range(rng.randint(0, 3)):
                expr += rng.choice(ops) + rng.choice(atoms)
            items.append(expr)
        lead = "SELECT " + "".join(f"c{i}, " for i in range(rng.randint(0, 7)))  # 1-8 words
        text = lead + rng.choice([", ", ",\n", " /* l */ ,"]).join(items) + " FROM t"
        if not lx.lex.__wrapped__(text).kind:
            _same(text)
            continue
        parsed += 1
        for k in range(1, len(text) + 2):
            monkeypatch.setattr(lx, "_PREFIX_CHARS", k)
            _same(text)
    assert parsed > 60  # most of them parse


def _corpus() -> list[str]:
    spider = DATA / "spider" / "dev.json"
    bird = DATA / "bird_minidev" / "mini_dev_postgresql.json"
    if not (spider.exists() and bird.exists()):
        pytest.skip(f"Spider / BIRD mini-dev not found under {DATA} (../shared/data)")
    out = [item["query"] for item in json.loads(spider.read_text())]
    out += [item["SQL"] for item in json.loads(bird.read_text())]
    return list(dict.fromkeys(q.strip() for q in out))


def test_real_queries_and_their_commented_forms():
    """Spider dev and BIRD mini-dev gold SQL, as given and with comments, a ';' or a second
    statement around them (the forms models send)."""
    corpus = _corpus()
    assert len(corpus) > 1000
    for q in corpus:
        for text in (q, f"{q}\n-- note", f"/* why */ {q}", f"{q};", f"{q}; SELECT 1",
                     f"-- a\n{q} /* b */ -- c"):
            _same(text)
