"""`passthrough`: forwards anything, reads nothing. The request body streams through unread."""

from __future__ import annotations

from collections.abc import Mapping

from ..model import Call
from .base import NullObserver, UpstreamInfo, no_cap_output, no_empty_result, no_finish, no_stream_end

_OPERATION = {"llm": "chat", "embeddings": "embeddings", "retrieval": "retrieval", "rerank": "rerank"}


class PassthroughAdapter:
    name = "passthrough"
    error_style = "plain"
    reject_status = 429  # clients unknown: the usual status, with x-should-retry: false
    reads_body = False
    credential_headers = ("authorization", "api-key", "x-api-key")  # upstream unknown: the usual ones
    stream_end = staticmethod(no_stream_end)
    finish = staticmethod(no_finish)
    cap_output = staticmethod(no_cap_output)
    empty_result = staticmethod(no_empty_result)

    def __init__(self, upstream: UpstreamInfo) -> None:
        self._operation = _OPERATION.get(upstream.kind, "other")

    def parse_request(self, method: str, path: str, headers: Mapping[str, str], body: bytes) -> Call:
        return Call(operation=self._operation)

    def observer(self, call: Call, status: int, headers: Mapping[str, str]) -> NullObserver:
        return NullObserver()
