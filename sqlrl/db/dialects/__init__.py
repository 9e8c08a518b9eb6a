"""Engine adapters behind one Protocol (``base.DialectAdapter``), one module per engine, and the
descriptor of each engine (``descriptor.Dialect``, the built-ins in ``engines.py``)."""

from .base import DialectAdapter, available_dialects, get_dialect, register_dialect
from .descriptor import Dialect, LoadTypes, dialect_of, find, register

__all__ = ["Dialect", "DialectAdapter", "LoadTypes", "available_dialects", "dialect_of", "find",
           "get_dialect", "register", "register_dialect"]
