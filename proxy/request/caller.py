"""Who is asking: the principal (subject, groups, tenant) of a call, for the cache's ACL decisions.

`identity.mode`: `jwt` verifies a bearer token with PyJWT (HS256 secret, or RS256/ES256 keys from
a JWKS file; expiry, audience and issuer checked; `alg: none` never accepted); `header` trusts the
auth gateway's headers - and only in that mode; a gateway that sends groups and no subject gets a
subject derived from the groups and tenant; `none` keys an anonymous principal by a hash of the
credential the caller sent, so callers the upstream tells apart never share private entries.
A token that fails verification gives no principal: the call bypasses the cache. An identity
header sent twice is ambiguous (`identity:ambiguous`): the cache stage refuses the call.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import xxhash

from ..config import IdentityConfig
from ..errors import ConfigError
from ..secrets import jwt_secret

ASYMMETRIC = frozenset({"RS256", "RS384", "RS512", "ES256", "ES384", "ES512", "PS256", "PS384", "PS512", "EdDSA"})
SYMMETRIC = frozenset({"HS256", "HS384", "HS512"})
MAX_TOKEN_BYTES = 16 * 1024
MAX_GROUPS = 256


@dataclass(frozen=True, slots=True)
class Principal:
    subject: str
    groups: frozenset[str] = frozenset()
    tenant: str = ""
    authenticated: bool = False

    @property
    def key(self) -> str:
        """The exact principal: subject, tenant and groups. Owner of entries with unknown ACLs."""
        raw = "\x00".join((self.tenant, self.subject, *sorted(self.groups)))
        return xxhash.xxh3_128_hexdigest(raw.encode())

    @property
    def view(self) -> frozenset[str]:
        """What an upstream that filters by caller can tell this caller by: its groups (within its
        tenant, which partitions the cache); an anonymous caller also by its credential (the subject)."""
        return self.groups if self.authenticated else self.groups | {self.subject}


@dataclass(frozen=True, slots=True)
class Resolution:
    principal: Principal | None
    reason: str = ""  # why there is none: identity:missing, identity:expired, ...
    notes: tuple[str, ...] = field(default_factory=tuple)


class PrincipalResolver:
    def __init__(self, config: IdentityConfig, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        self.config = config
        self.mode = config.mode
        self._secret: str | None = None
        self._jwks: dict[str, Any] = {}
        self._single_key: Any = None
        self._jwt: Any = None
        if config.mode != "jwt":
            return
        import jwt  # PyJWT and cryptography (~10 MB) only when identity is jwt

        self._jwt = jwt
        algs = set(config.jwt.algorithms)
        bad = algs - SYMMETRIC - ASYMMETRIC
        if not algs or bad:
            raise ConfigError(
                f"Config 'identity.jwt.algorithms' has value {sorted(algs)!r}. Expected signing algorithms such as "
                "HS256, RS256 or ES256 (never none).", key="identity.jwt.algorithms")
        if algs & SYMMETRIC and algs & ASYMMETRIC:
            # a public key must never be usable as an HMAC secret (algorithm confusion)
            raise ConfigError("Config 'identity.jwt.algorithms' mixes HMAC and public-key algorithms. "
                              "Expected one family.", key="identity.jwt.algorithms")
        if algs & SYMMETRIC:
            secret = (jwt_secret(env, config.jwt.secret_env) or b"").decode("utf-8", "replace")
            if len(secret.encode()) < 32:  # RFC 7518 3.2: at least the hash size
                raise ConfigError(f"Config 'identity.jwt.secret_env' names {config.jwt.secret_env}, which must hold "
                                  "a secret of at least 32 bytes.", key="identity.jwt.secret_env")
            self._secret = secret
        else:
            if not config.jwt.jwks_file:
                raise ConfigError("Config 'identity.jwt.jwks_file' is required for public-key algorithms.",
                                  key="identity.jwt.jwks_file")
            try:
                with open(config.jwt.jwks_file, encoding="utf-8") as fh:
                    keyset = jwt.PyJWKSet.from_json(fh.read())
            except (OSError, jwt.PyJWTError, ValueError) as exc:
                raise ConfigError(f"Config 'identity.jwt.jwks_file' has value {config.jwt.jwks_file!r}, which "
                                  f"cannot be read as a JWKS: {exc}", key="identity.jwt.jwks_file") from exc
            self._jwks = {k.key_id: k for k in keyset.keys if k.key_id}
            if len(keyset.keys) == 1:
                self._single_key = keyset.keys[0]

    @property
    def identity_headers(self) -> frozenset[str]:
        """The request headers (lower case) this mode reads identity from: sent twice, they are ambiguous."""
        if self.mode == "jwt":
            return frozenset({"authorization"})
        if self.mode == "header":
            h = self.config.header
            return frozenset({h.subject.lower(), h.groups.lower(), h.tenant.lower()})
        return frozenset()

    def resolve(self, headers: Mapping[str, str], repeated: Collection[str] = ()) -> Resolution:
        """The caller's principal. `repeated`: header names (lower case) the request sent more than
        once; one of the identity headers among them is `identity:ambiguous`, never a union."""
        if repeated and not self.identity_headers.isdisjoint(repeated):
            return Resolution(None, "identity:ambiguous")
        if self.mode == "jwt":
            return self._from_jwt(headers)
        if self.mode == "header":
            return self._from_headers(headers)
        return Resolution(Principal("anonymous:" + xxhash.xxh3_64_hexdigest(credential(headers).encode())))

    def _from_headers(self, headers: Mapping[str, str]) -> Resolution:
        h = self.config.header
        subject = headers.get(h.subject.lower(), "").strip()
        groups = _split_groups(headers.get(h.groups.lower(), ""))
        tenant = headers.get(h.tenant.lower(), "").strip()[:128]
        if len(subject) > 256:
            return Resolution(None, "identity:invalid")
        if not subject:
            if not groups:
                return Resolution(None, "identity:missing")
            # Groups only: the upstream can tell such callers apart by nothing else, so neither can
            # the cache. The derived subject only owns entries with unknown ACLs (never an ACL match).
            raw = "\x00".join((tenant, *sorted(groups)))
            subject = "groups:" + xxhash.xxh3_64_hexdigest(raw.encode())
            return Resolution(Principal(subject, groups, tenant, authenticated=True), notes=("identity:groups_only",))
        return Resolution(Principal(subject, groups, tenant, authenticated=True))

    def _from_jwt(self, headers: Mapping[str, str]) -> Resolution:
        auth = headers.get("authorization", "")
        scheme, _, token = auth.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return Resolution(None, "identity:missing")
        if len(token) > MAX_TOKEN_BYTES:
            return Resolution(None, "identity:invalid")
        cfg = self.config.jwt
        jwt = self._jwt
        try:
            header = jwt.get_unverified_header(token)
            alg = header.get("alg")
            if not isinstance(alg, str) or alg not in cfg.algorithms:
                return Resolution(None, "identity:algorithm")
            key: Any = self._secret if alg in SYMMETRIC else self._public_key(header.get("kid"))
            if key is None:
                return Resolution(None, "identity:unknown_key")
            claims = jwt.decode(
                token, key, algorithms=[alg], audience=cfg.audience, issuer=cfg.issuer, leeway=cfg.leeway_s,
                options={"require": ["exp", "sub"], "verify_aud": cfg.audience is not None},
            )
        except jwt.ExpiredSignatureError:
            return Resolution(None, "identity:expired")
        except (jwt.InvalidAudienceError, jwt.MissingRequiredClaimError) as exc:
            why = "audience" if isinstance(exc, jwt.InvalidAudienceError) else "claims"
            return Resolution(None, f"identity:{why}")
        except jwt.InvalidIssuerError:
            return Resolution(None, "identity:issuer")
        except jwt.InvalidSignatureError:
            return Resolution(None, "identity:signature")
        except (jwt.PyJWTError, ValueError, TypeError):
            return Resolution(None, "identity:invalid")
        subject = claims.get("sub")
        if not isinstance(subject, str) or not subject:
            return Resolution(None, "identity:claims")
        raw_groups = claims.get(cfg.groups_claim, [])
        if isinstance(raw_groups, str):
            groups = _split_groups(raw_groups.replace(" ", ","))
        elif isinstance(raw_groups, list):
            groups = frozenset(str(g) for g in raw_groups[:MAX_GROUPS] if isinstance(g, (str, int)))
        else:
            groups = frozenset()
        tenant = claims.get(cfg.tenant_claim, "")
        return Resolution(Principal(subject, groups, str(tenant)[:128] if tenant else "", authenticated=True))

    def _public_key(self, kid: Any) -> Any:
        jwk = self._jwks.get(kid) if isinstance(kid, str) else None
        if jwk is None and kid is None:
            jwk = self._single_key
        return jwk.key if jwk is not None else None


CREDENTIAL_HEADERS = ("authorization", "api-key", "x-api-key")


def credential(headers: Mapping[str, str]) -> str:
    """The credential a caller sent: the headers the upstream authenticates by, joined (only NULs
    when it sent none). Only ever hashed, never stored."""
    return "\x00".join(headers.get(h, "") for h in CREDENTIAL_HEADERS)


def _split_groups(value: str) -> frozenset[str]:
    return frozenset(g.strip() for g in value.split(",")[:MAX_GROUPS] if g.strip())
