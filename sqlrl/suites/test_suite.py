"""Test-suite execution match: distil, per gold query, the database variants that catch its near
misses, and check a prediction on them (Zhong, Yu & Klein, 2020).

    suites = TestSuites("runs/x/test_suite")              # variants + suites cached here
    suite = suites.suite(db_id, url, gold_sql, run)         # run(url, sql) -> Outcome
    checked = check_suite(suite, run, pred_sql, gold_sql)   # per-variant outcomes
    checked.passes(same)                                    # (True, None) | (False, variant URL)

- **Neighbours** of a gold query: ``sqlrl.suites.neighbours`` (the bug injector's mutations and
  generic ones: predicates dropped, comparisons flipped, DISTINCT toggled, LIMIT changed).
- **Distillation** (``distil``): the gold must run on the original database (``ValueError``
  otherwise: a clear error, no suite). A neighbour is *caught* on a database when it errors there
  or its result differs from the gold's (``spider_ex``, ordered when the gold's outermost query
  orders). Neighbours the original already catches need no variant. Among the candidate variants
  -- those where the gold itself runs (a variant where it errors is dropped, never used) -- the
  one catching the most not-yet-caught neighbours is kept, greedily, until all are caught or no
  candidate catches another. ``Suite`` records the kept variants and the counts.
- **Checking** (``check_suite``): the prediction and the gold run on every variant of the suite
  (through the ``run`` the caller gives: the one session layer); ``SuiteCheck.passes(same)`` is
  False at the first variant whose gold ran and whose prediction errors or differs, and skips a
  variant whose gold failed (fail-closed: such a variant can neither reward nor punish).
- ``TestSuites`` builds a database's variants once (``sqlrl.synth.variants.build_variants``,
  content-addressed in ``cache_dir``) and each gold's suite once (in memory, single flight per
  key, and as JSON under ``cache_dir/suites``, server variants by database name: credentials are
  never written). A server database's variants are fuzzed from the SQLite file it was loaded from
  (``source``; without one: ``ValueError``) and loaded on its server as sealed bases
  (``sqlrl.synth.variants.server_variant``).
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from sqlrl.eval.compare import outer_order_by, spider_ex
from .neighbours import literals, neighbours
from sqlrl.eval.spider import Outcome

Run = Callable[[str, str], Outcome]  # (database URL, SQL) -> Outcome (rows, or an error)
Same = Callable[[Sequence[tuple], Sequence[tuple]], bool]  # (pred rows, gold rows) -> match

SUITE_VERSION = 1
__all__ = ["GoldFailed", "Run", "Same", "Suite", "SuiteCheck", "TestSuites", "check_spider_suites",
           "check_suite", "distil", "literals", "neighbours"]


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


def _caught(gold: Outcome, other: Outcome, ordered: bool) -> bool:
    return other.error is not None or not spider_ex(other.rows or (), gold.rows or (), ordered)


def distil(db_url: str, gold_sql: str, candidates: Sequence[str], near: Sequence[str], run: Run,
           dialect: str = "sqlite") -> Suite:
    """Greedy distillation (module doc); ``GoldFailed`` (a ``ValueError``) when the gold fails on
    ``db_url``."""
    gold = run(db_url, gold_sql)
    if gold.error is not None:
        raise GoldFailed(f"the gold query fails on the original database ({_redacted(db_url)}): "
                         f"{gold.error}")
    ordered = outer_order_by(gold_sql, dialect)
    left = [n for n in near if not _caught(gold, run(db_url, n), ordered)]
    by_original = len(near) - len(left)
    catches: dict[str, set[int]] = {}
    dropped = 0
    for url in candidates:
        g = run(url, gold_sql)
        if g.error is not None:
            dropped += 1
            continue
        catches[url] = {i for i, n in enumerate(left) if _caught(g, run(url, n), ordered)}
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

    def passes(self, same: Same) -> tuple[bool, str | None]:
        """(True, None) when the prediction matches on every variant whose gold ran, else
        (False, the first variant where it errors or differs)."""
        for url, gold, pred in self.results:
            if gold.error is not None:
                continue  # fail-closed: a variant the gold fails on is dropped
            if pred.error is not None or not same(pred.rows or (), gold.rows or ()):
                return False, url
        return True, None

    @property
    def dropped(self) -> int:
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
        self._suites: dict[tuple[str, str, str], Suite] = {}
        self._gates: dict[tuple[str, str, str], threading.Lock] = {}
        self._lock = threading.Lock()
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
        from sqlrl.synth.variants import server_variant

        return [server_variant(p, url, self.cache_dir / "servers") for p in paths]

    def suite(self, db_id: str, url: str, gold_sql: str, run: Run, dialect: str = "sqlite",
              source: str | Path | None = None) -> Suite:
        key = (db_id, url, gold_sql)
        with self._lock:
            if key in self._suites:
                return self._suites[key]
            gate = self._gates.setdefault(key, threading.Lock())
        with gate:
            with self._lock:
                if key in self._suites:
                    return self._suites[key]
            suite = self._load_or_distil(db_id, url, gold_sql, run, dialect, source)
            with self._lock:
                self._suites[key] = suite
                self._gates.pop(key, None)
            return suite

    def _load_or_distil(self, db_id: str, url: str, gold_sql: str, run: Run, dialect: str,
                        source: str | Path | None) -> Suite:
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
                                          self.literal_k, self.max_neighbours]).encode()).hexdigest()[:24]
        path = self.cache_dir / "suites" / f"{name}.json"
        if path.is_file():
            data = json.loads(path.read_text())
            return Suite(**{**data, "db_url": url,
                            "variants": tuple(_from_stored(v, url) for v in data["variants"])})
        candidates = self.variants(db_id, url, gold_sql, dialect, db_path)
        schema = SchemaInfo.from_database_schema(DatabaseSchema.from_sqlite(db_path), dialect)
        near = neighbours(gold_sql, dialect, schema, max_neighbours=self.max_neighbours)
        suite = distil(url, gold_sql, candidates, near, run, dialect)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{threading.get_ident()}.tmp")
        stored = {**asdict(suite), "db_url": _redacted(url),
                  "variants": [_to_stored(v, url) for v in suite.variants]}
        tmp.write_text(json.dumps(stored))
        tmp.replace(path)
        with self._lock:
            self.distilled += 1
        return suite


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


def _to_stored(variant: str, url: str) -> str:
    """A variant as written to a suite's JSON: a SQLite URL as is, a server variant as its
    database name (a server URL carries credentials; they are never written)."""
    if _is_sqlite(variant):
        return variant
    from sqlrl.db.url import parse_url

    return "db:" + str(parse_url(variant).database)


def _from_stored(stored: str, url: str) -> str:
    if not stored.startswith("db:"):
        return stored
    from sqlrl.db.provisioning.provision import session_url

    return session_url(url, stored[3:])


# -- Spider evaluation ----------------------------------------------------------------------------

@dataclass(frozen=True)
class SpiderSuiteCheck:
    """``sqlrl.eval.spider``'s ``suite_check`` hook: ``check_spider_suites`` with the suites cached
    in ``suite_dir`` (picklable, so it travels to ``label_pairs``' child processes)."""

    suite_dir: str

    def __call__(self, verdicts: Sequence[Any], prepared: Sequence[tuple[Any, ...]], runner: Any) -> list[Any]:
        return check_spider_suites(verdicts, prepared, self.suite_dir, runner)


def check_spider_suites(verdicts: Sequence[Any], prepared: Sequence[tuple[Any, ...]],
                        suite_dir: str | Path, runner: Any) -> list[Any]:
    """``SpiderVerdict``s with ``suite_match`` set: False for a non-match, else whether the
    prepared prediction also matches on every variant of the prepared gold's suite, distilled on
    the database's main file (``<db_id>.sqlite``). A gold whose suite cannot be built keeps its
    EX verdict and gets ``suite_failed_on="no suite: <why>"`` (counted as passing: no variant
    caught it)."""
    from dataclasses import replace

    suites = TestSuites(suite_dir)
    out = []
    for v, (urls, gold, pred) in zip(verdicts, prepared):
        if not v.match:
            out.append(replace(v, suite_match=False))
            continue
        main = next((u for u in urls if u.endswith(f"/{v.db_id}.sqlite")), urls[0])
        try:
            suite = suites.suite(v.db_id, main, gold[1], runner.run)
        except (ValueError, OSError) as exc:
            out.append(replace(v, suite_match=True, suite_failed_on=f"no suite: {exc}"))
            continue
        ok, where = check_suite(suite, runner.run, pred[1]).passes(
            lambda p, g, o=v.order_matters: spider_ex(p, g, o))
        out.append(replace(v, suite_match=ok, suite_failed_on=where))
    return out
