"""The adapter registry: API name (an upstream's `api:` key) -> adapter factory.

A new upstream API is one module plus one line here. The registry checks the `api:` and `fields:`
keys of configured upstreams (`check`); config itself knows no adapter.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import ConfigError
from .anthropic import AnthropicAdapter
from .base import Adapter, AdapterFactory, UpstreamInfo
from .openai import OpenAIAdapter
from .passthrough import PassthroughAdapter
from .rerank import CohereRerankAdapter, TeiRerankAdapter
from .retrieval_json import JsonRetrievalAdapter
from .retrieval_presets import ChromaAdapter, ElasticsearchAdapter, LangServeAdapter, QdrantAdapter

ADAPTERS: dict[str, AdapterFactory] = {
    "openai": OpenAIAdapter,
    "anthropic": AnthropicAdapter,
    "cohere": CohereRerankAdapter,
    "tei": TeiRerankAdapter,
    "json": JsonRetrievalAdapter,
    "qdrant": QdrantAdapter,
    "chroma": ChromaAdapter,
    "elasticsearch": ElasticsearchAdapter,
    "opensearch": ElasticsearchAdapter,
    "langserve": LangServeAdapter,
    "passthrough": PassthroughAdapter,
}



def names() -> list[str]:
    """The `api:` names an upstream may use."""
    return sorted(ADAPTERS)


def field_keys(api: str) -> frozenset[str] | None:
    """The `fields:` keys the adapter reads (field-path driven adapters), or None when it reads none."""
    keys = getattr(ADAPTERS[api], "field_keys", None)
    return frozenset(keys) if keys is not None else None


def check(upstreams: Sequence[UpstreamInfo]) -> None:
    """Each upstream names a registered adapter, and only `fields:` keys its adapter reads; else
    ConfigError naming the key (`upstreams[i].api`, `upstreams[i].fields.<key>`) and what is valid."""
    for i, up in enumerate(upstreams):
        where = f"upstreams[{i}]"
        if up.api not in ADAPTERS:
            raise ConfigError(f"Config '{where}.api' has value {up.api!r}. Expected one of the adapters: "
                              f"{', '.join(names())}.", key=f"{where}.api")
        keys = field_keys(up.api)  # adapters driven by `fields:` paths say which they read
        unknown = sorted(set(up.fields) - keys) if keys is not None else []
        if keys is not None and unknown:
            key = unknown[0]
            raise ConfigError(f"Config '{where}.fields.{key}' has value {up.fields[key]!r}. Expected a field of "
                              f"{up.api}: one of {', '.join(sorted(keys))}.", key=f"{where}.fields.{key}")


__all__ = ["ADAPTERS", "Adapter", "AdapterFactory", "check", "field_keys", "names"]
