"""Who is calling, resolved once per call, early (DESIGN.md "Task identity": who is calling).

`CallerResolver.resolve` gives the pipeline one `Caller` per call, which every stage reads from the
exchange: the principal the cache's ACL decisions use, and the id budgets across tasks count by.
`identity.mode`: `jwt` verifies a bearer token with PyJWT (HS256 secret, or RS256/ES256 keys from
a JWKS file; expiry, audience and issuer checked; `alg: none` never accepted); `header` trusts the
auth gateway's headers - and only in that mode; a gateway that sends groups and no subject gets a
subject derived from the groups and tenant; `none` keys an anonymous principal by a hash of the
credential the caller sent, so callers the upstream tells apart never share private entries.
A token that fails verification (invalid, expired, forged) is refused: `Caller.refusal`, a 401 the
pipeline answers, never a fall back to another principal. An identity header sent twice is
ambiguous (`identity:ambiguous`), never a union.

The principal budgets count by is canonical (core/principals.py): the credential the route's
upstream authenticates by (`credential_headers`), so a caller cannot rename itself by spelling; a
credential header sent twice is refused (400), not guessed between. A caller with neither a
verified identity nor a credential is anonymous: its principal is its address
(`principals.anonymous: address`), or it is refused with a 401 (`refuse`, for gateways).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import xxhash

from ..config import IdentityConfig
from ..core import principals as pc
from ..errors import BadRequest, ConfigError, Rejected, Unauthorized
from ..model import Principal
from ..secrets import jwt_secret

ASYMMETRIC = frozenset({"RS256", "RS384", "RS512", "ES256", "ES384", "ES512", "PS256", "PS384", "PS512", "EdDSA"})
SYMMETRIC = frozenset({"HS256", "HS384", "HS512"})
MAX_TOKEN_BYTES = 16 * 1024
MAX_GROUPS = 256


AMBIGUOUS = "identity:ambiguous"
_Found = tuple[Principal | None, str, tuple[str, ...]]  # a principal, or why there is none; notes


@dataclass(frozen=True, slots=True)
class Caller:
    """Who is calling. `principal`: the verified identity (or, in `identity.mode: none`, the
    anonymous principal keyed by the credential) for ACL decisions; None when there is none, and
    `reason` says why (identity:missing, identity:expired, identity:ambiguous - then `notes` names
    the identity headers sent more than once - ...). `id`: the
    principal budgets across tasks count by (core/principals.py): the verified identity, else
    the credential's hash, else the client address."""

    principal: Principal | None
    id: str
    reason: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)
    refusal: Rejected | None = None  # set: the call is answered with it, never forwarded


ANONYMOUS = "identity:anonymous"


class CallerResolver:
    def __init__(self, config: IdentityConfig, env: Mapping[str, str], *, anonymous: str = "address") -> None:
        """`env`: where the JWT secret named by config is read (secrets.jwt_secret); `anonymous`:
        `principals.anonymous` (address: such callers are known by their address; refuse: 401)."""
        self.config = config
        self.mode = config.mode
        self.refuse_anonymous = anonymous == "refuse"
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

    def resolve(self, headers: Mapping[str, str], repeated: Collection[str] = (), client: str = "",
                credential_headers: tuple[str, ...] = pc.CREDENTIAL_HEADERS) -> Caller:
        """The caller of a request with these headers (names in lower case) from address `client`
        on a route whose upstream authenticates by `credential_headers` (its adapter's).
        `repeated`: header names the request sent more than once; one of the identity headers
        among them is `identity:ambiguous`, never a union."""
        if repeated and not self.identity_headers.isdisjoint(repeated):
            principal, reason, notes = None, AMBIGUOUS, tuple(sorted(self.identity_headers.intersection(repeated)))
        elif self.mode == "jwt":
            principal, reason, notes = self._from_jwt(headers)
        elif self.mode == "header":
            principal, reason, notes = self._from_headers(headers)
        else:
            principal = Principal("anonymous:" + xxhash.xxh3_64_hexdigest(
                pc.credential(headers, credential_headers).encode()))
            reason, notes = "", ()
        if principal is not None and principal.authenticated:
            return Caller(principal, pc.subject_id(principal.subject, principal.tenant), reason, notes)
        if self.mode == "jwt" and reason != "identity:missing":
            # a token was presented and failed: refused, never counted as someone else
            return Caller(None, f"addr:{client or 'unknown'}", reason, notes, refusal=Unauthorized(
                f"the bearer token was refused ({reason}); send a valid, unexpired token", reason=reason))
        return self._unverified(principal, reason, notes, headers, repeated, client, credential_headers)

    def _unverified(self, principal: Principal | None, reason: str, notes: tuple[str, ...],
                    headers: Mapping[str, str], repeated: Collection[str], client: str,
                    names: tuple[str, ...]) -> Caller:
        """A caller without a verified identity: known by its canonical credential, else its address."""
        cred = pc.canonical_credential(headers, names)
        if cred and cred.partition(":")[0] in repeated:
            name = cred.partition(":")[0]
            return Caller(principal, pc.principal_id(None, "", cred, client), reason, notes, refusal=BadRequest(
                f"the credential header {name!r} was sent more than once; send it once", header=name))
        if not cred and self.refuse_anonymous:
            return Caller(principal, f"addr:{client or 'unknown'}", reason or ANONYMOUS, notes, refusal=Unauthorized(
                "this gateway refuses anonymous callers (principals.anonymous: refuse); send the credential "
                f"the upstream authenticates by ({', '.join(names)})", reason=ANONYMOUS))
        return Caller(principal, pc.principal_id(None, "", cred, client), reason, notes)

    def _from_headers(self, headers: Mapping[str, str]) -> _Found:
        h = self.config.header
        subject = headers.get(h.subject.lower(), "").strip()
        groups = _split_groups(headers.get(h.groups.lower(), ""))
        tenant = headers.get(h.tenant.lower(), "").strip()[:128]
        if len(subject) > 256:
            return _none("identity:invalid")
        if not subject:
            if not groups:
                return _none("identity:missing")
            # Groups only: the upstream can tell such callers apart by nothing else, so neither can
            # the cache. The derived subject only owns entries with unknown ACLs (never an ACL match).
            raw = "\x00".join((tenant, *sorted(groups)))
            subject = "groups:" + xxhash.xxh3_64_hexdigest(raw.encode())
            return Principal(subject, groups, tenant, authenticated=True), "", ("identity:groups_only",)
        return Principal(subject, groups, tenant, authenticated=True), "", ()

    def _from_jwt(self, headers: Mapping[str, str]) -> _Found:
        auth = headers.get("authorization", "")
        scheme, _, token = auth.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return _none("identity:missing")
        if len(token) > MAX_TOKEN_BYTES:
            return _none("identity:invalid")
        cfg = self.config.jwt
        jwt = self._jwt
        try:
            header = jwt.get_unverified_header(token)
            alg = header.get("alg")
            if not isinstance(alg, str) or alg not in cfg.algorithms:
                return _none("identity:algorithm")
            key: Any = self._secret if alg in SYMMETRIC else self._public_key(header.get("kid"))
            if key is None:
                return _none("identity:unknown_key")
            claims = jwt.decode(
                token, key, algorithms=[alg], audience=cfg.audience, issuer=cfg.issuer, leeway=cfg.leeway_s,
                options={"require": ["exp", "sub"], "verify_aud": cfg.audience is not None},
            )
        except jwt.ExpiredSignatureError:
            return _none("identity:expired")
        except (jwt.InvalidAudienceError, jwt.MissingRequiredClaimError) as exc:
            why = "audience" if isinstance(exc, jwt.InvalidAudienceError) else "claims"
            return _none(f"identity:{why}")
        except jwt.InvalidIssuerError:
            return _none("identity:issuer")
        except jwt.InvalidSignatureError:
            return _none("identity:signature")
        except (jwt.PyJWTError, ValueError, TypeError):
            return _none("identity:invalid")
        subject = claims.get("sub")
        if not isinstance(subject, str) or not subject:
            return _none("identity:claims")
        raw_groups = claims.get(cfg.groups_claim, [])
        if isinstance(raw_groups, str):
            groups = _split_groups(raw_groups.replace(" ", ","))
        elif isinstance(raw_groups, list):
            groups = frozenset(str(g) for g in raw_groups[:MAX_GROUPS] if isinstance(g, (str, int)))
        else:
            groups = frozenset()
        tenant = claims.get(cfg.tenant_claim, "")
        return Principal(subject, groups, str(tenant)[:128] if tenant else "", authenticated=True), "", ()

    def _public_key(self, kid: Any) -> Any:
        jwk = self._jwks.get(kid) if isinstance(kid, str) else None
        if jwk is None and kid is None:
            jwk = self._single_key
        return jwk.key if jwk is not None else None


def _split_groups(value: str) -> frozenset[str]:
    return frozenset(g.strip() for g in value.split(",")[:MAX_GROUPS] if g.strip())


def _none(reason: str) -> _Found:
    return None, reason, ()
