"""The WebSocket subprotocol bearer token, case by case as upstream's protocol_test.go has them."""

from __future__ import annotations

import base64

import pytest
from multidict import CIMultiDict

from aggregator.wire.wsprotocol import (
    BEARER_PROTOCOL_PREFIX,
    INVALID_ENCODING,
    INVALID_TOKEN,
    MISSING_SUBPROTOCOL,
    MULTIPLE_TOKENS,
    ProtocolTokenError,
    is_websocket_request,
    protocol_token,
    without_token_protocols,
)

TOKEN = BEARER_PROTOCOL_PREFIX + "dG9rZW4"  # "token"
UPGRADE = [("Connection", "upgrade"), ("Upgrade", "websocket")]


def headers(*protocols: str, base: list[tuple[str, str]] | None = None) -> CIMultiDict[str]:
    return CIMultiDict(
        [*(UPGRADE if base is None else base), *(("Sec-WebSocket-Protocol", p) for p in protocols)]
    )


def encoded(raw: bytes) -> str:
    return BEARER_PROTOCOL_PREFIX + base64.urlsafe_b64encode(raw).decode().rstrip("=")


@pytest.mark.parametrize(
    ("base", "expected"),
    [
        (UPGRADE, True),
        ([("Connection", "keep-alive, Upgrade"), ("Upgrade", "WebSocket")], True),
        ([("Connection", "not"), ("Connection", "upgrade"), ("Upgrade", "websocket")], True),
        ([("Connection", "keep-alive"), ("Upgrade", "websocket")], False),
        ([("Connection", "upgrade"), ("Upgrade", "SPDY/3.1")], False),
        ([("Connection", "upgrade"), ("Upgrade", "SPDY/3.1"), ("Upgrade", "websocket")], False),
        ([("Upgrade", "websocket")], False),
    ],
)
def test_only_websocket_upgrades_are_read(base: list[tuple[str, str]], expected: bool) -> None:
    assert is_websocket_request(CIMultiDict(base)) is expected
    assert (protocol_token(headers(TOKEN + ",dummy", base=base)) == "token") is expected


@pytest.mark.parametrize(
    "protocols",
    [
        (TOKEN + ",dummy",),
        (TOKEN, "dummy, dummy2"),
        (" dummy ,  " + TOKEN + "  ",),
    ],
)
def test_the_token_is_found_among_the_other_subprotocols(protocols: tuple[str, ...]) -> None:
    assert protocol_token(headers(*protocols)) == "token"


@pytest.mark.parametrize("protocols", [(), ("",), ("undefined",), (BEARER_PROTOCOL_PREFIX,)])
def test_no_token_means_the_authenticator_abstains(protocols: tuple[str, ...]) -> None:
    assert protocol_token(headers(*protocols)) is None


@pytest.mark.parametrize(
    ("protocols", "message"),
    [
        ((TOKEN + "," + TOKEN + ",dummy",), MULTIPLE_TOKENS),
        ((TOKEN, BEARER_PROTOCOL_PREFIX + "b3RoZXI", "dummy"), MULTIPLE_TOKENS),
        ((BEARER_PROTOCOL_PREFIX + "dG9rZW4=,dummy",), INVALID_ENCODING),  # padded: RawURLEncoding refuses
        ((BEARER_PROTOCOL_PREFIX + "dG9r+W4,dummy",), INVALID_ENCODING),  # standard alphabet
        ((BEARER_PROTOCOL_PREFIX + "dG9rZ,dummy",), INVALID_ENCODING),  # impossible length
        ((encoded(b"\xff\xfe") + ",dummy",), INVALID_TOKEN),  # not UTF-8
        ((TOKEN,), MISSING_SUBPROTOCOL),
    ],
)
def test_unusable_offers_are_errors_in_upstreams_words(protocols: tuple[str, ...], message: str) -> None:
    with pytest.raises(ProtocolTokenError, match=f"^{message}$"):
        protocol_token(headers(*protocols))


def test_url_alphabet_and_utf8_tokens_decode() -> None:
    raw = "ï¿¾tök~en?>>".encode()
    assert "-" in encoded(raw) and "_" in encoded(raw)
    assert protocol_token(headers(encoded(raw) + ",v5.channel.k8s.io")) == raw.decode()


def test_the_token_entry_is_removed_and_the_rest_joined_as_upstream_does() -> None:
    assert without_token_protocols(TOKEN + ", dummy, dummy2") == "dummy,dummy2"
    assert without_token_protocols(TOKEN) is None
    assert (
        without_token_protocols("v5.channel.k8s.io, v4.channel.k8s.io")
        == "v5.channel.k8s.io, v4.channel.k8s.io"
    )
