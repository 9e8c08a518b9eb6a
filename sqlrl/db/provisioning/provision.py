"""Admin operations on database servers: the bases sessions clone, and the URLs they use.

Every function takes an **admin** URL (an account that may create roles/users and databases) and
dispatches on its dialect to the admin class its descriptor names (``admin.admin_ops``) (``Dialect.admin`` in
``dialects/engines.py``: ``dialects/postgresql_admin.py``, ``dialects/mysql_admin.py``).

    prepare_server(admin_url)                          # once per server (idempotent)
    url = create_database(admin_url, "shop")           # admin URL of database "shop"
    ... load tables with `url` ...
    seal_database(admin_url, "shop")                   # after loading
    open_session(session_url(admin_url, "shop"))       # every session: its own clone and role

The agent's SQL never runs as the admin: a session on a server engine runs in a scratch database
cloned from the base, as a login role/user created for that session alone (``sqlrl.db.provisioning.scratch``),
and the base is reachable by no agent account. The session URL carries the admin credentials
because the session's process creates and drops those clones. What each engine enforces is in
the admin modules' docstrings and docs/sessions.md.

All functions are idempotent (safe to repeat, and to race with another process doing the same).
"""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy.engine import URL

from ..dialects.contract import SCRATCH_PREFIX
from ..url import dialect_name, parse_url
from .admin import admin_ops
from .scratch import SCRATCH

_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_$-]{0,62}$")


# --- public API ----------------------------------------------------------------------------------

def prepare_server(admin_url: str) -> None:
    """Check the admin account and the server's settings and create what every base needs
    (PostgreSQL: the NOLOGIN owner role of the bases' tables, reset and with no member;
    ``max_locks_per_transaction`` >= 256. MariaDB: PUBLIC's default grants on ``test`` revoked,
    symbolic links off, a bounded InnoDB temporary tablespace). Raises ``SessionError`` for a
    server without the required settings (docs/sessions.md)."""
    url, ops = _resolve(admin_url)
    ops.prepare_server(url)


def create_database(admin_url: str, name: str, *, replace: bool = False) -> str:
    """Create database ``name`` if missing (``replace=True``: drop it first); returns the admin URL
    of that database."""
    url, ops = _resolve(admin_url)
    if replace:
        _forget_clones(url, name)
    ops.create_database(url, _check_db_name(name), replace)
    return url.set(database=name).render_as_string(hide_password=False)


def seal_database(admin_url: str, name: str) -> None:
    """Make database ``name`` a base sessions clone (run after loading it): no agent account can
    reach it; PostgreSQL also hands its tables to the NOLOGIN owner role, whose objects every
    clone then hands to its session's role."""
    url, ops = _resolve(admin_url)
    ops.seal(url, _check_db_name(name))


def session_url(admin_url: str, name: str) -> str:
    """The URL sessions on base ``name`` use: the admin URL with ``name`` as its database."""
    url = parse_url(admin_url)
    _check_db_name(name)
    return url.set(database=name).render_as_string(hide_password=False)


def drop_database(admin_url: str, name: str) -> None:
    """Drop database ``name`` if it exists (closing other connections to it on PostgreSQL), after
    this process's prepared clones of it."""
    url, ops = _resolve(admin_url)
    _forget_clones(url, name)
    ops.drop_database(url, _check_db_name(name))


def _forget_clones(url: URL, name: str) -> None:
    SCRATCH.forget(url, name)


def _resolve(admin_url: str) -> tuple[URL, Any]:
    url = parse_url(admin_url)
    return url, admin_ops(dialect_name(url))


def _check_db_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ValueError(f"invalid database name {name!r}: use letters, digits, _ $ - (at most 63)")
    if name.lower().startswith(SCRATCH_PREFIX):
        raise ValueError(f"database names starting with {SCRATCH_PREFIX!r} are reserved for "
                         "session scratch databases")
    return name
