"""The SQLite fuzzer behind ``sqlrl.synth.variants``: a database file's schema kept, its rows
rewritten by a profile (values from the column's own values, keys, NOT NULL and foreign keys
kept). The guarantees are stated in ``sqlrl.synth.variants``'s docstring and tested in
tests/unit/test_test_suite.py; ``fuzz_sqlite`` is the entry point, ``PROFILES`` the registry of
ways to fill a table.
"""

from __future__ import annotations

import random
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

DEFAULT_MAX_ROWS = 60  # rows per table of a fuzzed variant (small: cheap to query, easy to tell apart)
SCAN_ROWS = 20_000  # source rows read per table and column (BIRD's tables have millions)


@dataclass(frozen=True)
class _Column:
    name: str
    declared: str
    notnull: bool
    pk: bool


@dataclass(frozen=True)
class _TableInfo:
    name: str
    columns: tuple[_Column, ...]
    uniques: tuple[tuple[int, ...], ...]  # column indices of the PK and every UNIQUE index
    fks: tuple[tuple[tuple[int, ...], str, tuple[str, ...]], ...]  # (child cols, parent, parent cols)
    rowid_pk: int | None  # index of an INTEGER PRIMARY KEY column (a rowid alias), else None


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _read_tables(conn: sqlite3.Connection) -> dict[str, _TableInfo]:
    names = [r[0] for r in conn.execute(
        "SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%' ORDER BY name")]
    lower = {n.lower(): n for n in names}
    out: dict[str, _TableInfo] = {}
    for t in names:
        info = conn.execute(f"PRAGMA table_info({_quote(t)})").fetchall()
        cols = tuple(_Column(r[1], r[2] or "", bool(r[3]), bool(r[5])) for r in info)
        index = {c.name.lower(): i for i, c in enumerate(cols)}
        pk = tuple(i for _, i in sorted((r[5], k) for k, r in enumerate(info) if r[5]))
        uniques = [pk] if pk else []
        for row in conn.execute(f"PRAGMA index_list({_quote(t)})").fetchall():
            if row[2]:  # unique
                idx = [index.get((r[2] or "").lower()) for r in
                       conn.execute(f"PRAGMA index_info({_quote(row[1])})").fetchall()]
                if idx and None not in idx:
                    uniques.append(tuple(idx))  # type: ignore[arg-type]
        groups: dict[int, list[tuple[str, str | None, str]]] = {}
        for r in conn.execute(f"PRAGMA foreign_key_list({_quote(t)})").fetchall():
            groups.setdefault(r[0], []).append((r[3], r[4], r[2]))
        fks = []
        for parts in groups.values():
            parent = lower.get(parts[0][2].lower())
            child = tuple(index.get(p[0].lower()) for p in parts)
            if parent is None or None in child:
                continue  # a foreign key to a table or column that does not exist (Spider has some)
            fks.append((child, parent, tuple(p[1] or "" for p in parts)))
        rowid = pk[0] if len(pk) == 1 and cols[pk[0]].declared.upper() == "INTEGER" else None
        out[t] = _TableInfo(t, cols, tuple(dict.fromkeys(uniques)), tuple(fks), rowid)  # type: ignore[arg-type]
    return out


def _parent_order(tables: dict[str, _TableInfo]) -> list[str]:
    """Tables with parents first (a depth-first topological order; a cycle is broken by name)."""
    order: list[str] = []
    state: dict[str, int] = {}

    def visit(t: str) -> None:
        if state.get(t):
            return
        state[t] = 1
        for _, parent, _ in tables[t].fks:
            if parent != t:
                visit(parent)
        state[t] = 2
        order.append(t)

    for t in sorted(tables):
        visit(t)
    return order


# -- value generation ----------------------------------------------------------------------------

def _perturb(v: Any, rng: random.Random) -> Any:
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, int):
        return v + rng.choice((-1, 1))
    if isinstance(v, float):
        return round(v * rng.choice((0.9, 1.1)), 4)
    return v


def _boundary(pool: list[Any]) -> list[Any]:
    nums = [v for v in pool if isinstance(v, (int, float)) and not isinstance(v, bool)]
    texts = [v for v in pool if isinstance(v, str)]
    out: list[Any] = []
    if nums:
        lo, hi = min(nums), max(nums)
        kind = int if all(isinstance(v, int) for v in nums) else float
        out += [lo, hi, kind(lo - 1), kind(hi + 1), kind(0)]
    if texts:
        out += [min(texts), max(texts), ""]
    return out


@dataclass(frozen=True)
class Profile:
    """How a fuzzed table is filled: ``rows(n_source, rng)`` rows; ``value(pool, column, rng)``
    draws one non-key value (``pool``: the column's distinct source values, never empty)."""

    name: str
    rows: Callable[[int, random.Random], int]
    value: Callable[[list[Any], _Column, random.Random], Any]


def _resample(pool: list[Any], col: _Column, rng: random.Random) -> Any:
    v = rng.choice(pool)
    return _perturb(v, rng) if rng.random() < 0.2 else v


def _dup_value(pool: list[Any], col: _Column, rng: random.Random) -> Any:
    return rng.choice(pool[:2])


def _null_value(pool: list[Any], col: _Column, rng: random.Random) -> Any:
    return None if (not col.notnull and rng.random() < 0.35) else rng.choice(pool)


def _boundary_value(pool: list[Any], col: _Column, rng: random.Random) -> Any:
    edges = _boundary(pool)
    return rng.choice(edges) if edges and rng.random() < 0.5 else rng.choice(pool)


def _sized(lo: int, hi: int) -> Callable[[int, random.Random], int]:
    """Between ``lo`` and ``hi`` rows, and no more than the source had unless it had fewer than
    ``lo`` (a two-row table gets more rows, so an empty or lucky result is less likely)."""
    return lambda n, rng: min(max(n, lo), rng.randint(lo, hi))


PROFILES: dict[str, Profile] = {p.name: p for p in (
    Profile("resample", _sized(8, DEFAULT_MAX_ROWS), _resample),
    Profile("duplicates", _sized(6, 30), _dup_value),
    Profile("nulls", _sized(6, 40), _null_value),
    Profile("boundary", _sized(6, 40), _boundary_value),
    Profile("empty", _sized(8, DEFAULT_MAX_ROWS), _resample),
)}


def _pools(conn: sqlite3.Connection, info: _TableInfo, literals: Sequence[Any] = ()) -> list[list[Any]]:
    """Per column: its distinct non-NULL source values (at most 500, among the first
    ``SCAN_ROWS`` rows: a large table is never scanned whole; in a fixed order), plus the
    ``literals`` of the storage class every source value has (a query's constants, ±1 for
    integers: the values a filter's boundary sits on)."""
    out = []
    for c in info.columns:
        rows = conn.execute(f"SELECT DISTINCT v FROM (SELECT {_quote(c.name)} AS v FROM "
                            f"{_quote(info.name)} WHERE {_quote(c.name)} IS NOT NULL "
                            f"LIMIT {SCAN_ROWS}) LIMIT 500").fetchall()
        vals = sorted((r[0] for r in rows), key=lambda v: (type(v).__name__, str(v)))
        kinds = {type(v) for v in vals}
        if len(kinds) == 1:
            extra = [v for v in _widen(literals) if type(v) in kinds and v not in vals]
            vals += extra * max(1, len(vals) // 4)  # weighted: about a fifth of draws
        out.append(vals)
    return out


def _widen(literals: Sequence[Any]) -> list[Any]:
    out: list[Any] = []
    for v in literals:
        out += [v - 1, v, v + 1] if isinstance(v, int) and not isinstance(v, bool) else [v]
    return list(dict.fromkeys(out))


def _fill_table(conn: sqlite3.Connection, src: sqlite3.Connection, info: _TableInfo,
                profile: Profile, rng: random.Random, done: dict[str, list[tuple]],
                empty: set[str], max_rows: int, literals: Sequence[Any] = ()) -> list[tuple]:
    n_source = src.execute(f"SELECT count(*) FROM (SELECT 1 FROM {_quote(info.name)} "
                           f"LIMIT {SCAN_ROWS})").fetchone()[0]
    if info.name in empty or n_source == 0:  # a table empty in the source has no values to draw
        return []
    pools = _pools(src, info, literals)
    if profile.name == "duplicates":
        pools = [rng.sample(p, min(2, len(p))) if p else p for p in pools]
    fk_cols: dict[int, tuple[int, int]] = {}  # child col -> (fk index, position in the fk)
    parents: list[list[tuple]] = []
    for k, (child, parent, pcols) in enumerate(info.fks):
        prow_cols = _parent_columns(conn, parent, pcols)
        source = done.get(parent)
        if source is None:  # a reference cycle: the parent is not filled yet
            source = src.execute(f"SELECT * FROM {_quote(parent)} LIMIT {SCAN_ROWS}").fetchall()
        parents.append([tuple(r[i] for i in prow_cols) for r in source])
        for pos, c in enumerate(child):
            fk_cols[c] = (k, pos)
    target = min(profile.rows(n_source, rng), max_rows)
    seen: list[set[tuple]] = [set() for _ in info.uniques]
    rows: list[tuple] = []
    marks = ", ".join("?" * len(info.columns))
    insert = f"INSERT INTO {_quote(info.name)} VALUES ({marks})"
    for attempt in range(target * 8):
        if len(rows) >= target:
            break
        picked = [rng.choice(p) if p else None for p in parents]
        row: list[Any] = []
        for i, c in enumerate(info.columns):
            if i in fk_cols:
                k, pos = fk_cols[i]
                if picked[k] is None:  # no parent rows: NULL if allowed, else no row at all
                    row.append(None)
                else:
                    row.append(picked[k][pos])
                continue
            pool = pools[i]
            if not pool:
                row.append(None if not c.notnull else _filler(c, len(rows)))
            elif c.pk or any(i in u for u in info.uniques):
                v = rng.choice(pool)
                row.append(_perturb(v, rng) if rng.random() < 0.1 else v)
            else:
                row.append(profile.value(pool, c, rng))
        if any(v is None and info.columns[i].notnull for i, v in enumerate(row)):
            continue
        if info.rowid_pk is not None and not isinstance(row[info.rowid_pk], int):
            continue
        keys = [tuple(row[i] for i in u) for u in info.uniques]
        if any(key in s and None not in key for key, s in zip(keys, seen)):
            continue
        try:
            conn.execute(insert, row)
        except sqlite3.DatabaseError:
            continue  # a CHECK (or other) constraint refuses it: dropped, never forced
        for key, s in zip(keys, seen):
            s.add(key)
        rows.append(tuple(row))
    return rows


def _filler(col: _Column, i: int) -> Any:
    t = col.declared.upper()
    return i if any(k in t for k in ("INT", "NUM", "REAL", "FLOA", "DOUB", "DEC")) else f"v{i}"


def _parent_columns(conn: sqlite3.Connection, parent: str, pcols: tuple[str, ...]) -> list[int]:
    info = conn.execute(f"PRAGMA table_info({_quote(parent)})").fetchall()
    names = [r[1].lower() for r in info]
    pk = [k for _, k in sorted((r[5], k) for k, r in enumerate(info) if r[5])]
    out = []
    for pos, c in enumerate(pcols):
        if c and c.lower() in names:
            out.append(names.index(c.lower()))
        elif pos < len(pk):
            out.append(pk[pos])
        else:
            out.append(0)
    return out


def fuzz_sqlite(source: str | Path, dest: str | Path, profile: str, seed: int,
                max_rows: int = DEFAULT_MAX_ROWS, literals: Sequence[Any] = ()) -> Path:
    """Write a fuzzed variant of the SQLite file ``source`` to ``dest`` (module doc);
    ``literals`` (a query's constants) are mixed into the pools of columns of their type."""
    if profile not in PROFILES:
        raise ValueError(f"unknown variant profile {profile!r}; known: {', '.join(PROFILES)}")
    source, dest = Path(source), Path(dest)
    _check_sqlite(source)
    if dest.exists():
        dest.unlink()
    rng = random.Random(f"variant:{profile}:{seed}")
    src = sqlite3.connect(f"file:{source}?mode=ro", uri=True)
    conn = sqlite3.connect(dest)
    try:
        conn.execute(f"PRAGMA encoding = '{src.execute('PRAGMA encoding').fetchone()[0]}'")
        _copy_schema(src, conn, late=False)  # tables and indexes; views and triggers after the rows
        tables = _read_tables(src)
        order = _parent_order(tables)
        empty: set[str] = set()
        if profile == "empty" and order:
            empty = _referencing(tables, rng.choice(order))
        conn.execute("PRAGMA foreign_keys=OFF")
        done: dict[str, list[tuple]] = {}
        for t in order:
            done[t] = _fill_table(conn, src, tables[t], PROFILES[profile], rng, done, empty,
                                  max_rows, literals)
        conn.commit()
        _copy_schema(src, conn, late=True)
        conn.commit()
    finally:
        conn.close()
        src.close()
    return dest


def _copy_schema(src: sqlite3.Connection, conn: sqlite3.Connection, late: bool) -> None:
    """Run the source's own CREATE statements (``sqlite_master.sql``, in creation order): tables
    and indexes (``late=False``) or views and triggers (``late=True``, after the rows, so no
    trigger fires while a table is filled). Internal objects (``sqlite_*``) make themselves."""
    for kind, sql in src.execute("SELECT type, sql FROM sqlite_master WHERE sql IS NOT NULL "
                                 "AND substr(name, 1, 7) != 'sqlite_' ORDER BY rowid").fetchall():
        if (kind in ("view", "trigger")) == late:
            conn.execute(sql)


def _referencing(tables: dict[str, _TableInfo], root: str) -> set[str]:
    """``root`` and every table that references it, transitively."""
    out, todo = {root}, [root]
    while todo:
        t = todo.pop()
        for name, info in tables.items():
            if name not in out and any(parent == t for _, parent, _ in info.fks):
                out.add(name)
                todo.append(name)
    return out


def _check_sqlite(path: Path) -> None:
    if not path.is_file():
        raise FileNotFoundError(f"database file not found: {path}")
    with open(path, "rb") as f:
        if f.read(16) != b"SQLite format 3\x00":
            raise ValueError(f"{path} is not a SQLite database file")
