"""Seeded SQLite database generators ("domains") with the semantic annotations question templates need.

    from sqlrl.synth.domains import DOMAINS, build_domain_db
    build_domain_db(DOMAINS["library"], "/tmp/library.sqlite", seed=0)

Guarantees:
- ``DOMAINS`` maps a name to a frozen ``Domain``: its tables (each with a singular/plural noun), every
  column's phrase ("date of birth") and role (``ROLES``), optional value codes (``status = 2`` means
  "cancelled", used to write BIRD-style evidence) and the foreign keys (the join paths).
- ``build_domain_db(domain, path, seed, scale)`` replaces ``path`` with a database whose schema matches
  the annotations exactly (the DDL is generated from them, except for "shop", which is the existing
  ``sqlrl.tasks.demo_db`` database and is checked against its annotations by the tests). The same
  ``(seed, scale)`` gives a byte-identical file. Every domain has foreign keys that hold
  (``PRAGMA foreign_key_check`` is empty), NULLs, ISO dates, free text and duplicate values.
- Bad input (unknown domain name, non-positive scale) raises ``ValueError`` naming the problem.
"""

from __future__ import annotations

from .domains_base import (ROLES, Column, Domain, ForeignKey, Table, scaled)
from .domains_base import build_domain_db as _build
from .domains_data import ALL

__all__ = ["DOMAINS", "ROLES", "Column", "Domain", "ForeignKey", "Table", "build_domain_db",
           "get_domain", "scaled"]

DOMAINS: dict[str, Domain] = {d.name: d for d in ALL}


def get_domain(name: str) -> Domain:
    try:
        return DOMAINS[name]
    except KeyError:
        raise ValueError(f"unknown domain {name!r}; known: {', '.join(sorted(DOMAINS))}") from None


def build_domain_db(domain: Domain | str, path: str, seed: int = 0, scale: float = 1.0) -> str:
    """Write ``domain``'s database (a ``Domain`` or a name in ``DOMAINS``) to ``path``, replacing it;
    returns ``path``. Same ``(seed, scale)`` -> byte-identical file."""
    return _build(get_domain(domain) if isinstance(domain, str) else domain, path, seed, scale)
