"""glibc malloc settings that keep large read buffers mapped between reads.

A broker's read answer is one buffer of up to 16 MiB, freed once it has been written to the
socket; the Spark source's reader gets such answers and builds columns of the same size. With
glibc's defaults these buffers are mmap'd and unmapped each time, or trimmed off the top of
the heap, so every read faults its pages in afresh: on a loopback read of 1.1 GB that was
about 1 CPU-second of page faults in the brokers' kernel time, as much as the rest of their
work (bench/RESULTS.md, "Spark source"). Serving them from the heap and keeping up to
`TRIM_THRESHOLD_BYTES` of freed heap lets the next read reuse warm pages. Called by
`laminar serve` and by the Spark source in its Python workers; nothing else changes it.
"""

from __future__ import annotations

import ctypes
import functools
import logging

log = logging.getLogger(__name__)

#: mallopt(3) parameter numbers (malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3

#: Allocations below this come from the heap; glibc accepts at most 32 MiB on 64-bit.
MMAP_THRESHOLD_BYTES = 32 << 20
#: Freed memory at the top of the heap is returned to the kernel only beyond this.
TRIM_THRESHOLD_BYTES = 128 << 20


@functools.cache
def keep_read_buffers() -> bool:
    """Apply the settings above, once per process; False where the C library has no
    mallopt or refuses them (musl's mallopt does nothing and says so)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # no mallopt (macOS)
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    applied = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    )
    if not applied:
        log.info("malloc settings for read buffers not applied (libc refused them)")
    return applied
