"""Engine adapters behind one Protocol and its optional capabilities (``contract.py``), one
module per engine, and the descriptor of each engine (``descriptor.Dialect``, the built-ins in
``engines.py``)."""

from .base import available_dialects, get_dialect, register_dialect
from .contract import AdapterContractError, DialectAdapter, contract_of
from .descriptor import (Dialect, FileCopy, LoadTypes, ServerClone, ServerTransaction, dialect_of,
                         find, register)

__all__ = ["AdapterContractError", "Dialect", "DialectAdapter", "FileCopy", "LoadTypes",
           "ServerClone", "ServerTransaction", "available_dialects", "contract_of", "dialect_of", "find",
           "get_dialect", "register", "register_dialect"]
