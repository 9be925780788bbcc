"""Which headers cross the gateway, and which identity the backend is told about.

Pure functions over header lists, so the security-critical rules are property-tested without
sockets. Inbound: every header that could carry identity or credentials is dropped whatever its
letter case and however often it appears (the standard `X-Remote-*` names, the configured
`--requestheader-*` names and prefixes, `Authorization`, `Impersonate-*`, and a bearer token
offered as a WebSocket subprotocol), hop-by-hop headers go (including those named in
`Connection`), then the authenticated caller is asserted exactly as
client-go's `SetAuthProxyHeaders` does. Outbound responses lose hop-by-hop and CORS headers
(upstream's `corsRemovingTransport`).

The configured names are the flags' and, in kube mode, those of the cluster's
`extension-apiserver-authentication` ConfigMap, which change while the gateway runs:
`LiveIdentityPolicy` follows them (k/k#119631: stripping only the default names let callers assert
groups through custom ones).

Names are compared with `_` read as `-` (`dashed`): a CGI or WSGI backend turns `X-Remote_User`,
`X_Remote_User` and `X-Remote-User` into the same `HTTP_X_REMOTE_USER`, so a look-alike of any
header the gateway controls (identity, hop-by-hop, `Host`, `X-Forwarded-*`) is dropped like the
header itself. Go's servers keep `_` apart, which is why upstream never needed this.
"""

from __future__ import annotations

import string
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from multidict import CIMultiDict

from aggregator.backends.hops import HOP_HEADER
from aggregator.model.userinfo import UserInfo
from aggregator.wire.wsprotocol import BEARER_PROTOCOL_PREFIX, without_token_protocols

# RFC 7230 §6.1 plus the de-facto Proxy-Connection; Go's ReverseProxy list.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
# What upstream's corsRemovingTransport deletes from backend responses.
CORS_RESPONSE = frozenset(
    {
        "access-control-allow-credentials",
        "access-control-allow-headers",
        "access-control-allow-methods",
        "access-control-allow-origin",
    }
)
# Identity headers stripped whatever the requestheader configuration says (upstream strips these
# in WithAuthentication and WithImpersonation before the aggregator ever proxies).
STANDARD_IDENTITY_NAMES = ("authorization", "x-remote-user", "x-remote-uid", "x-remote-group")
STANDARD_IDENTITY_PREFIXES = ("x-remote-extra-", "impersonate-")

REMOTE_USER = "X-Remote-User"
REMOTE_UID = "X-Remote-Uid"
REMOTE_GROUP = "X-Remote-Group"
REMOTE_EXTRA_PREFIX = "X-Remote-Extra-"
IMPERSONATE_USER = "Impersonate-User"
IMPERSONATE_UID = "Impersonate-Uid"
IMPERSONATE_GROUP = "Impersonate-Group"
IMPERSONATE_EXTRA_PREFIX = "Impersonate-Extra-"

# What a response may carry that never goes on: hop-by-hop and CORS headers (and `Connection`).
_RESPONSE_DROPPED = HOP_BY_HOP | CORS_RESPONSE
_TOKEN_BYTES = frozenset((string.ascii_letters + string.digits + "!#$%&'*+-.^_`|~").encode())
# Bytes that would let a value smuggle a second header line (or be refused by the HTTP writer).
_UNSAFE_VALUE = ("\r", "\n", "\x00")


def dashed(name: str) -> str:
    """A header name lower-cased with `_` read as `-`, as CGI and WSGI backends read it."""
    return name.lower().replace("_", "-")


def header_key_escape(key: str) -> str:
    """client-go's `headerKeyEscape`: %-encode (uppercase hex) every non-token byte and every `%`."""
    out = []
    for b in key.encode("utf-8"):
        if b not in _TOKEN_BYTES or b == 0x25:
            out.append(f"%{b:02X}")
        else:
            out.append(chr(b))
    return "".join(out)


def canonical_header_key(name: str) -> str:
    """Go's `textproto.CanonicalMIMEHeaderKey` (`x-remote-extra-a%2fb` -> `X-Remote-Extra-A%2fb`).

    Names with a non-token byte are returned unchanged, as Go does.
    """
    if any(ord(c) > 127 or ord(c) not in _TOKEN_BYTES for c in name):
        return name
    out = []
    upper = True
    for c in name:
        out.append(c.upper() if upper else c.lower())
        upper = c == "-"
    return "".join(out)


@dataclass(frozen=True)
class IdentityHeaderPolicy:
    """Which inbound header names carry identity: exact names and prefixes, all lower-cased."""

    names: frozenset[str]
    prefixes: tuple[str, ...]
    # Escaped, canonical extra-header names by key; extra keys repeat (credential-id), so cache.
    _extra_names: dict[tuple[str, str], str] = field(default_factory=dict, compare=False, repr=False)
    # The identity headers of recent users, by object (a client certificate's user is one object
    # for all requests of its connection): (user, impersonate) -> the header lines.
    _identities: dict[tuple[int, bool], tuple[UserInfo, list[tuple[str, str]]]] = field(
        default_factory=dict, compare=False, repr=False
    )
    # What `forwarded_headers` decides of an inbound name before looking at its value, by name as
    # sent (clients send the same few names on every request): see `verdict`.
    _verdicts: dict[str, tuple[str, bool, bool]] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def build(
        cls,
        *,
        username_headers: Iterable[str] = (),
        uid_headers: Iterable[str] = (),
        group_headers: Iterable[str] = (),
        extra_prefixes: Iterable[str] = (),
        keep_impersonation: bool = False,
    ) -> IdentityHeaderPolicy:
        """The standard names plus the configured `--requestheader-*` names and prefixes.

        `keep_impersonation` lets `Impersonate-*` through: only for kube-apiserver reached as the
        front proxy, which authorizes the impersonation itself as upstream does.
        """
        names = {*STANDARD_IDENTITY_NAMES}
        names.update(dashed(h.strip()) for h in (*username_headers, *uid_headers, *group_headers))
        prefixes = {*STANDARD_IDENTITY_PREFIXES}
        if keep_impersonation:
            prefixes.discard("impersonate-")
        prefixes.update(dashed(p.strip()) for p in extra_prefixes)
        names.discard("")
        prefixes.discard("")
        return cls(frozenset(names), tuple(sorted(prefixes)))

    def is_identity(self, name: str) -> bool:
        key = dashed(name)
        return key in self.names or key.startswith(self.prefixes)

    def identity_of(self, user: UserInfo, impersonate: bool) -> list[tuple[str, str]]:
        """`identity_headers(user, self, impersonate=...)`, computed once per user object."""
        key = (id(user), impersonate)
        known = self._identities.get(key)
        if known is not None and known[0] is user:
            return known[1]
        lines = identity_headers(user, self, impersonate=impersonate)
        if len(self._identities) >= 4096:
            self._identities.clear()
        self._identities[key] = (user, lines)
        return lines

    def verdict(self, name: str) -> tuple[str, bool, bool]:
        """An inbound header name's `dashed` form, and whether it never goes on (hop-by-hop,
        identity, or set by the gateway itself) without and with the `X-Forwarded-*` headers."""
        known = self._verdicts.get(name)
        if known is not None:
            return known
        lowered = dashed(name)
        never = lowered in HOP_BY_HOP or lowered in self.names or lowered.startswith(self.prefixes)
        verdict = (lowered, never or lowered in _REPLACED, never or lowered in _REPLACED_FORWARDED)
        if len(self._verdicts) < 4096:
            self._verdicts[name] = verdict
        return verdict

    def extra_header(self, prefix: str, key: str) -> str:
        cache_key = (prefix, key)
        name = self._extra_names.get(cache_key)
        if name is None:
            name = canonical_header_key(prefix + header_key_escape(key))
            if len(self._extra_names) < 4096:
                self._extra_names[cache_key] = name
        return name


DEFAULT_POLICY = IdentityHeaderPolicy.build()


class RequestHeaderNames(Protocol):
    """The header names of a front-proxy configuration: the `--requestheader-*` flags
    (`auth.options.RequestHeaderOptions`) or the cluster's (`auth.requestheader.RequestHeaderConfig`)."""

    @property
    def username_headers(self) -> Sequence[str]: ...

    @property
    def uid_headers(self) -> Sequence[str]: ...

    @property
    def group_headers(self) -> Sequence[str]: ...

    @property
    def extra_prefixes(self) -> Sequence[str]: ...


class LiveIdentityPolicy:
    """The identity-header policy for the front-proxy configuration in force right now.

    Always strips the standard names and the `--requestheader-*` flags' names; with `follow`, also
    the names of whatever configuration the authenticator currently reads front-proxy identity
    from (kube mode: the cluster's ConfigMap, replaced when it changes). `current()` is on every
    proxied request's path: one call and an identity comparison, a rebuild only when the
    configuration object changed.
    """

    def __init__(self, flags: RequestHeaderNames | None = None, *, keep_impersonation: bool = False) -> None:
        """`flags`: the `--requestheader-*` names, always stripped (None: the standard names only)."""
        self._flags: tuple[tuple[str, ...], ...] = (
            (
                tuple(flags.username_headers),
                tuple(flags.uid_headers),
                tuple(flags.group_headers),
                tuple(flags.extra_prefixes),
            )
            if flags is not None
            else ((), (), (), ())
        )
        self._keep_impersonation = keep_impersonation
        self._base = self._build(None)
        self._source: Callable[[], RequestHeaderNames | None] | None = None
        self._seen: RequestHeaderNames | None = None
        self._policy = self._base

    def follow(self, source: Callable[[], RequestHeaderNames | None]) -> None:
        """Also strip the names of `source()`'s configuration (None: none configured right now)."""
        self._source = source
        self._seen = None
        self._policy = self._base

    def current(self) -> IdentityHeaderPolicy:
        source = self._source
        if source is None:
            return self._policy
        config = source()
        if config is not self._seen:
            self._seen = config
            self._policy = self._base if config is None else self._build(config)
        return self._policy

    def _build(self, config: RequestHeaderNames | None) -> IdentityHeaderPolicy:
        users, uids, groups, prefixes = self._flags
        if config is not None:
            users += tuple(config.username_headers)
            uids += tuple(config.uid_headers)
            groups += tuple(config.group_headers)
            prefixes += tuple(config.extra_prefixes)
        return IdentityHeaderPolicy.build(
            username_headers=users,
            uid_headers=uids,
            group_headers=groups,
            extra_prefixes=prefixes,
            keep_impersonation=self._keep_impersonation,
        )


def _safe(value: str) -> bool:
    return not any(c in value for c in _UNSAFE_VALUE)


def connection_tokens(values: Iterable[str]) -> frozenset[str]:
    """Header names listed in `Connection` values (`close`, `upgrade`, `x-foo`...), `dashed`."""
    return frozenset(dashed(t.strip()) for v in values for t in v.split(",") if t.strip())


def identity_headers(
    user: UserInfo,
    policy: IdentityHeaderPolicy = DEFAULT_POLICY,
    *,
    impersonate: bool = False,
) -> list[tuple[str, str]]:
    """The caller as front-proxy headers (`SetAuthProxyHeaders`) or impersonation headers.

    `X-Remote-User` always (even empty), `X-Remote-Uid` only when set, one `X-Remote-Group` per
    group in order, `X-Remote-Extra-<escaped key>` once per value (keys sorted: Go iterates its map
    in random order, a fixed order is kinder to caches and tests). Values that could break the
    header block (CR, LF, NUL) are left out: asserting less identity is the safe direction.
    """
    if impersonate:
        user_h, uid_h, group_h, extra_p = (
            IMPERSONATE_USER,
            IMPERSONATE_UID,
            IMPERSONATE_GROUP,
            IMPERSONATE_EXTRA_PREFIX,
        )
    else:
        user_h, uid_h, group_h, extra_p = REMOTE_USER, REMOTE_UID, REMOTE_GROUP, REMOTE_EXTRA_PREFIX
    out = [(user_h, user.name if _safe(user.name) else "")]
    if user.uid and _safe(user.uid):
        out.append((uid_h, user.uid))
    out.extend((group_h, g) for g in user.groups if _safe(g))
    for key in sorted(user.extra):
        name = policy.extra_header(extra_p, key)
        out.extend((name, v) for v in user.extra[key] if _safe(v))
    return out


def go_path_clean(path: str) -> str:
    """Go's `path.Clean` (posixpath.normpath keeps a leading `//`; Go does not)."""
    if not path:
        return "."
    rooted = path.startswith("/")
    parts: list[str] = []
    for seg in path.split("/"):
        if seg in ("", "."):
            continue
        if seg == "..":
            if parts and parts[-1] != "..":
                parts.pop()
            elif not rooted:
                parts.append("..")
            continue
        parts.append(seg)
    cleaned = "/".join(parts)
    if rooted:
        return "/" + cleaned
    return cleaned or "."


def forwarded_uri(raw_path: str) -> str:
    """`X-Forwarded-Uri`: the escaped path, cleaned, trailing `/` kept, no query (proxy.Transport)."""
    path = raw_path.split("?", 1)[0]
    if path.startswith("/") and "/." not in path and "//" not in path:
        return path  # already clean (the pipeline refuses dot and empty segments anyway)
    uri = go_path_clean(path) if path else ""
    if path.endswith("/") and not uri.endswith("/"):
        uri += "/"
    return uri


def forwarded_headers(
    inbound: Iterable[tuple[str, str]],
    user: UserInfo | None,
    policy: IdentityHeaderPolicy = DEFAULT_POLICY,
    *,
    authority: str,
    client_ip: str | None = None,
    forwarded_host: str | None = None,
    forwarded_uri: str | None = None,
    upgrade: str | None = None,
    impersonate: bool = False,
    extra: Mapping[str, str] | None = None,
    hop: str | None = None,
) -> list[tuple[str, str]]:
    """The header lines of the request sent to a backend, in order (`request_headers`, as a list
    the proxy writes straight into the request head).

    `inbound` is every (name, value) the client sent. `user` None sends no identity at all (the
    delegate with its own credentials when the caller is unknown never happens; fetch always has
    one). `upgrade` is the protocol of a tunnelled upgrade: its `Upgrade` header survives with
    `Connection: Upgrade`. `extra` headers (the gateway's own `Authorization` for impersonation)
    are added last. `hop` is this gateway's loop mark (`hops.HOP_HEADER`); an inbound one never
    passes. `Expect` never passes either: the gateway answered any `100-continue` itself, and the
    body follows unasked.
    """
    # Each name once, `dashed`: a look-alike is dropped like the header it imitates (module docstring).
    verdicts = policy._verdicts
    never = 2 if forwarded_uri is not None else 1  # which of the verdicts applies
    dropped: frozenset[str] = frozenset()
    forwarded_for: list[str] = []
    kept: list[tuple[str, str, str]] = []
    for name, value in inbound:
        verdict = verdicts.get(name) or policy.verdict(name)
        lowered = verdict[0]
        if lowered == "connection":
            dropped = dropped | connection_tokens((value,))
        elif lowered == "x-forwarded-for":
            forwarded_for.append(value)
        if not verdict[never]:
            kept.append((name, value, lowered))
    if "x-forwarded-for" in dropped:  # hop-by-hop here: Go's ReverseProxy removes it before appending
        forwarded_for = []
    out: list[tuple[str, str]] = []
    for name, value, lowered in kept:
        if lowered in dropped:
            continue
        if lowered == "sec-websocket-protocol" and BEARER_PROTOCOL_PREFIX in value:
            # Upstream removes the entry only when it authenticated the caller; a credential never
            # goes on here, whoever the caller turned out to be.
            kept_value = without_token_protocols(value)
            if kept_value is None:
                continue
            value = kept_value
        out.append((name, value))
    out.append(("Host", authority))
    if user is not None:
        out += policy.identity_of(user, impersonate)
    if client_ip:
        forwarded_for.append(client_ip)
    if forwarded_for:
        out.append(("X-Forwarded-For", ", ".join(forwarded_for)))
    if forwarded_uri is not None:
        out.append(("X-Forwarded-Uri", forwarded_uri))
        out.append(("X-Forwarded-Host", forwarded_host or authority))
        out.append(("X-Forwarded-Proto", "https"))
    if upgrade is not None:
        out.append(("Connection", "Upgrade"))
        out.append(("Upgrade", upgrade))
    if extra:
        out += extra.items()
    if hop:
        out.append((HOP_HEADER, hop))
    return out


# Inbound headers the gateway always sets itself (or never sends): never copied.
_REPLACED = frozenset({"host", "x-forwarded-for", "expect", HOP_HEADER.lower()})
_REPLACED_FORWARDED = _REPLACED | {"x-forwarded-uri", "x-forwarded-host", "x-forwarded-proto"}


def request_headers(
    inbound: Iterable[tuple[str, str]],
    user: UserInfo | None,
    policy: IdentityHeaderPolicy = DEFAULT_POLICY,
    **kwargs: Any,
) -> CIMultiDict[str]:
    """`forwarded_headers` as a multidict (the tunnel, the gateway's own fetches)."""
    return CIMultiDict(forwarded_headers(inbound, user, policy, **kwargs))


def response_headers(upstream: Iterable[tuple[str, str]]) -> CIMultiDict[str]:
    """A backend response's headers minus hop-by-hop (and `Connection`-named) and CORS headers."""
    pairs = list(upstream)
    kept = [(name, value) for name, value in pairs if name.lower() not in _RESPONSE_DROPPED]
    if len(kept) < len(pairs):
        # `Connection` may name more (after or before it): those go too.
        named = connection_tokens(value for name, value in pairs if name.lower() == "connection")
        if not named <= _RESPONSE_DROPPED:
            kept = [(name, value) for name, value in kept if name.lower() not in named]
    return CIMultiDict(kept)
