"""Principals from real signed JWTs (HS256, RS256 and ES256 from a JWKS file) and from trusted gateway headers."""

from __future__ import annotations

import json
import pathlib
import time
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from ragtoll.proxy.config import HeaderIdentityConfig, IdentityConfig, JwtConfig
from ragtoll.proxy.errors import ConfigError
from ragtoll.proxy.request.caller import CallerResolver

SECRET = "s3cret-s3cret-s3cret-s3cret-s3cret-0"
ENV = {"RAGTOLL_JWT_SECRET": SECRET}


def claims(**over: Any) -> dict[str, Any]:
    base = {"sub": "alice", "groups": ["finance", "staff"], "aud": "ragtoll", "iss": "https://idp.example",
            "exp": int(time.time()) + 300, "tenant": "acme"}
    base.update(over)
    return base


def hs(**cfg: Any) -> CallerResolver:
    jwt_cfg = JwtConfig(audience="ragtoll", issuer="https://idp.example", **cfg)
    return CallerResolver(IdentityConfig(mode="jwt", jwt=jwt_cfg), ENV)


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def test_good_hs256_token_gives_subject_groups_and_tenant() -> None:
    r = hs().resolve(bearer(jwt.encode(claims(), SECRET, algorithm="HS256")))
    assert r.principal is not None
    assert (r.principal.subject, r.principal.groups, r.principal.tenant) == ("alice", frozenset({"finance", "staff"}), "acme")


def test_two_principals_with_different_groups_have_different_keys() -> None:
    a = hs().resolve(bearer(jwt.encode(claims(), SECRET, algorithm="HS256"))).principal
    b = hs().resolve(bearer(jwt.encode(claims(sub="bob", groups=["eng"]), SECRET, algorithm="HS256"))).principal
    assert a is not None and b is not None
    assert a.key != b.key and a.groups.isdisjoint(b.groups)


@pytest.mark.parametrize(("token", "reason"), [
    (lambda: jwt.encode(claims(exp=int(time.time()) - 10), SECRET, algorithm="HS256"), "identity:expired"),
    (lambda: jwt.encode(claims(aud="someone-else"), SECRET, algorithm="HS256"), "identity:audience"),
    (lambda: jwt.encode(claims(iss="https://evil.example"), SECRET, algorithm="HS256"), "identity:issuer"),
    (lambda: jwt.encode(claims(), "another-secret-another-secret-another", algorithm="HS256"), "identity:signature"),
    (lambda: jwt.encode(claims(), SECRET * 2, algorithm="HS512"), "identity:algorithm"),
    (lambda: jwt.encode(claims(), None, algorithm="none"), "identity:algorithm"),
    (lambda: jwt.encode({k: v for k, v in claims().items() if k != "exp"}, SECRET, algorithm="HS256"), "identity:claims"),
    (lambda: "not.a.jwt", "identity:invalid"),
])
def test_bad_tokens_give_no_principal(token: Any, reason: str) -> None:
    r = hs().resolve(bearer(token()))
    assert r.principal is None and r.reason == reason


def test_alg_none_is_refused_even_when_listed() -> None:
    with pytest.raises(ConfigError):
        hs(algorithms=["none"])
    with pytest.raises(ConfigError):
        hs(algorithms=["HS256", "RS256"])  # mixed families invite key confusion


def test_missing_or_short_secret_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="RAGTOLL_JWT_SECRET"):
        CallerResolver(IdentityConfig(mode="jwt"), {"RAGTOLL_JWT_SECRET": "short"})


def test_missing_token_is_no_principal() -> None:
    assert hs().resolve({}).reason == "identity:missing"
    assert hs().resolve({"authorization": "Basic abc"}).reason == "identity:missing"


@pytest.fixture
def jwks(tmp_path: pathlib.Path) -> tuple[pathlib.Path, Any, Any]:
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ec_key = ec.generate_private_key(ec.SECP256R1())
    keys = []
    for kid, key, alg in (("r1", rsa_key, jwt.algorithms.RSAAlgorithm), ("e1", ec_key, jwt.algorithms.ECAlgorithm)):
        jwk = json.loads(alg.to_jwk(key.public_key()))
        jwk["kid"] = kid
        keys.append(jwk)
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps({"keys": keys}))
    return path, rsa_key, ec_key


def test_rs256_and_es256_from_a_jwks_file(jwks: tuple[pathlib.Path, Any, Any]) -> None:
    path, rsa_key, ec_key = jwks
    cfg = IdentityConfig(mode="jwt", jwt=JwtConfig(jwks_file=str(path), algorithms=["RS256", "ES256"],
                                                    audience="ragtoll", groups_claim="roles"))
    r = CallerResolver(cfg, {})
    good_rs = jwt.encode(claims(roles=["eng"]), rsa_key, algorithm="RS256", headers={"kid": "r1"})
    good_es = jwt.encode(claims(sub="bob", roles="ops admins"), ec_key, algorithm="ES256", headers={"kid": "e1"})
    a, b = r.resolve(bearer(good_rs)).principal, r.resolve(bearer(good_es)).principal
    assert a is not None and a.groups == frozenset({"eng"})
    assert b is not None and b.subject == "bob" and b.groups == frozenset({"ops", "admins"})
    # a token signed by a key not in the JWKS, one naming the wrong kid, and HS256 made with the public key
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    assert r.resolve(bearer(jwt.encode(claims(), other, algorithm="RS256", headers={"kid": "r1"}))).reason == \
        "identity:signature"
    assert r.resolve(bearer(jwt.encode(claims(), rsa_key, algorithm="RS256", headers={"kid": "zz"}))).reason == \
        "identity:unknown_key"
    assert r.resolve(bearer(jwt.encode(claims(), "public-key-as-secret-xxxxxxxxxxxxxxxxxxxxx", algorithm="HS256"))).reason == \
        "identity:algorithm"


def test_headers_are_trusted_only_in_header_mode() -> None:
    forged = {"x-auth-subject": "alice", "x-auth-groups": "finance, admins", "x-auth-tenant": "acme"}
    trusted = CallerResolver(IdentityConfig(mode="header", header=HeaderIdentityConfig()), {})
    p = trusted.resolve(forged).principal
    assert p is not None and p.subject == "alice" and p.groups == frozenset({"finance", "admins"})
    # in jwt mode the same headers are nothing: no principal without a verified token
    assert hs().resolve(forged).principal is None
    # in none mode the caller is anonymous, keyed by its credential, whatever headers claim
    anon = CallerResolver(IdentityConfig(mode="none"), {})
    q = anon.resolve(forged).principal
    assert q is not None and q.subject.startswith("anonymous:") and not q.groups
    assert anon.resolve({**forged, "authorization": "Bearer k1"}).principal != \
        anon.resolve({**forged, "authorization": "Bearer k2"}).principal
