"""Maps a request path to one configured upstream, or refuses it.

Only configured upstreams are reachable: the target is always `upstream.url + rest`, where `rest`
is what follows the matched prefix. Dot segments (plain or percent-encoded) and encoded
prefixes are refused, so no path walks from one prefix into another or into /admin.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import unquote

from .. import adapters
from ..adapters import ADAPTERS, Adapter
from ..config import UpstreamConfig
from ..errors import NotFound, Rejected


@dataclass(frozen=True, slots=True)
class Route:
    upstream: UpstreamConfig
    adapter: Adapter
    prefix: str


class Router:
    def __init__(self, upstreams: Sequence[UpstreamConfig]) -> None:
        """Raises ConfigError for an upstream whose `api:` or `fields:` its adapter does not know."""
        adapters.check(upstreams)
        routes = [Route(up, ADAPTERS[up.api](up), up.route_prefix) for up in upstreams]
        self.routes = sorted(routes, key=lambda r: len(r.prefix), reverse=True)
        self.prefixes = sorted(r.prefix for r in routes)

    def match(self, path: str) -> Route | None:
        """The route whose prefix owns `path` (decoded), or None."""
        for route in self.routes:
            p = route.prefix
            if path == p or (path.startswith(p) and path[len(p)] == "/"):
                return route
        return None

    def target(self, route: Route, raw_path: bytes, query: bytes) -> str:
        """The path + query to append to the upstream URL, taken from the raw request bytes.

        Raises `Rejected` (400) for dot segments or a prefix spelled with escapes.
        """
        raw = raw_path.decode("latin-1")
        # Decode repeatedly so %252e%252e is caught as well as %2e%2e and '..'.
        decoded = raw
        for _ in range(3):
            decoded = unquote(decoded)
        if any(seg in (".", "..") for seg in decoded.replace("\\", "/").split("/")):
            raise Rejected("path contains dot segments", status=400, code="path_not_allowed")
        if not raw.startswith(route.prefix):
            raise Rejected("route prefix must be spelled without escapes", status=400, code="path_not_allowed")
        rest = raw[len(route.prefix):]
        if rest and not rest.startswith("/"):
            raise Rejected("path does not continue the route prefix", status=400, code="path_not_allowed")
        return rest + ("?" + query.decode("latin-1") if query else "")

    def not_found(self, path: str) -> NotFound:
        return NotFound(
            f"no upstream is configured for {path[:200]!r}; configured prefixes: {', '.join(self.prefixes)}",
            prefixes=self.prefixes,
        )
