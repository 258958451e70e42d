"""The front door's per-address share of connections, kept at the socket.

granian (hyper) bounds the connections it serves at once (`backpressure`, `server.max_connections`)
and closes one whose request head has not arrived within `server.header_timeout_s`, but it has no
per-client bound and no accept hook: one address holding `max_connections` silent sockets, reopened
as they close, leaves every other client waiting in the listen backlog for a free slot (issue 30:
a legitimate /healthz answered 2 times of 8 over 25 s).

So the gate works on the sockets themselves, through public OS interfaces only. Every
`SWEEP_INTERVAL_S` a worker thread (never the event loop) lists the process's own descriptors; when
there are more than an address may hold, it finds the connections accepted on ragtoll's port (on a
`dup` of each descriptor: `getsockname`, `getpeername`), and for each address holding more than
`server.max_connections_per_address` it shuts down (`shutdown(2)` on the dup, which reaches the same
socket) those not in a request, the surplus only. hyper then reads the end of the stream, closes
the connection and frees its slot, which the next connection in the backlog takes.

A request in flight is never cut: connections in a request are bounded by the body and upstream
timeouts instead. The ASGI wrapper from `watch` marks which peers are in a request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import AsyncIterator
from typing import Any

log = logging.getLogger("ragtoll.gate")
SWEEP_INTERVAL_S = 0.25  # how long an address may hold more than its share of idle connections
_FD_DIR = "/proc/self/fd"


class ConnectionGate:
    """Keeps each client address to `per_address` connections that are not in a request."""

    def __init__(self, port: int, per_address: int) -> None:
        self.port = port
        self.per_address = per_address
        self.closed = 0  # connections shut down so far (for logs and tests)
        self._busy: dict[tuple[str, int], int] = {}  # peer -> requests in flight on it

    def watch(self, app: Any) -> Any:
        """`app` wrapped so the gate knows which peers are in a request (never cut)."""

        async def gated(scope: dict[str, Any], receive: Any, send: Any) -> None:
            client = scope.get("client") if scope.get("type") == "http" else None
            if not client:
                await app(scope, receive, send)
                return
            peer = (str(client[0]), int(client[1]))
            self._busy[peer] = self._busy.get(peer, 0) + 1
            try:
                await app(scope, receive, send)
            finally:
                if (left := self._busy[peer] - 1) > 0:
                    self._busy[peer] = left
                else:
                    del self._busy[peer]

        return gated

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Sweep in the background while the server runs."""
        task = asyncio.create_task(self._run(), name="ragtoll-connection-gate")
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_INTERVAL_S)
            try:
                closed = await asyncio.to_thread(self.sweep)
            except OSError as exc:  # /proc unreadable: say so once a sweep, keep serving
                log.warning("connection gate could not sweep: %s", exc)
                continue
            if closed:
                log.warning(
                    "connection gate closed %d idle connections past server.max_connections_per_address (%d)",
                    closed,
                    self.per_address,
                )

    def sweep(self) -> int:
        """Shut down each address's idle connections past its share; returns how many (thread-safe)."""
        names = os.listdir(_FD_DIR)
        if len(names) <= self.per_address:  # no address can be past its share: nothing to look at
            return 0
        busy = self._busy.copy()  # one C-level copy: safe while the loop thread changes it
        by_address: dict[str, list[socket.socket]] = {}
        try:
            for name in names:
                sock = self._accepted(name, busy)
                if sock is not None:
                    by_address.setdefault(sock.getpeername()[0], []).append(sock)
            closed = 0
            for idle in by_address.values():
                for sock in idle[self.per_address :]:
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)
                        closed += 1
            self.closed += closed
            return closed
        finally:
            for idle in by_address.values():
                for sock in idle:
                    sock.close()  # the dup only; granian's descriptor stays its own

    def _accepted(self, name: str, busy: dict[tuple[str, int], int]) -> socket.socket | None:
        """A dup of descriptor `name` if it is a connection accepted on our port and not in a request."""
        try:
            if not os.readlink(f"{_FD_DIR}/{name}").startswith("socket:"):
                return None
            fd = os.dup(int(name))
        except (OSError, ValueError):  # closed meanwhile, or not a number
            return None
        try:
            sock = socket.socket(fileno=fd)
        except OSError:  # reused by a non-socket between readlink and dup
            os.close(fd)
            return None
        try:
            if sock.type == socket.SOCK_STREAM and sock.family in (socket.AF_INET, socket.AF_INET6):
                local, peer = sock.getsockname(), sock.getpeername()  # a listener has no peer: OSError
                if local[1] == self.port and (str(peer[0]), int(peer[1])) not in busy:
                    return sock
        except OSError:
            pass
        sock.close()
        return None


def share_of(max_connections: int, per_address: int | None) -> int:
    """The idle connections one address may hold: set, or a quarter of `max_connections`."""
    return per_address if per_address is not None else max(1, max_connections // 4)
