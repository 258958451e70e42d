"""`passthrough`: forwards anything, reads nothing. The request body streams through unread."""

from __future__ import annotations

from collections.abc import Mapping

from ..config import UpstreamConfig
from ..model import Call
from .base import NullObserver

_OPERATION = {"llm": "chat", "embeddings": "embeddings", "retrieval": "retrieval", "rerank": "rerank"}


class PassthroughAdapter:
    name = "passthrough"
    error_style = "plain"
    reads_body = False

    def __init__(self, upstream: UpstreamConfig) -> None:
        self._operation = _OPERATION.get(upstream.kind, "other")

    def parse_request(self, method: str, path: str, headers: Mapping[str, str], body: bytes) -> Call:
        return Call(operation=self._operation)

    def observer(self, call: Call, status: int, headers: Mapping[str, str]) -> NullObserver:
        return NullObserver()
