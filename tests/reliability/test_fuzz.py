"""Property-based tests over the code that reads caller- and operator-controlled text: trace context
and baggage parsing, task identification, the budget headers and limits, signed baggage, and the
config loader. Every input gets a defined outcome; no other exception escapes.
(The adapters' parsers have their own fuzz test: tests/proxy/adapters/test_adapter_fuzz.py.)
"""

from __future__ import annotations

import base64
import dataclasses
import json
import math
import re
import typing
from typing import Any

import http_sfv
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ragtoll.proxy import config
from ragtoll.proxy.config import DIMENSIONS, IdentityConfig, Profile, TasksConfig
from ragtoll.proxy.core import budget as bm
from ragtoll.proxy.core.signing import sign_budget, verify_budget_baggage
from ragtoll.proxy.errors import ConfigError, TaskRequired
from ragtoll.proxy.request.caller import CallerResolver
from ragtoll.proxy.request.identify import (
    BAGGAGE_TASK_KEY,
    MAX_BAGGAGE_MEMBERS,
    Identifier,
    parse_baggage,
    parse_traceparent,
)

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
HEADER_TEXT = st.text(st.characters(codec="latin-1"), max_size=300)
HEX = st.text("0123456789abcdefABCDEF", min_size=0, max_size=34)
TASK_ID = re.compile(r"^[A-Za-z0-9._:~@/+=-]{1,128}$")

# traceparent: random text, and near-valid shapes that exercise each field's edge
TRACEPARENT = st.one_of(
    HEADER_TEXT,
    st.builds(lambda v, t, s, f, rest: f"{v}-{t}-{s}-{f}{rest}", HEX, HEX, HEX, HEX,
              st.sampled_from(["", "-", "-x", "-" + "a" * 600, " ", "\r\n"])),
)
MEMBER_KEY = st.one_of(st.sampled_from([BAGGAGE_TASK_KEY, "ragtoll.budget.profile", "ragtoll.budget.max_steps",
                                        "ragtoll.budget.max_cost_usd", "ragtoll.budget.sig", "ragtoll.budget.exp",
                                        "k", ""]), HEADER_TEXT)
MEMBER_VALUE = st.one_of(st.sampled_from(["1", "0.5", "-1", "1e9", "nan", "inf", "%0D%0A", "%zz", "%", "a;prop=1",
                                          "9" * 40, ""]), HEADER_TEXT)
BAGGAGE = st.one_of(
    HEADER_TEXT,
    st.lists(st.tuples(MEMBER_KEY, MEMBER_VALUE), max_size=8).map(lambda ms: ",".join(f"{k}={v}" for k, v in ms)),
    st.integers(MAX_BAGGAGE_MEMBERS - 2, MAX_BAGGAGE_MEMBERS + 2).map(lambda n: ",".join(["a=b"] * n)),
)


@FAST
@given(TRACEPARENT)
def test_traceparent_is_parsed_or_ignored(value: str) -> None:
    parsed = parse_traceparent(value)
    if parsed is not None:
        trace_id, span_id, flags = parsed
        assert 0 < trace_id < 2**128 and 0 < span_id < 2**64 and 0 <= flags < 256


@FAST
@given(BAGGAGE)
def test_baggage_is_parsed_or_ignored_with_notes(value: str) -> None:
    members, notes = parse_baggage(value)
    keys = [k for k, _ in members]
    assert len(keys) == len(set(keys))  # a duplicated key is dropped, never resolved by position
    assert all(isinstance(n, str) for n in notes)


@FAST
@given(headers=st.dictionaries(st.sampled_from(["traceparent", "baggage", "x-ragtoll-task-id", "user-agent",
                                                 "authorization"]), st.one_of(HEADER_TEXT, TRACEPARENT, BAGGAGE)),
       duplicated=st.frozensets(st.sampled_from(["traceparent", "baggage", "x-ragtoll-task-id"])),
       policy=st.sampled_from(["session", "per-call", "reject"]))
@pytest.mark.slow
def test_identify_always_names_a_safe_task_or_asks_for_one(headers: dict[str, str], duplicated: frozenset[str],
                                                           policy: str) -> None:
    ident = Identifier(TasksConfig(untracked=policy))  # type: ignore[arg-type]
    try:
        task = ident.identify(headers, "127.0.0.1", duplicated)
    except TaskRequired:
        assert policy == "reject"
        return
    # the id is echoed into a response header and keys the store: a bounded, header-safe alphabet
    assert TASK_ID.match(task.id), task.id
    assert 0 < task.trace_id < 2**128


# Cost limits up to $1M: from about $1e9 the `micros` parameter passes RFC 8941's 15 integer digits
# (found by this test; reported, see docs/guarantees.md "Known limits").
LIMITS = st.builds(lambda counts, cost: {**counts, **({} if cost is None else {"max_cost_usd": cost})},
                   st.dictionaries(st.sampled_from([d for d in DIMENSIONS if d != "max_cost_usd"]),
                                   st.integers(0, 10**15)),
                   st.none() | st.floats(0, 1e6))
COUNTS = st.dictionaries(st.sampled_from(sorted({c for c in bm.COUNTER.values() if c} | {"stalled", "inflight"})),
                         st.integers(-10, 10**15), max_size=8)


@FAST
@given(limits=LIMITS, counters=COUNTS,
       started=st.integers(0, 2**42), now=st.integers(0, 2**42), fraction=st.floats(0.01, 1))
def test_remaining_header_is_valid_rfc8941_and_never_negative(limits: dict[str, float], counters: dict[str, int],
                                                              started: int, now: int, fraction: float) -> None:
    units = bm.to_units(limits)
    ledger = bm.Ledger("t", started_ms=started, counters=counters)
    left = bm.remaining(units, ledger, None, now)
    assert set(left) == set(units) and all(v >= 0 for v in left.values())
    header = bm.sf_dictionary(left)
    assert b"\r" not in header and b"\n" not in header
    if left:
        parsed = http_sfv.Dictionary()
        parsed.parse(header)  # raises on anything RFC 8941 clients could not read
        assert set(parsed.keys()) == set(left)
    warn = bm.standing(units, ledger, None, now, fraction)[1]
    assert all(v >= fraction for v in warn.values())


@FAST
@given(profile=st.builds(Profile, **{d: st.none() | st.integers(0, 10**9) for d in DIMENSIONS if d != "max_cost_usd"},
                         max_cost_usd=st.none() | st.floats(0, 100)),
       members=st.dictionaries(MEMBER_KEY, MEMBER_VALUE, max_size=6))
@pytest.mark.slow
def test_plain_baggage_can_only_lower_limits(profile: Profile, members: dict[str, str]) -> None:
    limits, _notes = bm.effective_limits(profile, members)
    base = profile.limits()
    for dim, value in limits.items():
        assert math.isfinite(value) and value >= 0
        if dim in base:
            assert value <= base[dim]
    bm.to_units(limits)  # what the hot path does next must not fail


@FAST
@given(members=st.dictionaries(MEMBER_KEY, MEMBER_VALUE, max_size=6), task=HEADER_TEXT,
       key=st.none() | st.binary(min_size=32, max_size=40), now=st.floats(0, 2e9))
def test_signed_baggage_never_raises_and_unsigned_never_raises_limits(members: dict[str, str], task: str,
                                                                      key: bytes | None, now: float) -> None:
    raises, _notes = verify_budget_baggage(members, task, key, now)
    if "ragtoll.budget.sig" not in members:
        assert raises == {}


@pytest.mark.slow
@FAST
@given(task=st.from_regex(TASK_ID, fullmatch=True), other=st.from_regex(TASK_ID, fullmatch=True),
       steps=st.integers(1, 10**6))
def test_a_signature_never_transfers_to_another_task(task: str, other: str, steps: int) -> None:
    key = b"k" * 32
    members = dict(m.split("=", 1) for m in sign_budget(task, {"max_steps": steps}, key, 2e9).split(","))
    assert verify_budget_baggage(members, task, key, 1e9)[0] == {"max_steps": steps}
    if other != task:
        assert verify_budget_baggage(members, other, key, 1e9)[0] == {}


# --- the config loader ----------------------------------------------------------------------------

SCALAR = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(), st.text(max_size=12),
                   st.sampled_from(["memory", "redis://127.0.0.1:1/0", "http://127.0.0.1:1", "/p", "llm", "openai",
                                    "open", "closed", "enforce", "shadow", "p", "session", "jwt", "upstream:a"]))
ANY = st.recursive(SCALAR, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                      max_size=3), max_leaves=10)


def leaf(tp: Any) -> st.SearchStrategy[Any]:
    """Mostly values of the field's own type (so validation is reached), sometimes anything."""
    text = str(tp)
    if "Literal" in text:
        good: st.SearchStrategy[Any] = st.sampled_from(typing.get_args(tp) or ("x",))
    elif tp is bool:
        good = st.booleans()
    elif "float" in text:
        good = st.floats() | st.integers(-10, 10**6)
    elif "int" in text:
        good = st.integers(-10, 70_000)
    elif "tuple" in text:
        good = st.lists(st.sampled_from(["HS256", "RS256", "none", "x"]), max_size=3)
    elif "Mapping" in text:
        good = st.dictionaries(st.sampled_from(["a", "p", "docs"]), st.sampled_from(["p", "v1", "x", ""]), max_size=2)
    else:
        good = st.sampled_from(["memory", "redis://127.0.0.1:1/0", "redis+cluster://h:1", "http://127.0.0.1:1",
                                "/p", "/admin", "a", "upstream:a", "local", "none", "x-h", "", "p"]) | st.text(max_size=8)
    return rarely(good, SCALAR)


def rarely(usual: st.SearchStrategy[Any], odd: st.SearchStrategy[Any], one_in: int = 8) -> st.SearchStrategy[Any]:
    """`usual`, or `odd` about once in `one_in` draws (st.one_of would pick each half the time)."""
    pick = one_in // 2 + 1  # not an end of the range: hypothesis favours those
    return st.tuples(usual, odd, st.integers(1, one_in)).map(lambda t: t[1] if t[2] == pick else t[0])


SUBSECTIONS: dict[str, type[Any]] = {
    "server": config.ServerConfig, "timeouts": config.Timeouts, "limits": config.Limits, "tasks": config.TasksConfig,
    "admin": config.AdminConfig, "cache": config.CacheConfig, "identity": config.IdentityConfig,
    "jwt": config.JwtConfig, "header": config.HeaderIdentityConfig, "telemetry": config.TelemetryConfig,
    "budgets": config.BudgetsConfig}


def section(cls: type[Any], depth: int = 0) -> st.SearchStrategy[dict[str, Any]]:
    """Mappings over `cls`'s real keys with mostly well-typed values, sometimes a stray key."""
    hints = typing.get_type_hints(cls)
    fields: dict[str, st.SearchStrategy[Any]] = {}
    for f in dataclasses.fields(cls):
        if f.name == "upstreams":
            fields[f.name] = st.lists(section(config.UpstreamConfig, depth + 1), min_size=1, max_size=3)
        elif f.name == "profiles":
            fields[f.name] = st.dictionaries(st.sampled_from(["p", "bounded", "x"]), section(Profile, depth + 1),
                                             max_size=2)
        elif f.name == "rules":
            fields[f.name] = st.lists(section(config.ProfileRule, depth + 1), max_size=2)
        elif f.name == "pricing":
            fields[f.name] = st.dictionaries(st.sampled_from(["a", "gpt-4o-mini"]), section(config.PriceEntry), max_size=2)
        elif f.name in SUBSECTIONS and depth < 3:
            fields[f.name] = section(SUBSECTIONS[f.name], depth + 1)
        else:
            fields[f.name] = leaf(hints[f.name])
    clean = st.fixed_dictionaries({}, optional=fields)
    with_stray = rarely(clean, st.fixed_dictionaries({"stray": SCALAR}, optional=fields), one_in=12)
    return with_stray if depth == 0 else rarely(with_stray, ANY, one_in=12)  # parse() takes a mapping


@pytest.mark.slow
@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=section(config.Settings))
def test_config_parse_gives_settings_or_a_config_error(raw: dict[str, Any]) -> None:
    try:
        settings_ = config.parse(raw)
    except ConfigError as exc:
        assert str(exc).startswith("Config ")  # names the key, the value and what is valid
        return
    assert isinstance(settings_, config.Settings)


@pytest.mark.parametrize("text", ["", "[]", "- a\n- b", "a: [", "upstreams: 5", "store: {x: 1}", "\x00", "? a\n: b",
                                  "server:\n  port: 99999999999999999999999", "budgets: !!python/object:os.system x"])
def test_config_load_of_odd_yaml_gives_settings_or_a_config_error(tmp_path: Any, text: str) -> None:
    path = tmp_path / "ragtoll.yaml"
    path.write_text(text)
    try:
        assert isinstance(config.load({}, str(path)), config.Settings)
    except ConfigError as exc:
        assert str(exc).startswith("Config ")


# --- identity from JWTs ---------------------------------------------------------------------------

def _b64(doc: Any) -> str:
    raw = json.dumps(doc).encode()  # stdlib: big integers and NaN too
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


JWT_HEADER = st.fixed_dictionaries({"alg": st.sampled_from(["HS256", "none", "None", "RS256", "HS512", "", "hs256"])},
                                   optional={"typ": st.just("JWT"), "kid": st.text(max_size=8),
                                             "crit": st.lists(st.text(max_size=4), max_size=2)})
JWT_CLAIMS = st.fixed_dictionaries({}, optional={"sub": st.text(max_size=8) | st.integers(), "exp": st.integers(-2**40, 2**40)
                                                 | st.floats() | st.text(max_size=4), "aud": st.text(max_size=6),
                                                 "groups": ANY, "tenant": ANY})
FORGED = st.one_of(
    HEADER_TEXT,
    st.builds(lambda h, c, sig: f"{_b64(h)}.{_b64(c)}.{sig}", JWT_HEADER, JWT_CLAIMS,
              st.sampled_from(["", "AAAA", "sig", "-_-_"])),
)


@FAST
@given(token=FORGED, scheme=st.sampled_from(["Bearer ", "bearer ", "Basic ", ""]))
def test_forged_tokens_never_give_an_identity(token: str, scheme: str) -> None:
    resolver = CallerResolver(IdentityConfig(mode="jwt"), env={"RAGTOLL_JWT_SECRET": "s" * 32})
    resolution = resolver.resolve({"authorization": scheme + token})
    assert resolution.principal is None and resolution.reason.startswith("identity:")
