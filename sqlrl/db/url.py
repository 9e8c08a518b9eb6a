"""Database URLs, SQLAlchemy style: ``sqlite:///path/db.sqlite``, ``postgresql://user@host:port/db``,
``mysql://user@host:port/db`` (``mariadb://`` is an alias), ``mssql+pyodbc://…``, ``oracle://…``.

Parsing is SQLAlchemy's own ``make_url`` (so escaping and query strings behave as users expect);
``dialect_name`` maps a URL to the key of sqlrl's dialect registry.
"""

from __future__ import annotations

from functools import lru_cache

from sqlalchemy.engine import URL, make_url

from .types import SessionError

_ALIASES = {"postgres": "postgresql", "mariadb": "mysql", "sqlserver": "mssql"}


def parse_url(url: str | URL) -> URL:
    if isinstance(url, URL):
        return url
    return _parse(url)


@lru_cache(maxsize=4096)
def _parse(url: str) -> URL:  # URLs are immutable: parse each text once
    try:
        return make_url(url)
    except Exception as exc:  # sqlalchemy.exc.ArgumentError
        raise SessionError(f"not a database URL: {url!r} ({exc})") from exc


def dialect_name(url: URL) -> str:
    backend = url.get_backend_name()
    return _ALIASES.get(backend, backend)


def sqlite_url(path: str) -> str:
    """The URL of a SQLite database file at ``path``."""
    return f"sqlite:///{path}"


def redact(url: str | URL) -> str:
    """The URL as text with any password hidden (for logs and error messages)."""
    return parse_url(url).render_as_string(hide_password=True)
