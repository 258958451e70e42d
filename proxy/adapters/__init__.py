"""The adapter registry: API name (an upstream's `api:` key) -> adapter factory.

A new upstream API is one module plus one line here.
"""

from __future__ import annotations

from .base import Adapter, AdapterFactory
from .openai import OpenAIAdapter
from .passthrough import PassthroughAdapter

ADAPTERS: dict[str, AdapterFactory] = {
    "openai": OpenAIAdapter,
    "passthrough": PassthroughAdapter,
}

__all__ = ["ADAPTERS", "Adapter", "AdapterFactory"]
