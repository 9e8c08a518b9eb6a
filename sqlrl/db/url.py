"""Database URLs, SQLAlchemy style: ``sqlite:///path/db.sqlite``, ``postgresql://user@host:port/db``,
``mysql://user@host:port/db`` (``mariadb://`` is an alias), ``mssql+pyodbc://…``, ``oracle://…``.

Parsing is SQLAlchemy's own ``make_url`` (so escaping and query strings behave as users expect);
``dialect_name`` maps a URL to the key of sqlrl's dialect registry (a scheme may be any name or
alias of a registered engine: ``dialects/engines.py``).
"""

from __future__ import annotations

from functools import lru_cache

from sqlalchemy.engine import URL, make_url

from .dialects.descriptor import find
from .types import SessionError


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
    """The registered engine ``url``'s scheme names (``mariadb://`` -> ``mysql``); an unknown
    scheme is returned as is (opening a session on it then names the known ones)."""
    backend = url.get_backend_name()
    found = find(backend)
    return found.name if found is not None else backend


def sqlite_url(path: str) -> str:
    """The URL of a SQLite database file at ``path``."""
    return f"sqlite:///{path}"


def redact(url: str | URL) -> str:
    """The URL as text with any password hidden (for logs and error messages)."""
    return parse_url(url).render_as_string(hide_password=True)
