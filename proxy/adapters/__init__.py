"""The adapter registry: API name (an upstream's `api:` key) -> adapter factory.

A new upstream API is one module plus one line here.
"""

from __future__ import annotations

from .anthropic import AnthropicAdapter
from .base import Adapter, AdapterFactory
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


__all__ = ["ADAPTERS", "Adapter", "AdapterFactory", "field_keys", "names"]
