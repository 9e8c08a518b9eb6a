"""Process memory: hand freed heap back to the operating system, and read the process's peak.

Why: PyTorch on CPU takes every tensor below glibc's mmap threshold (at most 32 MiB) -- a 135M
model's activations, gradients, attention blocks -- from the C heap, and glibc keeps what is freed
inside the process. Over a long job the resident set grows step by step although nothing is alive:
eight-row learner steps of SmolLM2-135M (~2000 tokens a row) left 8.8 GiB resident after three
steps, 2.1 GiB with a trim after each (docs/learner.md, "Memory"). On the 24 GiB machines this
project targets, that garbage plus a vLLM engine's KV cache is what the kernel's OOM killer sees.

Guarantees (none of them raises; on a system without the facility each is a harmless no-op):
- ``trim()`` asks the allocator to return free heap pages to the OS (glibc's ``malloc_trim(0)``,
  which releases free whole pages anywhere in the heap, not only at its top). Returns True when
  glibc reports that it released memory, False when it released none or there is no glibc (macOS,
  musl). It frees nothing that is in use: live tensors and Python objects are untouched.
- ``rss_bytes()``: the process's resident set now; ``peak_rss_bytes()``: its peak (``VmHWM`` on
  Linux, ``ru_maxrss`` elsewhere); 0 when neither can be read.
- ``peak_gib()``: ``peak_rss_bytes()`` in GiB, rounded to 0.01 (what job summaries record).
- ``reset_peak()`` starts a new peak from the current resident set (Linux: writes ``5`` to
  ``/proc/self/clear_refs``); True when it did, False where the kernel does not allow it -- then the
  peak is the process's since it started, which callers must say.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import resource
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any

GIB = 2 ** 30


@lru_cache(maxsize=1)
def _libc() -> Any:
    """glibc, when this process runs on it (``malloc_trim`` exists only there)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim_fn = libc.malloc_trim
    except (OSError, AttributeError):  # musl, or no libc found
        return None
    trim_fn.argtypes, trim_fn.restype = [ctypes.c_size_t], ctypes.c_int
    return libc


def trim() -> bool:
    """Return free heap pages to the OS; True when some were released."""
    libc = _libc()
    if libc is None:
        return False
    try:
        return bool(libc.malloc_trim(0))
    except OSError:
        return False


def _status_kib(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def rss_bytes() -> int:
    """The resident set now (0 when it cannot be read)."""
    kib = _status_kib("VmRSS")
    return kib * 1024 if kib is not None else 0


def peak_rss_bytes() -> int:
    """The peak resident set: since the last successful ``reset_peak()``, or since the process
    started (``ru_maxrss``: KiB on Linux, bytes on macOS)."""
    kib = _status_kib("VmHWM")
    if kib is not None:
        return kib * 1024
    try:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    except (OSError, ValueError):
        return 0
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024


def peak_gib() -> float:
    """The peak resident set in GiB (two decimals)."""
    return round(peak_rss_bytes() / GIB, 2)


def reset_peak() -> bool:
    """Start a new peak from the current resident set; False where that is not possible."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return _status_kib("VmHWM") is not None
