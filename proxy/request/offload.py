"""Inspection work too big for the event loop, done on one worker thread.

Parsing a large request body, decoding and parsing a large answer read whole, fingerprinting a
large answer's text: on the loop, each held every other call (and /healthz) for as long as it took
(issue 30: 0.4 s per 256 KB query, seconds for 7 MB answers). On a worker thread the loop runs
while it works; one thread, not a pool, because the work holds the GIL: each more thread busy with
it is one more the loop waits behind for its turn (every `sys.getswitchinterval()`, 5 ms). So the
loop waits at most one switch interval per turn, and big inspections queue behind each other.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")
OFF_LOOP_BYTES = 64 * 1024  # work on a body or text past this size goes to the worker thread
_worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ragtoll-inspect")


async def off_loop(fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` on the inspection thread (contextvars are not carried: `fn` must be pure)."""
    return await asyncio.get_running_loop().run_in_executor(_worker, functools.partial(fn, *args))


async def off_loop_if_big(size: int, fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` here when `size` is at most OFF_LOOP_BYTES, else on the inspection thread."""
    return await off_loop(fn, *args) if size > OFF_LOOP_BYTES else fn(*args)
