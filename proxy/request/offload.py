"""Inspection work too big for the event loop, done on one worker thread.

Parsing a large request body, decoding and parsing a large answer read whole, fingerprinting a
large answer's text: on the loop, each held every other call (and /healthz) for as long as it took
(issue 30: 0.4 s per 256 KB query, seconds for 7 MB answers). On a worker thread the loop runs
while it works; one thread, not a pool, because the work holds the GIL: each more thread busy with
it is one more the loop waits behind for its turn (every `sys.getswitchinterval()`, 5 ms). So the
loop waits at most one switch interval per turn, and big inspections queue behind each other.

After every TRIM_EVERY bytes of such work the thread asks glibc to give freed memory back
(`malloc_trim(3)`, which releases the GIL): a big answer parses into many small objects, freed
into the middle of the heap, and without a trim 100 answers of 7 MB left 400 MB held after they
had all ended (issue 30). A no-op off glibc.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")
OFF_LOOP_BYTES = 64 * 1024  # work on a body or text past this size goes to the worker thread
TRIM_EVERY = 64 * 1024 * 1024
_worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ragtoll-inspect")
_done = 0  # bytes of work since the last trim (touched by the one worker thread only)


def _libc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        return getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None
    except OSError:
        return None


_trim = _libc_trim()


def _run(size: int, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
    global _done
    try:
        return fn(*args)
    finally:
        _done += size
        if _done >= TRIM_EVERY and _trim is not None:
            _done = 0
            _trim(0)


def trim_soon() -> None:
    """Give freed memory back once the inspection thread is free (the process just let go of much)."""
    if _trim is not None:
        _worker.submit(_trim, 0)


async def off_loop(size: int, fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` on the inspection thread; `size`: the bytes it works on (contextvars are not
    carried: `fn` must be pure)."""
    return await asyncio.get_running_loop().run_in_executor(_worker, functools.partial(_run, size, fn, args))


async def off_loop_if_big(size: int, fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` here when `size` is at most OFF_LOOP_BYTES, else on the inspection thread."""
    return await off_loop(size, fn, *args) if size > OFF_LOOP_BYTES else fn(*args)
