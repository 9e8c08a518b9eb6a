"""sqlrl.memory: freed heap goes back to the OS, the peak is read and reset, and where the
facility is missing every call is a harmless no-op."""

import ctypes
import sys

import pytest

from sqlrl import memory

GLIBC = memory._libc() is not None
MIB = 2 ** 20


@pytest.mark.skipif(not GLIBC, reason="malloc_trim is glibc's (Linux); elsewhere trim() is a no-op, tested below")
def test_trim_returns_the_free_pages_of_a_fragmented_heap_and_keeps_live_blocks():
    libc = ctypes.CDLL("libc.so.6")  # a handle of its own: these prototypes stay out of sqlrl.memory's
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    blocks = [libc.malloc(8192) for _ in range(20_000)]  # 160 MiB of heap chunks (below the mmap threshold)
    assert all(blocks)
    for i, b in enumerate(blocks):
        ctypes.memset(b, i % 251, 8192)  # touched: resident
    kept = blocks[::16]  # every 16th stays alive, so the heap cannot shrink from its top
    alive = set(kept)
    for b in blocks:
        if b not in alive:
            libc.free(b)
    try:
        before = memory.rss_bytes()
        assert memory.trim() is True
        after = memory.rss_bytes()
        assert before - after > 100 * MIB, (before, after)  # most of the 150 MiB freed is handed back
        assert all(ctypes.string_at(b, 8192) == bytes([blocks.index(b) % 251]) * 8192 for b in kept[:50])
    finally:
        for b in kept:
            libc.free(b)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmRSS/VmHWM are Linux's /proc fields")
def test_the_peak_covers_a_freed_allocation_until_it_is_reset():
    import mmap

    assert memory.rss_bytes() > 0 and memory.peak_rss_bytes() >= memory.rss_bytes()
    # an anonymous mapping of its own (not heap memory an earlier test left free): resident once
    # touched, returned to the OS when closed, whatever the allocator holds
    block = mmap.mmap(-1, 300 * MIB)
    for i in range(0, 300 * MIB, 4096):
        block[i] = 1
    during = memory.rss_bytes()
    block.close()
    assert memory.rss_bytes() <= during - 250 * MIB
    # the peak remembers it (within the kernel's batched per-CPU RSS counters: a few hundred KiB)
    assert memory.peak_rss_bytes() >= during - 16 * MIB
    assert memory.peak_gib() == round(memory.peak_rss_bytes() / memory.GIB, 2)
    if not memory.reset_peak():
        pytest.skip("this kernel does not let a process reset its VmHWM (/proc/self/clear_refs)")
    assert memory.peak_rss_bytes() <= during - 250 * MIB  # a new peak, from the resident set now


def test_without_glibc_or_proc_every_call_is_a_no_op(monkeypatch, tmp_path):
    monkeypatch.setattr(memory, "_libc", lambda: None)
    assert memory.trim() is False
    monkeypatch.setattr(memory, "_status_kib", lambda field: None)
    assert memory.rss_bytes() == 0
    assert memory.peak_rss_bytes() > 0  # getrusage's ru_maxrss instead of VmHWM
    monkeypatch.setattr(memory, "Path", lambda p: tmp_path / "missing" / "clear_refs")
    assert memory.reset_peak() is False  # cannot reset: callers then report the process's peak
