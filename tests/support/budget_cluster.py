"""A real Redis Cluster for the budget tests (contract, e2e concurrency).

support.redis_server.start_cluster picks ports above 55535, which cluster mode refuses (its bus
port is port + 10000), and reads CLUSTER NODES as text where redis-py 8 returns a dict; this
starter avoids both.
"""

from __future__ import annotations

import random
import socket
import time
import uuid
from typing import Any

import redis
from ragtoll.proxy.stores.redis import task_keys
from redis.crc import key_slot

from .redis_server import RedisProcess, start_redis, stop_all


def cluster_free_port() -> int:
    """A free port whose cluster bus port (+10000) is free too: redis refuses ports above 55535."""
    for _ in range(200):
        port = random.randint(20_000, 45_000)
        try:
            for p in (port, port + 10_000):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port pair for a cluster node")


def start_budget_cluster(masters: int = 3, extra: list[str] | None = None) -> list[RedisProcess]:
    """A real Redis Cluster of `masters` nodes on loopback, joined with CLUSTER ADDSLOTS / MEET.
    Master `i` owns slots `slot_range(i, masters)`; `extra` is passed to every redis-server."""
    nodes: list[RedisProcess] = []
    try:
        for _ in range(masters):
            args = ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                    "--cluster-node-timeout", "2000"]
            nodes.append(start_redis([*args, *(extra or [])], port=cluster_free_port()))
        clients = [redis.Redis(port=n.port) for n in nodes]
        for i, c in enumerate(clients):
            c.execute_command("CLUSTER ADDSLOTS", *slot_range(i, masters))
        for c in clients[1:]:
            c.execute_command("CLUSTER MEET", "127.0.0.1", nodes[0].port)
        deadline = time.monotonic() + 30
        while True:
            infos = [_info(c.execute_command("CLUSTER INFO")) for c in clients]
            if all(i.get("cluster_state") == "ok" and i.get("cluster_known_nodes") == str(masters) for i in infos):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"cluster did not form: {infos[0]}")
            time.sleep(0.1)
        for c in clients:
            c.close()
        return nodes
    except BaseException:
        stop_all(nodes)
        raise


def slot_range(i: int, masters: int) -> range:
    """The hash slots master `i` of `masters` is given."""
    per = 16384 // masters
    return range(i * per, 16384 if i == masters - 1 else (i + 1) * per)


def master_of(task_id: str, masters: int = 3) -> int:
    """The master (index, slots as `slot_range`) that holds a task's budget keys: the slot of the
    hash tag the Redis store's scripts use."""
    slot = key_slot(task_keys(task_id)[0].encode())
    return next(i for i in range(masters) if slot in slot_range(i, masters))


def tasks_on_masters(per_master: int, masters: int = 3, prefix: str = "t") -> dict[int, list[str]]:
    """`per_master` new task ids for each master index."""
    out: dict[int, list[str]] = {i: [] for i in range(masters)}
    while any(len(ts) < per_master for ts in out.values()):
        t = f"{prefix}-{uuid.uuid4().hex[:12]}"
        ts = out[master_of(t, masters)]
        if len(ts) < per_master:
            ts.append(t)
    return out


def _info(raw: Any) -> dict[str, str]:
    """CLUSTER INFO as a dict, whether redis-py parsed it or not."""
    if isinstance(raw, dict):
        return {str(k): str(v) for k, v in raw.items()}
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
