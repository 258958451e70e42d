"""The bounded copy of a response ragtoll reads (proxy/request/inspection.py) and the SSE splitter it feeds."""

from __future__ import annotations

import gzip
import random
import zlib

from ragtoll.proxy.adapters.base import SseReader
from ragtoll.proxy.model import Observation
from ragtoll.proxy.request.inspection import Inspector


class Recorder:
    def __init__(self) -> None:
        self.observation = Observation()
        self.fed = 0
        self.ended = False

    def feed(self, chunk: bytes, end: bool) -> None:
        self.fed += len(chunk)
        self.ended = self.ended or end


def inspector(rec: Recorder, encoding: str = "", content_type: str = "application/json", max_bytes: int = 1 << 20,
              max_event: int = 1 << 16) -> Inspector:
    return Inspector(rec, content_encoding=encoding, content_type=content_type, max_bytes=max_bytes,
                     max_event_bytes=max_event)


def test_a_gzip_bomb_stops_at_the_bound_without_inflating_it() -> None:
    z = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    bomb = z.compress(bytes(64 << 20)) + z.flush()  # 64 MiB of zeros in ~64 KB
    rec = Recorder()
    ins = inspector(rec, "gzip", max_bytes=1 << 20)
    assert ins.feed(bomb) is None  # one call, and it never held more than the bound + 1 byte
    assert rec.fed == 0 and "max_inspect_bytes" in (rec.observation.unread or "")
    assert ins.feed(b"more") is None
    ins.end()
    assert not rec.ended  # an observer that stopped reading does not conclude anything


def test_gzip_within_the_bound_is_decoded_across_chunks() -> None:
    body = gzip.compress(b'{"ok": true}' * 1000)
    rec = Recorder()
    ins = inspector(rec, "gzip")
    out = b"".join(p for i in range(0, len(body), 7) if (p := ins.feed(body[i:i + 7])) is not None)
    ins.end()
    assert out == b'{"ok": true}' * 1000 and rec.ended and rec.observation.unread is None


def test_an_identity_body_over_the_bound_stops_being_read() -> None:
    rec = Recorder()
    ins = inspector(rec, max_bytes=100_000)
    assert ins.feed(b"x" * 60_000) is not None
    assert ins.feed(b"x" * 60_000) is None
    assert rec.fed == 60_000 and rec.observation.unread


def test_an_event_stream_is_not_bounded_in_total_only_per_event() -> None:
    rec = Recorder()
    ins = inspector(rec, content_type="text/event-stream", max_bytes=100_000, max_event=1000)
    event = b"data: " + b"y" * 500 + b"\n\n"
    for _ in range(1000):  # 500 KB in all, well past max_bytes
        assert ins.feed(event) is not None
    assert rec.observation.unread is None
    assert ins.feed(b"data: " + b"z" * 2000) is None  # one event past max_event
    assert "max_event_bytes" in (rec.observation.unread or "")


def test_an_event_end_split_across_chunks_is_seen() -> None:
    rec = Recorder()
    ins = inspector(rec, content_type="text/event-stream", max_event=1000)
    for _ in range(50):  # each event is 900 bytes; its blank line straddles two chunks
        assert ins.feed(b"data: " + b"q" * 893 + b"\r\n\r") is not None
        assert ins.feed(b"\n") is not None
    assert rec.observation.unread is None


def test_an_encoding_ragtoll_cannot_read_is_passed_on_unread() -> None:
    rec = Recorder()
    ins = inspector(rec, "br")
    assert ins.feed(b"\x8b\x00") is None
    assert "content-encoding" in (rec.observation.unread or "")


def test_corrupt_gzip_stops_reading() -> None:
    rec = Recorder()
    ins = inspector(rec, "gzip")
    assert ins.feed(b"\x1f\x8b\x08\x00garbage-garbage") is None
    assert "does not decode" in (rec.observation.unread or "")


def test_sse_reader_splits_the_same_however_the_stream_is_chunked() -> None:
    stream = (b"data: a\n\ndata: b\r\n\r\nevent: x\ndata: c\ndata: d\r\rdata: e\n\n: comment\n\n"
              b"data: f\n\ndata: {\"g\": 1}\r\n\r\n")
    whole = list(SseReader().events(stream))
    assert whole == [("message", "a"), ("message", "b"), ("x", "c\nd"), ("message", "e"), ("message", "f"),
                     ("message", '{"g": 1}')]
    rng = random.Random(7)
    for _ in range(500):
        cuts = sorted(rng.sample(range(1, len(stream)), rng.randint(1, 12)))
        reader, got = SseReader(), []
        for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True):
            got += reader.events(stream[a:b])
        assert got == whole


def test_sse_reader_searches_each_byte_a_bounded_number_of_times() -> None:
    """An event that never ends, fed in small pieces, is not rescanned from its start each time."""

    class Counting(bytearray):
        scanned = 0

        def find(self, sub: bytes, start: int = 0, *args: int) -> int:  # type: ignore[override]
            Counting.scanned += len(self) - start
            return super().find(sub, start, *args)

    reader = SseReader()
    reader._buf = Counting()  # the reader's own buffer, counted
    for _ in range(2000):
        list(reader.events(b"z" * 100))
    assert Counting.scanned < 3 * 3 * 200_000  # three separators, each byte about once (quadratic: ~6e8)


def test_kept_output_stops_growing_once_full() -> None:
    """A long stream of small deltas: the kept text is bounded and so is the work per delta (the
    list never grows past the bound, so nothing is re-summed per event)."""
    from ragtoll.proxy.model import OUTPUT_TEXT_KEEP

    obs = Observation()
    for _ in range(200_000):
        obs.keep_output("w ")
    assert sum(map(len, obs.output_text)) == OUTPUT_TEXT_KEEP == obs.output_kept
    assert len(obs.output_text) <= OUTPUT_TEXT_KEEP // 2
