"""The process-wide inspection bound (request/buffers.py): what one reader holds, what it reserves
ahead, and that everything goes back."""

from __future__ import annotations

from ragtoll.proxy.request.buffers import Held, InspectBytes


def test_an_answer_read_whole_holds_its_copy_with_its_raw_bytes() -> None:
    """Two 7-byte answers under a 16-byte bound: the first holds raw bytes and its decoded copy's
    room at once, so the second streams instead; before, each held its raw bytes and both copies
    were refused, and neither answer was read."""
    pool = InspectBytes(16)
    first_raw, first_copy = Held(pool), Held(pool)
    assert first_raw.take(7) and first_copy.reserve(7)
    second_raw = Held(pool)
    assert not second_raw.take(7)  # past the bound: this one passes through unread
    assert first_copy.take(4) and first_copy.take(3)  # the decoded copy spends what it reserved
    assert pool.held == 14
    assert not first_copy.take(3)  # past its reservation it asks the pool, which is full
    for held in (first_raw, first_copy, second_raw):
        held.release()
    assert pool.held == 0


def test_a_reservation_given_back_unspent() -> None:
    pool = InspectBytes(10)
    held = Held(pool)
    assert held.reserve(6) and held.take(2)
    held.release()
    assert (pool.held, held.held, held.credit) == (0, 0, 0)
    assert Held(None).reserve(10**12)  # no bound configured: nothing to hold
