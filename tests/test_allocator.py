"""The malloc settings for read buffers: a 16 MiB buffer comes from the heap, not from a
mapping of its own, and freeing it keeps its pages (glibc's mallinfo2 says where it lives).
Each case runs in a fresh interpreter, since the settings are process-wide."""

from __future__ import annotations

import ctypes
import subprocess
import sys

import pytest

PROBE = """
import ctypes, sys
from laminar import allocator

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
if sys.argv[1] == "keep":
    assert allocator.keep_read_buffers()
buffer = bytearray(16 << 20)
held = libc.mallinfo2()
del buffer
freed = libc.mallinfo2()
print(held.hblkhd >> 20, held.uordblks >> 20, freed.arena >> 20)
"""


def probe(mode: str) -> tuple[int, int, int]:
    """MiB mapped on their own and MiB in use on the heap while the buffer is held; MiB of
    heap left after it was freed."""
    out = subprocess.run(
        [sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True
    ).stdout
    mapped, in_heap, heap_after = (int(n) for n in out.split())
    return mapped, in_heap, heap_after


@pytest.mark.skipif(
    not hasattr(ctypes.CDLL(None), "mallinfo2"), reason="needs glibc >= 2.33 (mallinfo2)"
)
def test_a_large_read_buffer_stays_on_the_heap_once_freed() -> None:
    mapped, _, _ = probe("default")
    assert mapped >= 16  # glibc's default: a mapping of its own, unmapped when freed
    mapped, in_heap, heap_after = probe("keep")
    assert mapped < 16
    assert in_heap >= 16
    assert heap_after >= 16  # not trimmed: the next buffer reuses these pages
