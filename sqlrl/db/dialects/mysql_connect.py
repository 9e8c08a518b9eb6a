"""MariaDB/MySQL connections from a URL: the keywords for ``pymysql.connect``.

Shared by the session adapter (``mysql.py``: the agent's login on its clone) and the admin
(``mysql_admin.py``: admin and loader connections), which both import it: neither imports the
other for it, so there is no import cycle between them.

Guarantees:
- Connections are autocommit, utf8mb4, never allow ``LOCAL INFILE``; of the URL's query string
  only ``unix_socket``, ``ssl_ca``, ``ssl_cert``, ``ssl_key`` and ``charset`` pass through.
- Loopback hosts connect without TLS unless ``?ssl=1`` (no handshake: ~25 ms -> ~0.4 ms per
  connect); ``?ssl=0`` turns TLS off anywhere.
- Imports no driver and nothing of sqlrl.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import URL

__all__ = ["CONNECT_TIMEOUT_S", "connect_kwargs"]

CONNECT_TIMEOUT_S = 10
_LOOPBACK = {"127.0.0.1", "::1", "localhost"}
_PASSTHROUGH_QUERY = {"unix_socket", "ssl_ca", "ssl_cert", "ssl_key", "charset"}


def connect_kwargs(url: URL, database: str | None) -> dict[str, Any]:
    """pymysql.connect keywords for ``url`` (the agent's and the admin's)."""
    kw: dict[str, Any] = {
        "host": url.host or "127.0.0.1", "port": url.port or 3306, "user": url.username,
        "password": url.password or "", "database": database, "charset": "utf8mb4",
        "autocommit": True, "connect_timeout": CONNECT_TIMEOUT_S, "local_infile": False,
        "program_name": "sqlrl",
    }
    query = {k: (v[-1] if isinstance(v, tuple) else v) for k, v in url.query.items()}
    ssl = str(query.get("ssl", "")).lower()
    if ssl in ("0", "false", "no", "off") or (url.host in _LOOPBACK and ssl not in ("1", "true")):
        kw["ssl_disabled"] = True  # loopback: no TLS handshake (~25 ms -> ~0.4 ms per connect)
    kw.update({k: v for k, v in query.items() if k in _PASSTHROUGH_QUERY})
    return kw
