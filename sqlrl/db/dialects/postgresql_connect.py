"""PostgreSQL connections from a URL: the libpq keywords for ``psycopg2.connect``.

Shared by the session adapter (``postgresql.py``: the agent's login on its clone) and the admin
(``postgresql_admin.py``: admin and loader connections), which both import it: neither imports
the other for it, so there is no import cycle between them.

Guarantees:
- The URL's query string passes through to libpq, except sqlrl's own keys (``allow_superuser``:
  refused by the adapter, never sent).
- Loopback hosts connect without TLS (``sslmode=disable``: no SSLRequest round trip).
- Imports no driver and nothing of sqlrl.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import URL

__all__ = ["CONNECT_TIMEOUT_S", "connect_kwargs"]

CONNECT_TIMEOUT_S = 10
_LOOPBACK = {"127.0.0.1", "::1", "localhost"}
_OWN_QUERY_KEYS = {"allow_superuser"}  # refused by the adapter's connect, never passed to libpq


def connect_kwargs(url: URL, database: str | None = None) -> dict[str, Any]:
    """psycopg2.connect keywords for ``url`` (its query string passes through to libpq)."""
    kw: dict[str, Any] = {
        "host": url.host, "port": url.port, "user": url.username, "password": url.password,
        "dbname": database or url.database or "postgres",
        "connect_timeout": CONNECT_TIMEOUT_S, "application_name": "sqlrl",
    }
    if url.host in _LOOPBACK:
        kw["sslmode"] = "disable"  # no SSLRequest round trip on loopback
    for key, value in url.query.items():
        if key not in _OWN_QUERY_KEYS:
            kw[key] = value[-1] if isinstance(value, tuple) else value
    return {k: v for k, v in kw.items() if v is not None}
