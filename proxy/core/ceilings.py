"""Output ceilings: the most output tokens a model accepts as its cap. Pure: the table is read once.

Worst-case admission (core/budget.granted_output) needs the most a call can produce: its own cap,
else its model's ceiling. The shipped table (proxy/data/output_ceilings.json) covers the priced
models; `budgets.output_ceilings` adds or overrides entries by model name. Names match as prices
do: exact, else the longest entry followed by `-`, `:` or `@` (dated snapshots, fine-tunes).
"""

from __future__ import annotations

import importlib.resources
from collections.abc import Mapping

import orjson

_PROVIDER_PREFIXES = ("openai/", "anthropic/", "azure/")


def load_table() -> dict[str, int]:
    raw = orjson.loads(importlib.resources.files("ragtoll.proxy.data").joinpath("output_ceilings.json").read_bytes())
    return {name.lower(): int(v) for name, v in raw["models"].items()}


class OutputCeilings:
    def __init__(self, configured: Mapping[str, int] | None = None) -> None:
        self.models = load_table()
        self.models.update({k.lower(): int(v) for k, v in (configured or {}).items()})
        self._prefixes = sorted(self.models, key=len, reverse=True)
        self._seen: dict[str, int | None] = {}  # model name as sent -> ceiling (a bounded memo)

    def of(self, model: str | None) -> int | None:
        """The model's output ceiling in tokens, or None when it is not known."""
        if not model:
            return None
        hit = self._seen.get(model, -1)
        if hit != -1:
            return hit
        found = self._lookup(model)
        if len(self._seen) < 4096:
            self._seen[model] = found
        return found

    def _lookup(self, model: str) -> int | None:
        m = model.lower()
        for p in _PROVIDER_PREFIXES:
            m = m.removeprefix(p)
        m = m.removeprefix("ft:")
        if m in self.models:
            return self.models[m]
        for name in self._prefixes:
            if m.startswith(name) and len(m) > len(name) and m[len(name)] in "-:@":
                return self.models[name]
        return None
