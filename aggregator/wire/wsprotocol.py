"""A bearer token carried as a WebSocket subprotocol, for clients that cannot set `Authorization`.

Browsers cannot add headers to a WebSocket handshake, so kube-apiserver also accepts the token as
one `Sec-WebSocket-Protocol` entry, `base64url.bearer.authorization.k8s.io.<unpadded base64url>`,
offered beside the real subprotocol (`v5.channel.k8s.io`...). The rules and error messages are
upstream's (`k8s.io/apiserver/pkg/authentication/request/websocket/protocol.go
ProtocolAuthenticator.AuthenticateRequest`): only WebSocket upgrades (`wsstream.IsWebSocketRequest`),
every header value split on `,` and trimmed, at most one token entry, valid base64url and UTF-8,
and at least one other subprotocol left to answer with. An empty token means no token.

Pure functions over header values; the authentication gate uses `protocol_token`, the proxy
`without_token_protocols` so no token entry ever reaches a backend.
"""

from __future__ import annotations

import base64
import binascii
import re

from multidict import CIMultiDict, CIMultiDictProxy

BEARER_PROTOCOL_PREFIX = "base64url.bearer.authorization.k8s.io."
PROTOCOL_HEADER = "Sec-WebSocket-Protocol"

MULTIPLE_TOKENS = "multiple base64.bearer.authorization tokens specified"
INVALID_ENCODING = "invalid base64.bearer.authorization token encoding"
INVALID_TOKEN = "invalid base64.bearer.authorization token"
MISSING_SUBPROTOCOL = "missing additional subprotocol"

_RAW_URL_ALPHABET = re.compile(r"[A-Za-z0-9_-]*")

Headers = CIMultiDictProxy[str] | CIMultiDict[str]


class ProtocolTokenError(ValueError):
    """A token entry was offered and is unusable: a 401 with upstream's message."""


def is_websocket_request(headers: Headers) -> bool:
    """`wsstream.IsWebSocketRequest`: the first `Upgrade` is `websocket` (any case) and some
    `Connection` value mentions `upgrade` (`httpstream.IsUpgradeRequest`)."""
    if headers.get("Upgrade", "").lower() != "websocket":
        return False
    return any("upgrade" in value.lower() for value in headers.getall("Connection", ()))


def _raw_url_decode(encoded: str) -> bytes:
    """Go's `base64.RawURLEncoding.DecodeString`: URL alphabet, no padding."""
    if not _RAW_URL_ALPHABET.fullmatch(encoded) or len(encoded) % 4 == 1:
        raise ProtocolTokenError(INVALID_ENCODING)
    try:
        return base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))
    except (binascii.Error, ValueError) as err:
        raise ProtocolTokenError(INVALID_ENCODING) from err


def protocol_token(headers: Headers) -> str | None:
    """The bearer token offered as a subprotocol, or None when there is none (the authenticator
    abstains). Raises ProtocolTokenError, in upstream's words, for an unusable offer."""
    if not is_websocket_request(headers):
        return None
    token = ""
    seen = False
    others = 0
    for value in headers.getall(PROTOCOL_HEADER, ()):
        for protocol in value.split(","):
            protocol = protocol.strip()
            if not protocol.startswith(BEARER_PROTOCOL_PREFIX):
                others += 1
                continue
            if seen:
                raise ProtocolTokenError(MULTIPLE_TOKENS)
            seen = True
            decoded = _raw_url_decode(protocol[len(BEARER_PROTOCOL_PREFIX) :])
            try:
                token = decoded.decode("utf-8")
            except UnicodeDecodeError as err:
                raise ProtocolTokenError(INVALID_TOKEN) from err
    if token and not others:
        raise ProtocolTokenError(MISSING_SUBPROTOCOL)
    return token or None


def without_token_protocols(value: str) -> str | None:
    """One `Sec-WebSocket-Protocol` value minus its token entries: unchanged when it has none, the
    rest joined by `,` as upstream rewrites it, None when nothing is left."""
    if BEARER_PROTOCOL_PREFIX not in value:
        return value
    kept = [p.strip() for p in value.split(",") if not p.strip().startswith(BEARER_PROTOCOL_PREFIX)]
    return ",".join(kept) if kept else None
