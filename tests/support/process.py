"""`ragtoll serve` as a child process (the real front door), with its resource use readable from /proc."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Self

import httpx

from .poll import wait_until
from .servers import free_port


class RagtollProcess:
    """`with RagtollProcess(tmp, config) as rt:` runs `ragtoll serve --config` on a free port until exit.

    Started again after `kill()` or `stop()`, it serves on the same port with the same config (a
    restart). `ready`: a path that must answer 200 before `start` returns (default: the port
    accepts connections). The server's stderr goes to `log` (read back when it fails to start).
    """

    def __init__(self, tmp: Path, config: dict[str, Any], env: dict[str, str] | None = None,
                 ready: str | None = None) -> None:
        self.port = free_port()
        server = {**config.get("server", {}), "host": "127.0.0.1", "port": self.port}
        self.config_path = tmp / f"ragtoll-{self.port}.yaml"
        self.config_path.write_text(json.dumps({**config, "server": server}))
        self.log = tmp / f"ragtoll-{self.port}.log"
        self.env = {**os.environ, "OTEL_SDK_DISABLED": "true", **(env or {})}
        self.ready = ready
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30) -> Self:
        return self.launch().wait_ready(timeout)

    def launch(self) -> Self:
        """Start the process and return at once (several start side by side; then `wait_ready`)."""
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "ragtoll.proxy", "serve", "--config",
                                          str(self.config_path)], env=self.env, stdout=subprocess.DEVNULL, stderr=log)
        return self

    def wait_ready(self, timeout: float = 30) -> Self:
        if not wait_until(self._answers, timeout, interval=0.05):
            self.stop()
            raise RuntimeError(f"ragtoll at {self.base} did not start: {self.log.read_text()[-4000:]}")
        return self

    def _answers(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"ragtoll exited {self.proc.returncode}: {self.log.read_text()[-4000:]}")
        try:
            if self.ready is None:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return True
            return httpx.get(self.base + self.ready, timeout=1).status_code == 200
        except (OSError, httpx.HTTPError):
            return False

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()

    def status(self, field: str) -> int:
        """A /proc/<pid>/status field in kB (VmRSS, VmHWM: the peak RSS)."""
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
        raise KeyError(field)

    def cpu_seconds(self) -> float:
        """User + system CPU time the process has used so far."""
        assert self.proc is not None
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def replicas(procs: list[RagtollProcess], ready_s: float = 60) -> Iterator[list[str]]:
    """Start `procs` side by side, wait until each answers its readiness path, yield their base
    URLs; stop them all afterwards."""
    try:
        for proc in procs:
            proc.launch()
        for proc in procs:
            proc.wait_ready(ready_s)
        yield [proc.base for proc in procs]
    finally:
        for proc in procs:
            proc.stop()
