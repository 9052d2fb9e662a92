"""glibc's malloc, brought once per process to keep freed decode buffers for reuse: an
opt-in, never a side effect of importing or calling the library.

lance-cdf's own processes opt in (the `lance-cdf` commands, and through the environment
variable `LANCE_CDF_KEEP_FREED_MEMORY=1` that they pass on, the Spark Python workers
they start). A library user opts in with one call, `lance_cdf.keep_freed_memory()`, or
by setting the variable (e.g. `spark.executorEnv.LANCE_CDF_KEEP_FREED_MEMORY=1` for the
executors of a Spark application reading `format("lance-cdf")`).
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform

ENV = "LANCE_CDF_KEEP_FREED_MEMORY"

# What glibc's dynamic thresholds rise to at most (DEFAULT_MMAP_THRESHOLD_MAX on 64-bit).
_GLIBC_MMAP_THRESHOLD_MAX = 32 << 20


@functools.cache
def keep_freed_memory() -> None:
    """Bring glibc's malloc to the state it reaches by itself once a buffer just under
    32 MiB has been freed: blocks below that size are served from the heap, and freed
    memory up to twice that is kept rather than handed back to the kernel. The process
    then keeps up to ~64 MiB of freed memory per malloc arena.

    In a fresh process the thresholds are low (128 KiB), and pylance's decode threads
    free their buffers (a few MiB each) at the top of their heaps: glibc hands the
    memory back (madvise) and the next read page-faults it in again. A 100,000-row
    insert of a 128-d vector table read in 8 MiB calls paid ~12,000 page faults per
    call that way (24-28 ms against 12-14 ms with the thresholds raised; BENCHMARKS.md,
    issue 18, eighth pass). This frees one such block once per process: glibc raises the
    thresholds exactly as after any large read (24 MiB read calls did it implicitly).
    Thresholds set by the user (mallopt, MALLOC_*_ environment variables) turn the
    dynamic rise off, and are left as they are; other C libraries are left alone.
    """
    if platform.libc_ver()[0] != "glibc":
        return
    try:
        libc = ctypes.CDLL(None)
        malloc, free = libc.malloc, libc.free
    except (OSError, AttributeError):
        return
    malloc.restype = ctypes.c_void_p
    malloc.argtypes = [ctypes.c_size_t]
    free.argtypes = [ctypes.c_void_p]
    block = malloc(_GLIBC_MMAP_THRESHOLD_MAX - (1 << 20))
    if block:
        free(block)


def keep_freed_memory_if_asked() -> None:
    """`keep_freed_memory()` if the environment asks for it (`LANCE_CDF_KEEP_FREED_MEMORY=1`):
    how the Spark workers of lance-cdf's commands, which inherit it, opt in."""
    if os.environ.get(ENV) == "1":
        keep_freed_memory()
