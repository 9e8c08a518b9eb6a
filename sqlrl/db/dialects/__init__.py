"""Engine adapters behind one Protocol and its optional capabilities (``contract.py``), one
module per engine, and the descriptor of each engine (``descriptor.Dialect``, the built-ins in
``engines.py``, registered here: importing the package registers the built-in engines).
"""

from .base import available_dialects, get_dialect, register_dialect
from .contract import AdapterContractError, DialectAdapter, contract_of
from .descriptor import (Dialect, FileCopy, LoadTypes, ServerClone, ServerTransaction, dialect_of,
                         find, register)
from . import engines  # noqa: F401  (registers the built-in engines: SQLite, PostgreSQL, ...)

__all__ = ["AdapterContractError", "Dialect", "DialectAdapter", "FileCopy", "LoadTypes",
           "ServerClone", "ServerTransaction", "available_dialects", "contract_of", "dialect_of", "find",
           "get_dialect", "register", "register_dialect"]
