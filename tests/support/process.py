"""`ragtoll serve` as a child process (the real front door), with its resource use readable from /proc."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Self

from .servers import free_port


class RagtollProcess:
    """`with RagtollProcess(tmp, config) as rt:` runs `ragtoll serve --config` on a free port until exit."""

    def __init__(self, tmp: Path, config: dict[str, Any], env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        server = {**config.get("server", {}), "host": "127.0.0.1", "port": self.port}
        self.config_path = tmp / f"ragtoll-{self.port}.yaml"
        self.config_path.write_text(json.dumps({**config, "server": server}))
        self.env = {**os.environ, "OTEL_SDK_DISABLED": "true", **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Self:
        self.proc = subprocess.Popen([sys.executable, "-m", "ragtoll.proxy", "serve", "--config", str(self.config_path)],
                                     env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return self
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    err = self.proc.stderr.read().decode() if self.proc.poll() is not None and self.proc.stderr else ""
                    raise RuntimeError(f"ragtoll did not start: {err}") from None
                time.sleep(0.05)

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
        if self.proc is not None and self.proc.stderr is not None:
            self.proc.stderr.close()

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
