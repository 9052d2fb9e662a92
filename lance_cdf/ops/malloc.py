"""glibc's malloc, brought once per process to keep freed decode buffers for reuse, and
held to few arenas: opt-ins, never a side effect of importing or calling the library.

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


def _glibc(function: str) -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    """glibc's `function`, or None (another C library, or not found)."""
    if platform.libc_ver()[0] != "glibc":
        return None
    try:
        return getattr(ctypes.CDLL(None), function)
    except (OSError, AttributeError):
        return None


def _mallopt(parameter: int, value: int) -> bool:
    """glibc's `mallopt(parameter, value)`; False where it refused or is not glibc."""
    mallopt = _glibc("mallopt")
    if mallopt is None:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return bool(mallopt(parameter, int(value)) == 1)


@functools.cache
def keep_freed_memory() -> None:
    """Bring glibc's malloc to the state it reaches by itself once a buffer just under
    32 MiB has been freed: blocks below that size are served from the heap, and freed
    memory up to twice that is kept rather than handed back to the kernel. The process
    then keeps up to ~64 MiB of freed memory per malloc arena.

    In a fresh process the thresholds are low (128 KiB), and pylance's decode threads
    free their buffers (a few MiB each) at the top of their heaps: glibc hands the
    memory back (madvise) and the next read page-faults it in again: a large insert's
    read calls took longer that way (docs/benchmarks.md, "Reading rows").
    This frees one such block once per process: glibc raises the thresholds exactly as
    after any large read (24 MiB read calls did it implicitly).
    Thresholds set by the user (mallopt, MALLOC_*_ environment variables) turn the
    dynamic rise off, and are left as they are; other C libraries are left alone.
    """
    malloc, free = _glibc("malloc"), _glibc("free")
    if malloc is None or free is None:
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


ARENAS_ENV = "LANCE_CDF_MALLOC_ARENAS"
DEFAULT_ARENAS = 2
_M_ARENA_MAX = -8  # mallopt's parameter number (malloc.h)
_bounded = False  # this process opted in to `bound_arenas`: it may trim after big work


def bound_arenas(arenas: int = DEFAULT_ARENAS) -> None:
    """Let glibc's malloc make at most `arenas` arenas from now on (`mallopt(M_ARENA_MAX)`;
    call it before the process starts threads), and let `release_freed_memory` trim.

    glibc gives threads their own arenas, up to 8 per core, and what a thread frees stays
    in its arena. pylance's compaction (`compact_files` of a 200k-row 128-d table, as a
    replica's upkeep runs it) works on many threads, and a process held far more after
    the compactions with glibc's limit than with 2 arenas, least with 2 arenas and
    `release_freed_memory` after each; `malloc_trim(0)` alone did not bring it down.
    The replicator compacts every 100 commits and grew by steps at its compactions for as
    long as it ran. Replication throughput with 2 arenas: no loss (docs/benchmarks.md,
    "Soak: 30 minutes of publish + replicate")."""
    global _bounded
    if _mallopt(_M_ARENA_MAX, arenas):
        _bounded = True


def bound_arenas_unless_told() -> None:
    """`bound_arenas()` as lance-cdf's commands do, unless `LANCE_CDF_MALLOC_ARENAS` says
    otherwise: a number of arenas, or 0 for glibc's own limit."""
    arenas = int(os.environ.get(ARENAS_ENV, DEFAULT_ARENAS) or 0)
    if arenas > 0:
        bound_arenas(arenas)


def release_freed_memory() -> None:
    """Hand the memory freed in every arena back to the kernel (`malloc_trim(0)`), in a
    process that opted in through `bound_arenas` (after a compaction: what it freed is not
    needed until the next one, 100 commits later); else nothing."""
    trim = _glibc("malloc_trim") if _bounded else None
    if trim is None:
        return
    trim.argtypes = [ctypes.c_size_t]
    trim(0)


MMAP_ENV = "LANCE_CDF_MALLOC_MMAP_THRESHOLD"
DEFAULT_MMAP_THRESHOLD = 1 << 20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers (malloc.h)
_GLIBC_TRIM_THRESHOLD = 128 << 10  # glibc's initial M_TRIM_THRESHOLD


def map_large_blocks(threshold: int = DEFAULT_MMAP_THRESHOLD) -> None:
    """Serve every block of `threshold` bytes or more with a mapping of its own, handed back
    to the kernel when it is freed, and return the heap's free top beyond glibc's initial
    128 KiB (`mallopt(M_MMAP_THRESHOLD)`, `mallopt(M_TRIM_THRESHOLD)`; glibc's dynamic
    thresholds, which `keep_freed_memory` raises to 32 / 64 MiB, are then off).

    For a process whose large blocks come in bursts far apart: the replicator's compaction
    and key-map rebuild every 100 batches. With the raised thresholds their blocks were
    carved from the arenas and left them fragmented: in the soak the replicator's heap held
    more freed memory after every compaction while the memory in use stayed level; with
    blocks of 1 MiB and more mapped, it is level after the first compaction
    (docs/benchmarks.md, "Soak: 30 minutes of publish + replicate")."""
    if _mallopt(_M_MMAP_THRESHOLD, threshold):
        _mallopt(_M_TRIM_THRESHOLD, _GLIBC_TRIM_THRESHOLD)


def map_large_blocks_unless_told() -> None:
    """`map_large_blocks()` as `lance-cdf replicate` does, unless
    `LANCE_CDF_MALLOC_MMAP_THRESHOLD` says otherwise: a size in bytes, or 0 to leave glibc's
    thresholds as they are."""
    threshold = int(os.environ.get(MMAP_ENV, DEFAULT_MMAP_THRESHOLD) or 0)
    if threshold > 0:
        map_large_blocks(threshold)
