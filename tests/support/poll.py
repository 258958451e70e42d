"""Waiting for a state instead of sleeping for a guess: poll until it holds, within a deadline."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(predicate: Callable[[], object], timeout: float = 5.0, interval: float = 0.02) -> bool:
    """True as soon as `predicate()` is truthy; False if it still is not after `timeout` seconds
    (the caller's assertion then fails on the state itself)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)
    return True


def wait_steady(read: Callable[[], T], quiet: float, timeout: float = 15.0, interval: float = 0.05) -> T:
    """`read()` once its value has not changed for `quiet` seconds (or its value at `timeout`)."""
    value = read()
    deadline = time.monotonic() + timeout
    since = time.monotonic()
    while time.monotonic() - since < quiet and time.monotonic() < deadline:
        time.sleep(interval)
        now = read()
        if now != value:
            value, since = now, time.monotonic()
    return value
