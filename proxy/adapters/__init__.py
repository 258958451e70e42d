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

__all__ = ["ADAPTERS", "Adapter", "AdapterFactory"]
