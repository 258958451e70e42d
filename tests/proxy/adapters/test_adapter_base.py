"""The adapters' shared readers: JSON in every encoding a standard JSON server reads, and SSE
streams that open with a byte order mark."""

from __future__ import annotations

import json

import orjson
import pytest
from ragtoll.proxy.adapters.base import SseReader, json_body, loads

DOC = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Grüße, 世界 🙂"}]}


@pytest.mark.parametrize("encoding", ["utf-8", "utf-8-sig", "utf-16", "utf-16-le", "utf-16-be",
                                      "utf-32", "utf-32-le", "utf-32-be"])
def test_json_in_every_encoding_python_reads_is_read(encoding: str) -> None:
    raw = json.dumps(DOC, ensure_ascii=False).encode(encoding)
    assert json.loads(raw) == DOC  # what a Python JSON server reads
    assert loads(raw) == DOC
    assert json_body(raw) == (DOC, None)


@pytest.mark.parametrize("raw", [b"\xef\xbb\xbf", b"{\"a\": \xe9}", "{\"a\": 1".encode("utf-16-le"),
                                 b"\xff\xfe{\x00\x00\xd8"])
def test_what_no_json_server_reads_is_a_decode_error(raw: bytes) -> None:
    with pytest.raises(orjson.JSONDecodeError):
        loads(raw)
    assert json_body(raw)[0] is None


def test_an_sse_stream_drops_one_leading_bom_even_split_across_chunks() -> None:
    reader = SseReader()
    stream = b"\xef\xbb\xbfdata: {\"a\": 1}\n\ndata: \xef\xbb\xbf2\n\n"
    events = [e for chunk in (stream[:1], stream[1:2], stream[2:9], stream[9:]) for e in reader.events(chunk)]
    assert events == [("message", '{"a": 1}'), ("message", "\ufeff2")]  # only the stream's first BOM
