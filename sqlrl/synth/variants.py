"""Database variants for test-suite execution match: same schema, other contents.

    paths = build_variants("spider/database/pets_1/pets_1.sqlite", cache_dir="runs/x/variants")
    paths = build_variants("library.sqlite", cache_dir, domain="library")   # + reseeded builds

A prediction that returns the gold's rows on one database may do so by luck (a filter that selects
the same rows by accident, ``[] == []``). Test-suite accuracy (Zhong, Yu & Klein, 2020) also
compares on *variants* of the database; ``sqlrl.suites.test_suite`` distils, per gold query, the
variants that tell it apart from its near misses.

Two ways to make a variant (``VariantSpec.kind``):
- ``reseed`` (synthetic domains only): ``build_domain_db`` with another seed and scale -- the
  domain's own generator, so every annotation (codes, FKs, NULLs) holds by construction.
- ``fuzz`` (any SQLite database, Spider's included; ``sqlrl.synth.fuzz``): a new file made by
  the source's own CREATE statements (tables and indexes first, views and triggers after the
  rows, so no trigger fires while filling; a large source is never copied), every table filled,
  parents before children, by a
  ``PROFILES`` entry: ``resample`` (values drawn from the column's own values, numbers perturbed
  by ±1 / ±10%), ``duplicates`` (two values per non-key column: repeated rows), ``nulls``
  (nullable columns NULL with p=0.35), ``boundary`` (min, max, min-1, max+1, 0, '' mixed in),
  ``empty`` (one table, picked by the seed, and every table referencing it, left empty).

Guarantees of a fuzzed variant (tests/unit/test_variants.py):
- The schema is the source's (``sqlite_master`` is unchanged); every value of a column is one of
  that column's own values in the source or a perturbation of the same storage class (an integer
  stays an integer, text stays text), NULL only in a column that allows it.
- A table empty in the source stays empty. Primary keys and UNIQUE indexes hold; NOT NULL holds; a foreign key's values are values of the
  referenced columns in the variant (``PRAGMA foreign_key_check`` is empty) -- except on a
  reference cycle between tables, where the later table's values come from the source instead.
  A row the engine still refuses (a CHECK constraint) is dropped, never forced.
- Deterministic: the same source, spec and ``max_rows`` give the same rows.
- Cached content-addressed: ``build_variants`` keys the set by the source file's SHA-256, the plan
  and ``VARIANTS_VERSION``; a set is built once (in-process lock; written to a temporary folder and
  renamed, so concurrent processes never see half a set) and reused by every later call.
- Bad input: a missing or non-SQLite source raises ``FileNotFoundError`` / ``ValueError`` naming it.

Server databases (PostgreSQL, MariaDB/MySQL): ``server_variant`` loads a variant file on the
server of a database loaded from SQLite (``sqlrl.db.provisioning.loader.load_sqlite``: the same loader, so
the same column types and lower-cased names) as a sealed base named by the file's SHA-256, once
per server (a marker file under the cache folder, written after the load; a file lock keeps two
processes from loading it twice). They stay on the server until ``drop_server_variants``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

from .fuzz import DEFAULT_MAX_ROWS, PROFILES, _check_sqlite, fuzz_sqlite

__all__ = ["DEFAULT_MAX_ROWS", "PROFILES", "VARIANTS_VERSION", "VariantSpec", "build_variants",
           "drop_server_variants", "file_digest", "fuzz_sqlite", "server_variant",
           "server_variant_name", "sqlite_path", "variant_plan", "variant_urls"]

VARIANTS_VERSION = 2


@dataclass(frozen=True)
class VariantSpec:
    kind: str  # "reseed" (synthetic domains) or "fuzz"
    profile: str  # a PROFILES key ("fuzz"), or the scale as text ("reseed")
    seed: int


# -- plans and the cache -------------------------------------------------------------------------

def variant_plan(k: int = 8, domain: str | None = None, seed: int = 0) -> tuple[VariantSpec, ...]:
    """``k`` variant specs: for a synthetic ``domain``, a third are reseeded builds (scales 0.3,
    1.0, 2.0 in turn); the rest cycle through the fuzz profiles."""
    if k < 1:
        raise ValueError(f"k (variants per database) must be >= 1, got {k}")
    specs: list[VariantSpec] = []
    if domain is not None:
        scales = ("0.3", "1.0", "2.0")
        specs += [VariantSpec("reseed", scales[i % 3], seed + 1 + i) for i in range(max(1, k // 3))]
    names = list(PROFILES)
    specs += [VariantSpec("fuzz", names[i % len(names)], seed + i) for i in range(k - len(specs))]
    return tuple(specs)


_HASHES: dict[tuple[str, int, int], str] = {}
_LOCKS: dict[str, threading.Lock] = {}
_LOCK = threading.Lock()
builds = 0  # variant sets built by this process (the cache's tests read it)


def file_digest(path: Path) -> str:
    st = path.stat()
    key = (str(path.resolve()), st.st_mtime_ns, st.st_size)
    if key not in _HASHES:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        _HASHES[key] = h.hexdigest()
    return _HASHES[key]


def build_variants(source: str | Path, cache_dir: str | Path, *, k: int = 8,
                   domain: str | None = None, seed: int = 0,
                   max_rows: int = DEFAULT_MAX_ROWS, literals: Sequence[Any] = ()) -> list[Path]:
    """The variant files of ``source`` (built once, then read from ``cache_dir``; module doc).
    ``literals``: a query's constants for the fuzzed variants' pools (``fuzz_sqlite``); a set
    with literals is a set of that query, cached under its own key."""
    global builds
    source = Path(source)
    _check_sqlite(source)
    plan = variant_plan(k, domain, seed)
    meta = {"version": VARIANTS_VERSION, "source_sha256": file_digest(source), "domain": domain,
            "max_rows": max_rows, "plan": [asdict(s) for s in plan],
            "literals": [[type(v).__name__, v] for v in literals]}
    key = hashlib.sha256(json.dumps(meta, sort_keys=True).encode()).hexdigest()[:20]
    folder = Path(cache_dir) / key
    paths = [folder / f"v{i}.sqlite" for i in range(len(plan))]
    with _LOCK:
        gate = _LOCKS.setdefault(key, threading.Lock())
    with gate:
        if (folder / "manifest.json").is_file():
            return paths
        Path(cache_dir).mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=cache_dir))
        try:
            for spec, path in zip(plan, paths):
                _build_one(source, tmp / path.name, spec, domain, max_rows, literals)
            (tmp / "manifest.json").write_text(json.dumps({**meta, "source": str(source)}, indent=1))
            try:
                os.rename(tmp, folder)
            except OSError:  # another process renamed its copy first: use that one
                if not (folder / "manifest.json").is_file():
                    raise
            builds += 1
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return paths


def _build_one(source: Path, dest: Path, spec: VariantSpec, domain: str | None, max_rows: int,
               literals: Sequence[Any]) -> None:
    if spec.kind == "reseed":
        from .domains import build_domain_db

        build_domain_db(domain, str(dest), seed=spec.seed, scale=float(spec.profile))  # type: ignore[arg-type]
    else:
        fuzz_sqlite(source, dest, spec.profile, spec.seed, max_rows, literals)


def sqlite_path(url: str) -> Path | None:
    """The file of a ``sqlite:///path`` URL (None for other engines)."""
    from sqlrl.db.url import parse_url

    parsed = parse_url(url)
    path = getattr(parsed, "database", None) or getattr(parsed, "path", None)
    if not url.lower().startswith("sqlite") or not path:
        return None
    return Path(path)


def variant_urls(paths: Sequence[Path]) -> list[str]:
    return [f"sqlite:///{p.resolve()}" for p in paths]


def _server_folder(url: str, cache_dir: str | Path) -> Path:
    from sqlrl.db.url import parse_url

    parsed = parse_url(url)
    server = hashlib.sha256(f"{parsed.drivername}://{parsed.host}:{parsed.port}".encode()).hexdigest()[:12]
    return Path(cache_dir) / server


def drop_server_variants(url: str, cache_dir: str | Path) -> list[str]:
    """Drop every variant base this cache loaded on the server of ``url`` (an admin or session
    URL of that server) and forget them; returns their names. Variant bases are one per variant
    file and stay on the server until this is called (e.g. when a run ends)."""
    from sqlrl.db.provisioning.provision import drop_database

    dropped = []
    for marker in sorted(_server_folder(url, cache_dir).glob("*.loaded")):
        name = marker.read_text()
        drop_database(url, name)
        marker.unlink()
        dropped.append(name)
    return dropped


def server_variant_name(path: Path) -> str:
    """The database name of variant file ``path`` on a server (``tsv_`` + its SHA-256)."""
    return "tsv_" + file_digest(path)[:24]


def server_variant(path: Path, url: str, cache_dir: str | Path) -> str:
    """The session URL of variant file ``path`` on the server of ``url`` (a session URL of a base
    loaded from SQLite, which carries the admin account), loaded once (module doc)."""
    import fcntl

    from sqlrl.db.provisioning.loader import load_sqlite
    from sqlrl.db.provisioning.provision import session_url

    name = server_variant_name(path)
    folder = _server_folder(url, cache_dir)
    folder.mkdir(parents=True, exist_ok=True)
    marker = folder / f"{name}.loaded"
    with open(folder / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not marker.is_file():
            load_sqlite(str(path), url, name, replace=True)
            marker.write_text(name)
    return session_url(url, name)
