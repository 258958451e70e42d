"""Drive an adapter with the recorded fixtures in tests/fixtures: parse the request, then feed the
response to its observer whole, or cut at every byte boundary, the way the pipeline does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
from ragtoll.proxy.adapters import ADAPTERS
from ragtoll.proxy.config import UpstreamConfig
from ragtoll.proxy.model import Call, Observation

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def load(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = orjson.loads((FIXTURES / name).read_bytes())
    return doc


def raw(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def adapter(api: str, kind: str = "llm", fields: dict[str, str] | None = None, name: str = "up") -> Any:
    return ADAPTERS[api](UpstreamConfig(name=name, kind=kind, url="http://127.0.0.1:1", api=api, fields=fields or {}))


def parse(ad: Any, path: str, body: Any, method: str = "POST") -> Call:
    payload = body if isinstance(body, bytes) else orjson.dumps(body)
    call: Call = ad.parse_request(method, path, {"content-type": "application/json"}, payload)
    return call


def observe(ad: Any, call: Call, body: bytes, content_type: str = "application/json", *, split: int | None = None,
            status: int = 200, headers: dict[str, str] | None = None) -> Observation:
    """Feed `body` in pieces of `split` bytes (None: one piece), then the end."""
    obs = ad.observer(call, status, {"content-type": content_type, **(headers or {})})
    step = split or max(1, len(body))
    for i in range(0, len(body), step):
        obs.feed(body[i:i + step], False)
    obs.feed(b"", True)
    result: Observation = obs.observation
    return result


def observe_every_split(ad: Any, call: Call, body: bytes, content_type: str) -> list[Observation]:
    """One observation per two-piece cut at every byte offset, plus one-byte pieces."""
    out = []
    for cut in range(1, len(body)):
        obs = ad.observer(call, 200, {"content-type": content_type})
        obs.feed(body[:cut], False)
        obs.feed(body[cut:], False)
        obs.feed(b"", True)
        out.append(obs.observation)
    out.append(observe(ad, call, body, content_type, split=1))
    return out
