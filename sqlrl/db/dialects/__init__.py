"""Engine adapters behind one Protocol (``base.DialectAdapter``), one module per engine."""

from .base import DialectAdapter, available_dialects, get_dialect, register_dialect

__all__ = ["DialectAdapter", "available_dialects", "get_dialect", "register_dialect"]
