"""Test-suite execution match: distil, per gold query, the database variants that catch its near
misses, and check a prediction on them (Zhong, Yu & Klein, 2020).

    suites = TestSuites("runs/x/test_suite")              # variants + suites cached here
    suite = suites.suite(db_id, url, gold_sql, run)         # run(url, sql) -> Outcome
    checked = check_suite(suite, run, pred_sql, gold_sql)   # per-variant outcomes
    checked.passes(same)                                    # (True, None) | (False, variant URL)

- **Neighbours** of a gold query: ``sqlrl.suites.neighbours`` (the bug injector's mutations and
  generic ones: predicates dropped, comparisons flipped, DISTINCT toggled, LIMIT changed).
- **Comparison** (``Comparison``): how a benchmark's execution match compares a prediction's rows
  with the gold's -- ``same`` -- and on which gold results a match is possible at all --
  ``usable`` (BIRD-CRITIC's default test case fails every empty result). Distillation and checking
  use the one the caller gives, so a suite is distilled and checked with the comparator EX uses on
  the original; its ``name`` is part of a suite's cache key. Default (``spider_comparison``):
  ``spider_ex``, ordered when the gold's outermost query orders.
- **Distillation** (``distil``): the gold must run on the original database (``ValueError``
  otherwise: a clear error, no suite). A neighbour is *caught* on a database when it errors there
  or its result is not ``same`` as the gold's. Neighbours the original already catches need no
  variant. Among the candidate variants -- those where the gold itself runs and its result is
  ``usable`` (another variant is dropped, never used) -- the one catching the most not-yet-caught
  neighbours is kept, greedily, until all are caught or no candidate catches another. ``Suite``
  records the kept variants and the counts.
- **Checking** (``check_suite``): the prediction and the gold run on every variant of the suite
  (through the ``run`` the caller gives: the one session layer); ``SuiteCheck.passes(same)`` is
  False at the first variant whose gold ran and whose prediction errors or differs, and skips a
  variant whose gold failed or is not ``usable`` (fail-closed: such a variant can neither reward
  nor punish).
- ``TestSuites`` builds a database's variants once (``sqlrl.synth.variants.build_variants``,
  content-addressed in ``cache_dir``) and each gold's suite once (in memory, single flight per
  key, and as JSON under ``cache_dir/suites``, server variants by their SQLite file: credentials
  are never written, and a suite read back loads a variant base that was dropped again). A server database's variants are fuzzed from the SQLite file it was loaded from
  (``source``; without one: ``ValueError``) and loaded on its server as sealed bases
  (``sqlrl.synth.variants.server_variant``). A cached suite file that cannot be read back is a
  ``SuiteCacheError`` (an ``OSError``), never a silent re-distillation or a missing suite.
- Evaluation (``jobs.evaluate <kind> --test-suite``) uses these through ``sqlrl.suites.evaluation``,
  one check per benchmark.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from sqlrl.eval.compare import outer_order_by, spider_ex
from .neighbours import literals, neighbours
from sqlrl.eval.spider import Outcome

Run = Callable[[str, str], Outcome]  # (database URL, SQL) -> Outcome (rows, or an error)
Same = Callable[[Sequence[tuple], Sequence[tuple]], bool]  # (pred rows, gold rows) -> match
Usable = Callable[[Sequence[tuple]], bool]  # gold rows -> can any prediction match them?

# 2: server variants stored by their file, so a dropped base is loaded again;
# 3: the comparison's name in the key (suites distilled for BIRD's set EX are not Spider's)
SUITE_VERSION = 3
__all__ = ["Comparison", "GoldFailed", "Run", "Same", "Suite", "SuiteCacheError", "SuiteCheck",
           "TestSuites", "check_suite", "distil", "literals", "neighbours", "spider_comparison",
           "spider_ex_comparison"]


def _any_rows(rows: Sequence[tuple]) -> bool:
    return True


@dataclass(frozen=True)
class Comparison:
    """A benchmark's execution match (module doc): ``same(pred rows, gold rows)``, ``usable(gold
    rows)``; ``name`` names both in the suite cache's key (one name, one pair of functions)."""

    name: str
    same: Same
    usable: Usable = field(default=_any_rows)


def _spider_same(ordered: bool, pred: Sequence[tuple], gold: Sequence[tuple]) -> bool:
    return spider_ex(pred, gold, ordered)


def spider_ex_comparison(ordered: bool) -> Comparison:
    """``spider_ex`` (bags, or lists when ``ordered``)."""
    from functools import partial

    return Comparison("spider-ordered" if ordered else "spider", partial(_spider_same, ordered))


def spider_comparison(gold_sql: str, dialect: str = "sqlite") -> Comparison:
    """The default: ``spider_ex``, ordered when the gold's outermost query has ORDER BY."""
    return spider_ex_comparison(outer_order_by(gold_sql, dialect))


# -- distillation --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Suite:
    """The distilled test suite of one gold query on one database."""

    db_url: str
    gold_sql: str
    variants: tuple[str, ...]  # URLs of the kept variants (the original is always checked too)
    neighbours: int  # neighbours made
    caught_by_original: int  # neighbours the original database already tells apart
    caught_by_suite: int  # further neighbours the kept variants catch
    uncaught: int  # neighbours no database catches (often equivalent queries)
    candidates: int  # variants tried
    dropped: int  # candidate variants dropped because the gold failed on them

    @property
    def caught(self) -> int:
        return self.caught_by_original + self.caught_by_suite


class GoldFailed(ValueError):
    """The gold query fails on the original database: no suite can be distilled for it."""


class SuiteCacheError(OSError):
    """A file in the suites' folder cannot be read back (a folder problem, never a gold's)."""


def _caught(gold: Outcome, other: Outcome, compare: Comparison) -> bool:
    return other.error is not None or not compare.same(other.rows or (), gold.rows or ())


def distil(db_url: str, gold_sql: str, candidates: Sequence[str], near: Sequence[str], run: Run,
           dialect: str = "sqlite", compare: Comparison | None = None) -> Suite:
    """Greedy distillation (module doc); ``GoldFailed`` (a ``ValueError``) when the gold fails on
    ``db_url`` or its result there is not ``compare.usable``."""
    compare = compare or spider_comparison(gold_sql, dialect)
    gold = run(db_url, gold_sql)
    if gold.error is not None:
        raise GoldFailed(f"the gold query fails on the original database ({_redacted(db_url)}): "
                         f"{gold.error}")
    if not compare.usable(gold.rows or ()):
        raise GoldFailed(f"no prediction can match the gold's result on the original database "
                         f"({_redacted(db_url)}) under the {compare.name} comparison")
    left = [n for n in near if not _caught(gold, run(db_url, n), compare)]
    by_original = len(near) - len(left)
    catches: dict[str, set[int]] = {}
    dropped = 0
    for url in candidates:
        g = run(url, gold_sql)
        if g.error is not None or not compare.usable(g.rows or ()):
            dropped += 1
            continue
        catches[url] = {i for i, n in enumerate(left) if _caught(g, run(url, n), compare)}
    kept: list[str] = []
    todo = set(range(len(left)))
    while todo:
        best = max(catches, key=lambda u: (len(catches[u] & todo), -len(kept)), default=None)
        if best is None or not catches[best] & todo:
            break
        kept.append(best)
        todo -= catches.pop(best)
    return Suite(db_url, gold_sql, tuple(kept), len(near), by_original, len(left) - len(todo),
                 len(todo), len(candidates), dropped)


# -- checking a prediction -----------------------------------------------------------------------

@dataclass(frozen=True)
class SuiteCheck:
    """A prediction's and the gold's outcomes on each variant of a suite."""

    results: tuple[tuple[str, Outcome, Outcome], ...]  # (variant URL, gold, prediction)

    def passes(self, same: Same, usable: Usable = _any_rows) -> tuple[bool, str | None]:
        """(True, None) when the prediction matches on every variant whose gold ran with a
        ``usable`` result, else (False, the first variant where it errors or differs)."""
        for url, gold, pred in self.results:
            if gold.error is not None or not usable(gold.rows or ()):
                continue  # fail-closed: a variant the gold fails on is dropped
            if pred.error is not None or not same(pred.rows or (), gold.rows or ()):
                return False, url
        return True, None

    @property
    def dropped(self) -> int:
        """Variants whose gold failed (those ``passes`` skips; an unusable result is counted by
        ``passes``' caller, who knows the comparison)."""
        return sum(g.error is not None for _, g, _ in self.results)


def check_suite(suite: Suite, run: Run, pred_sql: str, gold_sql: str | None = None) -> SuiteCheck:
    gold_sql = suite.gold_sql if gold_sql is None else gold_sql
    return SuiteCheck(tuple((u, run(u, gold_sql), run(u, pred_sql)) for u in suite.variants))


# -- the cache -----------------------------------------------------------------------------------

class TestSuites:
    """Variants per database and a suite per gold query, built once each (module doc).
    Thread-safe."""

    __test__ = False  # not a pytest class

    def __init__(self, cache_dir: str | Path, *, k: int = 8, literal_k: int = 3,
                 max_neighbours: int = 48) -> None:
        self.cache_dir = Path(cache_dir)
        self.k = k
        self.literal_k = literal_k
        self.max_neighbours = max_neighbours
        self._suites: dict[tuple[str, str, str, str], Suite] = {}
        self._gates: dict[tuple[str, str, str, str], threading.Lock] = {}
        self._lock = threading.Lock()
        self._files: dict[str, Path] = {}  # server variant database name -> its SQLite file
        self.distilled = 0  # suites distilled by this object (not read from memory or disk)

    def variants(self, db_id: str, url: str, gold_sql: str | None = None,
                 dialect: str = "sqlite", source: str | Path | None = None) -> list[str]:
        """The database's ``k`` variants, plus ``literal_k`` variants whose pools hold the gold's
        constants (``gold_sql`` given and it has any): built once each, content-addressed.
        A server database (``url`` not SQLite) needs ``source``, the SQLite file it was loaded
        from: its variants are fuzzed from that file and loaded as sealed bases on the same
        server (``server_variant``)."""
        from sqlrl.synth.domains import DOMAINS
        from sqlrl.synth.variants import build_variants, variant_urls

        path = _source_file(url, source)
        domain = db_id if db_id in DOMAINS else None
        folder = self.cache_dir / "variants"
        paths = build_variants(path, folder, k=self.k, domain=domain)
        consts = literals(gold_sql, dialect) if gold_sql else ()
        if consts and self.literal_k:
            paths += build_variants(path, folder, k=self.literal_k, seed=1000, literals=consts)
        if _is_sqlite(url):
            return variant_urls(paths)
        from sqlrl.synth.variants import server_variant, server_variant_name

        with self._lock:
            self._files.update((server_variant_name(p), p) for p in paths)
        return [server_variant(p, url, self.cache_dir / "servers") for p in paths]

    def suite(self, db_id: str, url: str, gold_sql: str, run: Run, dialect: str = "sqlite",
              source: str | Path | None = None, compare: Comparison | None = None) -> Suite:
        """The suite of ``gold_sql`` on ``url`` (distilled once; ``compare``: the benchmark's
        execution match, ``spider_comparison`` by default)."""
        compare = compare or spider_comparison(gold_sql, dialect)
        key = (db_id, url, gold_sql, compare.name)
        with self._lock:
            if key in self._suites:
                return self._suites[key]
            gate = self._gates.setdefault(key, threading.Lock())
        with gate:
            with self._lock:
                if key in self._suites:
                    return self._suites[key]
            suite = self._load_or_distil(db_id, url, gold_sql, run, dialect, source, compare)
            with self._lock:
                self._suites[key] = suite
                self._gates.pop(key, None)
            return suite

    def _load_or_distil(self, db_id: str, url: str, gold_sql: str, run: Run, dialect: str,
                        source: str | Path | None, compare: Comparison) -> Suite:
        from sqlrl.synth.bugs import SchemaInfo
        from sqlrl.synth.variants import VARIANTS_VERSION, file_digest
        from sqlrl.tasks.schema import DatabaseSchema

        db_path = _source_file(url, source)
        if not db_path.is_file():
            raise FileNotFoundError(f"database file not found: {db_path}")
        # the key holds everything the suite depends on, so a cached suite is read without
        # touching the variants (their folder is keyed by the same inputs)
        name = hashlib.sha256(json.dumps([SUITE_VERSION, VARIANTS_VERSION, db_id, url,
                                          file_digest(db_path), gold_sql, dialect, self.k,
                                          self.literal_k, self.max_neighbours,
                                          compare.name]).encode()).hexdigest()[:24]
        path = self.cache_dir / "suites" / f"{name}.json"
        if path.is_file():
            try:
                data = json.loads(path.read_text())
                return Suite(**{**data, "db_url": url, "variants": tuple(
                    self._from_stored(v, url) for v in data["variants"])})
            except (ValueError, TypeError, KeyError) as exc:  # not a suite this version wrote
                raise SuiteCacheError(f"unreadable cached test suite {path} ({exc}); remove it "
                                      f"or use another suite folder") from None
        candidates = self.variants(db_id, url, gold_sql, dialect, db_path)
        schema = SchemaInfo.from_database_schema(DatabaseSchema.from_sqlite(db_path), dialect)
        near = neighbours(gold_sql, dialect, schema, max_neighbours=self.max_neighbours)
        suite = distil(url, gold_sql, candidates, near, run, dialect, compare)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{threading.get_ident()}.tmp")
        stored = {**asdict(suite), "db_url": _redacted(url),
                  "variants": [self._to_stored(v) for v in suite.variants]}
        tmp.write_text(json.dumps(stored))
        tmp.replace(path)
        with self._lock:
            self.distilled += 1
        return suite


    def _to_stored(self, variant: str) -> str:
        """A variant as written to a suite's JSON: a SQLite URL as is, a server variant as its
        SQLite file relative to the cache folder (a server URL carries credentials; they are never
        written), so reading the suite back loads the base again if it was dropped."""
        if _is_sqlite(variant):
            return variant
        from sqlrl.db.url import parse_url

        with self._lock:
            path = self._files[str(parse_url(variant).database)]
        return "file:" + os.path.relpath(path, self.cache_dir)

    def _from_stored(self, stored: str, url: str) -> str:
        if not stored.startswith("file:"):
            return stored
        from sqlrl.synth.variants import server_variant

        return server_variant(self.cache_dir / stored[5:], url, self.cache_dir / "servers")


def _is_sqlite(url: str) -> bool:
    from sqlrl.synth.variants import sqlite_path

    return sqlite_path(url) is not None


def _source_file(url: str, source: str | Path | None) -> Path:
    """The SQLite file variants are fuzzed from: ``url``'s own, else ``source`` (a server)."""
    from sqlrl.synth.variants import sqlite_path

    own = sqlite_path(url)
    if own is not None:
        return own
    if source is None:
        raise ValueError("test-suite variants of a server database need the SQLite file it was "
                         f"loaded from (its catalog's sqlite entry); none for {_redacted(url)}")
    return Path(source)


def _redacted(url: str) -> str:
    """``url`` with any password hidden (for messages and files)."""
    from sqlrl.db.url import redact

    try:
        return redact(url)
    except Exception:  # not a URL sqlalchemy reads: say nothing of what it holds
        return url if "@" not in url else "<a database URL>"
