"""Prices: what a call is estimated to cost before forwarding and what it cost after.

The default table (proxy/data/prices.json, dated) holds list prices of widely used public models;
config `pricing:` entries override or extend it by model name or by upstream (route) name, and
the reserved entry `default` is the fallback for anything unpriced (the cost is then `known=False`
and `priced=False`: an estimate, which still prices the upstream's reported usage).
Pure: the table is read once at construction.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
from dataclasses import dataclass, field
from typing import Any

import orjson

from ..config import PriceEntry, Settings, UpstreamConfig
from ..model import Call, Observation

FALLBACK = "default"  # reserved pricing entry name
_TOKEN_OPS = ("chat", "text_completion", "embeddings")
_PROVIDER_PREFIXES = ("openai/", "anthropic/", "azure/", "cohere/")


@dataclass(frozen=True)
class Cost:
    usd: float
    known: bool  # False: the fallback price was used, or the tokens could not be read
    priced: bool = field(default=True, compare=False)  # False: no price for this model / route (fallback)
    measured: bool = field(default=True, compare=False)  # False: the tokens could not be read


@dataclass(frozen=True, slots=True)
class Quote:
    """A call's prices before it is sent: what it costs with no output, and each output token.

    A call's cost is linear in its output, so one quote prices every output allowance."""

    base_usd: float  # prompt tokens at the input price, plus any per-call price
    per_output_usd: float
    known: bool
    priced: bool = True  # False: the fallback price (`pricing.default`) was used

    def usd(self, output_tokens: int) -> float:
        return self.base_usd + output_tokens * self.per_output_usd


def _merge(base: PriceEntry | None, over: PriceEntry) -> PriceEntry:
    if base is None:
        return over
    changes = {f.name: v for f in dataclasses.fields(over) if (v := getattr(over, f.name)) is not None}
    return dataclasses.replace(base, **changes)


def load_default_table() -> tuple[str, dict[str, PriceEntry], PriceEntry]:
    """(date taken, model -> price, fallback) from the shipped table."""
    raw: dict[str, Any] = orjson.loads(
        importlib.resources.files("ragtoll.proxy.data").joinpath("prices.json").read_bytes())
    models = {name.lower(): PriceEntry(**entry) for name, entry in raw["models"].items()}
    return str(raw["taken"]), models, PriceEntry(**raw["default"])


class Prices:
    def __init__(self, models: dict[str, PriceEntry], routes: dict[str, PriceEntry], fallback: PriceEntry,
                 taken: str = "") -> None:
        self.models = models
        self.routes = routes
        self.fallback = fallback
        self.taken = taken
        # longest name first, so "gpt-4o-mini-2024-07-18" finds gpt-4o-mini before gpt-4o
        self._prefixes = sorted(models, key=len, reverse=True)

    @classmethod
    def from_settings(cls, settings: Settings) -> Prices:
        taken, models, fallback = load_default_table()
        routes: dict[str, PriceEntry] = {}
        upstream_names = {u.name for u in settings.upstreams}
        for name, entry in settings.pricing.items():
            if name == FALLBACK:
                fallback = _merge(fallback, entry)
            elif name in upstream_names:
                routes[name] = entry  # a route name shadows a model of the same name, as config says
            else:
                key = name.lower()
                models[key] = _merge(models.get(key), entry)
        return cls(models, routes, fallback, taken)

    def model_price(self, model: str | None) -> PriceEntry | None:
        if not model:
            return None
        m = model.lower()
        for p in _PROVIDER_PREFIXES:
            m = m.removeprefix(p)
        m = m.removeprefix("ft:")
        hit = self.models.get(m)
        if hit is not None:
            return hit
        for name in self._prefixes:
            # dated snapshots and suffixes: gpt-4o-2024-08-06, claude-sonnet-4-5-20250929, gpt-4o:ft-...
            # ("." is not a boundary: gpt-5.2 is a different model from gpt-5, with its own price)
            if m.startswith(name) and m[len(name)] in "-:@":
                return self.models[name]
        return None

    def _price(self, upstream: UpstreamConfig, call: Call) -> tuple[PriceEntry | None, PriceEntry | None]:
        return self.model_price(call.model), self.routes.get(upstream.name)

    def estimate(self, upstream: UpstreamConfig, call: Call, default_max_output_tokens: int) -> Cost:
        """Before forwarding: prompt tokens x input price + allowed output x output price + per call."""
        quote = self.quote(upstream, call)
        return Cost(quote.usd(allowed_output(call, default_max_output_tokens)), quote.known, quote.priced)

    def quote(self, upstream: UpstreamConfig, call: Call) -> Quote:
        """The call's prices before forwarding (prompt tokens as counted; no cached-input discount)."""
        per_call, tok, priced = self._rates(upstream, call)
        if tok is None:
            return Quote(per_call, 0.0, priced, priced)
        base = (call.prompt_tokens or 0) * (tok.input_per_mtok or 0.0) / 1e6
        return Quote(base + per_call, (tok.output_per_mtok or 0.0) / 1e6, priced and call.prompt_tokens is not None,
                     priced)

    def actual(self, upstream: UpstreamConfig, call: Call, obs: Observation) -> Cost:
        """After the response: the upstream's usage; missing pieces from what was counted or reserved."""
        u = obs.usage
        inp = u.input_tokens if u and u.input_tokens is not None else call.prompt_tokens
        cached = u.cached_input_tokens if u and u.cached_input_tokens else 0
        written = u.cache_write_tokens if u and u.cache_write_tokens else 0
        if u and u.output_tokens is not None:
            out: int | None = u.output_tokens
        elif obs.output_tokens_seen:
            out = obs.output_tokens_seen
        elif call.operation in ("chat", "text_completion"):
            out = call.max_output_tokens  # nothing observed: assume the most it was allowed
        else:
            out = 0
        return self._cost(upstream, call, inp, cached, out, written)

    def _cost(self, upstream: UpstreamConfig, call: Call, inp: int | None, cached: int, out: int | None,
              written: int = 0) -> Cost:
        """Input in three parts: uncached at the input price, cache reads at the cached price, cache
        writes at the cache-write price (each falling back to the input price when unpriced)."""
        per_call, tok, priced = self._rates(upstream, call)
        usd, measured = per_call, True
        if tok is not None:
            if inp is None or out is None:
                measured = False  # tokens could not be read: priced with what we have
            inp, out = inp or 0, out or 0
            cached = min(cached, inp)
            written = min(written, inp - cached)
            in_price = tok.input_per_mtok or 0.0
            cached_price = tok.cached_input_per_mtok if tok.cached_input_per_mtok is not None else in_price
            write_price = tok.cache_write_per_mtok if tok.cache_write_per_mtok is not None else in_price
            usd += ((inp - cached - written) * in_price + cached * cached_price + written * write_price
                    + out * (tok.output_per_mtok or 0.0)) / 1e6
        return Cost(usd=usd, known=priced and measured, priced=priced, measured=measured)

    def _rates(self, upstream: UpstreamConfig, call: Call) -> tuple[float, PriceEntry | None, bool]:
        """(per-call price, the entry pricing tokens or None, priced) for this call; priced is False
        when the fallback (`pricing.default`) stood in."""
        model, route = self._price(upstream, call)
        per_call = next((e.per_call for e in (route, model) if e is not None and e.per_call is not None), None)
        tok, known = None, True
        if call.operation in _TOKEN_OPS:
            tok = next((e for e in (model, route) if e is not None and _prices_tokens(e)), None)
            if tok is None and per_call is None:
                tok, known = self.fallback, False
        elif per_call is None:
            per_call, known = self.fallback.per_call, False
        return per_call or 0.0, tok, known


def allowed_output(call: Call, default_max_output_tokens: int) -> int:
    """The output a call may produce: its max_tokens, else the default per choice for completions."""
    if call.max_output_tokens is not None:
        return call.max_output_tokens
    return default_max_output_tokens * max(1, call.choices) if call.operation in ("chat", "text_completion") else 0


def _prices_tokens(e: PriceEntry) -> bool:
    return e.input_per_mtok is not None or e.output_per_mtok is not None
