"""The adapter protocol: one module per upstream API turns bytes into `Call` and `Observation`.

Adapters are pure: bytes and headers in, values out. No network, no clock, no store. They must
never raise on malformed input: they record `parse_error` and let the bytes through unchanged.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

import orjson

from ..core import tokens
from ..model import Call, Observation

# Non-streamed response bodies are copied for parsing up to this size; larger ones pass unparsed.
MAX_PARSE_BYTES = 8 * 1024 * 1024
UTF8_BOM = b"\xef\xbb\xbf"


def loads(raw: bytes | str) -> Any:
    """JSON in any encoding a standard JSON server reads: UTF-8 with or without a byte order mark,
    UTF-16 and UTF-32, little or big endian, told apart as RFC 4627 section 3 and Python's
    `json.detect_encoding` do. Plain UTF-8 takes orjson's path alone; the others are decoded first.
    Raises orjson.JSONDecodeError (a ValueError) for anything else."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        if isinstance(raw, str):
            raise
        encoding = json.detect_encoding(raw)
        if encoding == "utf-8":
            raise
    try:
        text = raw.decode(encoding)
    except UnicodeDecodeError as exc:
        raise orjson.JSONDecodeError(f"not valid {encoding}: {exc.reason}", "", exc.start) from None
    return orjson.loads(text)


class Observer(Protocol):
    """Reads a response as it passes. `feed` gets each decoded chunk in order, then `end=True` once.

    It never holds bytes back from the client and never raises: a parse failure is recorded in
    `observation.parse_error`.
    """

    observation: Observation

    def feed(self, chunk: bytes, end: bool) -> None: ...


class UpstreamInfo(Protocol):
    """What an adapter knows of its upstream (config.UpstreamConfig has these; adapters never import config)."""

    @property
    def name(self) -> str: ...

    @property
    def kind(self) -> str: ...

    @property
    def api(self) -> str: ...

    @property
    def fields(self) -> Mapping[str, str]: ...


class Adapter(Protocol):
    name: str
    error_style: str  # "openai" | "anthropic" | "plain": the shape of a local error body
    # the status of a budget rejection: one this API's common SDKs do not retry (measured in
    # tests/e2e/test_budget_guards.py); `budgets.reject_status` overrides it for every route
    reject_status: int
    reads_body: bool  # False: the request body streams through unread
    # the request headers (lower case) this API's upstream authenticates a caller by, in the order it
    # prefers them: the first one sent names the caller's principal (core/principals.py), so a header
    # the upstream ignores never gives a caller another one
    credential_headers: tuple[str, ...]

    def parse_request(self, method: str, path: str, headers: Mapping[str, str], body: bytes) -> Call: ...

    def observer(self, call: Call, status: int, headers: Mapping[str, str]) -> Observer: ...

    def stream_end(self, call: Call, observation: Observation, path: str, now_s: int) -> bytes:
        """Bytes that end this API's SSE stream cleanly, as if the model had hit its output token
        limit (a budget cut mid-stream); b"" for an API whose streams ragtoll does not read."""
        ...

    def finish(self, path: str, body: bytes, note: str | None) -> bytes | None:
        """This request rewritten to answer now, tools disabled (a budget's graceful finish,
        `on_exhausted: finish`); None where the API cannot be asked that (not an LLM call)."""
        ...

    def empty_result(self, path: str) -> bytes | None:
        """A well-formed answer with no results for a search or rerank at `path` (a budget's
        `on_exhausted_retrieval: empty`); None where the API has no such answer."""
        ...

    def cap_output(self, path: str, body: bytes, tokens: int) -> bytes | None:
        """This request with its output cap set to `tokens` per answer (the budget's worst-case
        admission: the task has no more left); None where the API has no such cap."""
        ...


class AdapterFactory(Protocol):
    def __call__(self, upstream: UpstreamInfo) -> Adapter: ...


def no_stream_end(call: Call, observation: Observation, path: str, now_s: int) -> bytes:
    """`stream_end` of adapters whose streams ragtoll does not read (nothing is ever cut there)."""
    return b""


def no_finish(path: str, body: bytes, note: str | None) -> bytes | None:
    """`finish` of adapters that do not generate answers (retrieval, rerank, passthrough)."""
    return None


def no_cap_output(path: str, body: bytes, tokens: int) -> bytes | None:
    """`cap_output` of adapters whose calls produce no generated output."""
    return None


def no_empty_result(path: str) -> bytes | None:
    """`empty_result` of adapters whose calls are not searches (LLM, passthrough)."""
    return None


class NullObserver:
    """For responses nobody needs to read (errors, pass-through routes)."""

    def __init__(self) -> None:
        self.observation = Observation()

    def feed(self, chunk: bytes, end: bool) -> None:
        return None


class BufferedJsonObserver:
    """Collects a non-streamed JSON body (up to MAX_PARSE_BYTES) and parses it once at the end."""

    def __init__(self) -> None:
        self.observation = Observation()
        self._parts: list[bytes] = []
        self._size = 0

    def feed(self, chunk: bytes, end: bool) -> None:
        if self._size <= MAX_PARSE_BYTES:
            self._parts.append(chunk)
            self._size += len(chunk)
        if not end:
            return
        if self._size > MAX_PARSE_BYTES:
            self.observation.parse_error = f"response larger than {MAX_PARSE_BYTES} bytes; not parsed"
            return
        try:
            doc = loads(b"".join(self._parts))
        except orjson.JSONDecodeError as exc:
            self.observation.parse_error = f"response is not JSON: {exc}"
            return
        finally:
            self._parts = []
        try:
            self.read(doc)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
            self.observation.parse_error = f"unexpected response shape: {exc!r}"

    def read(self, doc: object) -> None:
        """Fill `self.observation` from the parsed body. Subclasses override."""


class SseReader:
    """Splits a byte stream into Server-Sent Events across arbitrary chunk boundaries.

    Yields (event, data) for each complete event; `data` joins multi-line data fields with "\\n".
    Time is linear in the bytes fed: each byte is searched once per separator kind, however the
    stream is chunked (an event that never ends is kept, not rescanned; the pipeline's Inspector
    bounds how long one may grow).
    """

    _SEPARATORS = (b"\n\n", b"\r\n\r\n", b"\r\r")

    def __init__(self) -> None:
        self._buf = bytearray()
        # Per separator, where to search next: no separator of that kind starts before it.
        self._from = [0, 0, 0]
        self._bom_checked = False

    def events(self, chunk: bytes) -> Iterator[tuple[str, str]]:
        buf = self._buf
        buf += chunk
        if not self._bom_checked and (len(buf) >= len(UTF8_BOM) or not UTF8_BOM.startswith(bytes(buf))):
            self._bom_checked = True  # the SSE standard drops one leading UTF-8 BOM
            if buf.startswith(UTF8_BOM):
                del buf[:len(UTF8_BOM)]
        start = 0
        while True:
            cut, width = -1, 0
            for k, sep in enumerate(self._SEPARATORS):
                i = buf.find(sep, max(self._from[k], start))
                if i < 0:  # none up to the end: next time, search only what arrives (and a straddling start)
                    self._from[k] = max(start, len(buf) - len(sep) + 1)
                elif cut < 0 or i < cut:
                    cut, width = i, len(sep)
            if cut < 0:
                break
            raw = bytes(buf[start:cut])
            start = cut + width
            event, data = "message", []
            for line in raw.decode("utf-8", "replace").splitlines():
                if line.startswith("data:"):
                    data.append(line[5:].removeprefix(" "))
                elif line.startswith("event:"):
                    event = line[6:].strip()
            if data:
                yield event, "\n".join(data)
        if start:  # one compaction per chunk, not one per event
            del buf[:start]
            self._from = [max(0, f - start) for f in self._from]


def json_body(body: bytes) -> tuple[dict[str, object] | None, str | None]:
    """(document, None) for a JSON object body, else (None, why it could not be read)."""
    if not body:
        return None, "empty body"
    try:
        doc = loads(body)
    except orjson.JSONDecodeError as exc:
        return None, f"request is not JSON: {exc}"
    if not isinstance(doc, dict):
        return None, "request JSON is not an object"
    return doc, None


class JsonStreamObserver:
    """Reads an SSE stream of JSON events as they pass; subclasses implement `on_event`.

    Counts streamed output text into `observation.output_tokens_seen` (via `saw_output`) with the
    call's model encoding, so a budget stage can cut the stream when a limit is reached.
    """

    def __init__(self, encoding: str) -> None:
        self.observation = Observation()
        self._sse = SseReader()
        self._encoding = encoding

    def feed(self, chunk: bytes, end: bool) -> None:
        obs = self.observation
        for event, data in self._sse.events(chunk):
            if data == "[DONE]":
                continue
            try:
                doc = orjson.loads(data)
            except orjson.JSONDecodeError as exc:
                obs.parse_error = f"unreadable stream event: {exc}"
                continue
            if not isinstance(doc, dict):
                continue
            try:
                self.on_event(event, doc)
            except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
                obs.parse_error = f"unexpected stream event shape: {exc!r}"
        if end:
            self.on_end()

    def saw_output(self, text: object) -> None:
        if isinstance(text, str) and text:
            self.observation.output_tokens_seen += tokens.count(text, self._encoding)
            self.observation.keep_output(text)

    def saw_unknown(self, value: object, skip: frozenset[str] = frozenset(), depth: int = 0) -> None:
        """Output in a shape this adapter does not know: every string in it (but the keys in
        `skip`) counted as output tokens, never ignored (an over-count at worst)."""
        if isinstance(value, str):
            if value:
                self.observation.output_tokens_seen += tokens.count(value, self._encoding)
        elif depth < 8 and isinstance(value, dict):
            for key, item in value.items():
                if key not in skip:
                    self.saw_unknown(item, skip, depth + 1)
        elif depth < 8 and isinstance(value, list):
            for item in value:
                self.saw_unknown(item, skip, depth + 1)

    def on_event(self, event: str, doc: dict[str, object]) -> None:
        """One parsed event. Subclasses override."""

    def on_end(self) -> None:
        """The stream ended. Subclasses may override."""


def safe_parse(call: Call, read: Callable[[dict[str, object], Call], None], doc: dict[str, object]) -> Call:
    """Run an adapter's body reader; a shape it did not expect becomes `call.parse_error`."""
    try:
        read(doc, call)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, RecursionError, struct.error) as exc:
        call.parse_error = f"unexpected request shape: {exc!r}"
    return call
