"""The shipped model of P(a semantic candidate's evidence is wrong), read from proxy/data/cache_verifier.json.

Fitted offline by bench/fit_verifier.py on the tuning domains of bench/data/cache_eval.json only; the
file says which. None when the file is missing: the semantic tier then serves on the vetoes alone.
"""

from __future__ import annotations

import functools
import importlib.resources
import json
from typing import Any

from ..core.verify import PAIR_FEATURES, Calibration

FILE = "cache_verifier.json"


@functools.lru_cache(maxsize=1)
def shipped() -> Calibration | None:
    try:
        raw = importlib.resources.files("ragtoll.proxy.data").joinpath(FILE).read_bytes()
    except FileNotFoundError:
        return None
    return from_json(json.loads(raw))


def from_json(doc: dict[str, Any]) -> Calibration:
    names = tuple(doc["features"])
    if names != PAIR_FEATURES:
        raise ValueError(f"{FILE} was fitted on features {names}, this version computes {PAIR_FEATURES}")
    return Calibration(names, tuple(map(float, doc["mean"])), tuple(map(float, doc["scale"])),
                       tuple(map(float, doc["coef"])), float(doc["intercept"]))


@functools.lru_cache(maxsize=1)
def fitted_default() -> tuple[float | None, float | None]:
    """(max_error, similarity floor) the fit chose on its tuning domains, if the file says."""
    try:
        doc = json.loads(importlib.resources.files("ragtoll.proxy.data").joinpath(FILE).read_bytes())
    except FileNotFoundError:
        return None, None
    return doc.get("max_error"), doc.get("similarity_floor")
