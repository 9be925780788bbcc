"""Authentication as a caller meets it: client certificates, front-proxy headers, anonymous rules."""

from __future__ import annotations

import base64
import datetime as dt
import json
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest

from aggregator.tls.issue import issue_client_cert, load_pair, new_ca, write_pair
from aggregator.web.context import RequestContext
from aggregator.web.responses import json_response
from aggregator.web.routing import Route, RouteKind
from aggregator.web.serverrequest import Response
from aggregator.wire.wsprotocol import (
    BEARER_PROTOCOL_PREFIX,
    INVALID_ENCODING,
    INVALID_TOKEN,
    MISSING_SUBPROTOCOL,
    MULTIPLE_TOKENS,
)
from tests.conftest import StartGateway
from tests.support.contexts import user_of
from tests.support.pki import PKI
from tests.support.polling import until_async

UNAUTHORIZED = (
    b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Unauthorized",'
    b'"reason":"Unauthorized","code":401}\n'
)

WhoAmI = Callable[..., Awaitable[tuple[int, bytes]]]


def logged_reasons(caplog: pytest.LogCaptureFixture) -> str:
    return " | ".join(str(getattr(r, "fields", {}).get("reason", "")) for r in caplog.records)


@pytest.fixture
async def whoami(start_gateway: StartGateway, pki: PKI) -> WhoAmI:
    """A gateway with a `/whoami` route echoing the authenticated user; returns a caller."""
    server = await start_gateway()

    async def echo(ctx: RequestContext) -> Response:
        user = user_of(ctx)
        return json_response(
            ctx,
            {
                "name": user.name,
                "uid": user.uid,
                "groups": list(user.groups),
                "extra": {k: list(v) for k, v in user.extra.items()},
            },
        )

    server.gateway.router.add_exact("/whoami", Route(echo, RouteKind.OWN, "whoami"))

    async def call(
        cert: str | None = None,
        headers: dict[str, str] | list[tuple[str, str]] | None = None,
        path: str = "/whoami",
    ) -> tuple[int, bytes]:
        async with (
            aiohttp.ClientSession() as session,
            session.get(server.url + path, ssl=pki.client_context(cert), headers=headers or {}) as resp,
        ):
            return resp.status, await resp.read()

    return call


async def test_client_certificate_names_user_and_groups(whoami: WhoAmI, pki: PKI) -> None:
    pki.issue_user("alice", "alice", ("devs", "ops"))
    status, body = await whoami("alice")
    assert status == 200
    doc = json.loads(body)
    assert doc["name"] == "alice"
    assert doc["groups"] == ["devs", "ops", "system:authenticated"]
    assert doc["extra"]["authentication.kubernetes.io/credential-id"][0].startswith("X509SHA256=")


async def test_front_proxy_headers_are_trusted_from_the_front_proxy_certificate(whoami: WhoAmI) -> None:
    headers = [
        ("X-Remote-User", "bob"),
        ("X-Remote-Group", "g1"),
        ("X-Remote-Group", "g2"),
        ("X-Remote-Extra-Scopes", "read"),
        ("X-Remote-Extra-Scopes", "write"),
        ("X-Remote-Extra-Example.com%2FTeam", "blue"),
        ("X-Remote-Extra-Bad%zzKey", "raw"),
    ]
    status, body = await whoami("front-proxy-client", headers)
    assert status == 200
    doc = json.loads(body)
    assert doc["name"] == "bob"
    assert doc["groups"] == ["g1", "g2", "system:authenticated"]
    assert doc["extra"] == {"scopes": ["read", "write"], "example.com/team": ["blue"], "bad%zzkey": ["raw"]}


async def test_identity_headers_from_an_ordinary_user_are_ignored(whoami: WhoAmI, pki: PKI) -> None:
    pki.issue_user("carol", "carol")
    status, body = await whoami("carol", {"X-Remote-User": "admin", "X-Remote-Group": "system:masters"})
    assert status == 200
    assert json.loads(body)["name"] == "carol"
    assert "system:masters" not in json.loads(body)["groups"]


async def test_front_proxy_cn_not_in_allowed_names_is_401(
    whoami: WhoAmI, pki: PKI, caplog: pytest.LogCaptureFixture
) -> None:
    pki.issue_user("rogue-proxy", "rogue", ca="front-proxy-ca")
    caplog.set_level(logging.INFO, logger="aggregator.auth.authn")
    status, body = await whoami("rogue-proxy", {"X-Remote-User": "admin"})
    assert (status, body) == (401, UNAUTHORIZED)
    assert "x509: subject with cn=rogue is not in the allowed list" in logged_reasons(caplog)


async def test_front_proxy_certificate_without_username_header_is_401(whoami: WhoAmI) -> None:
    status, body = await whoami("front-proxy-client")
    assert (status, body) == (401, UNAUTHORIZED)


async def test_certificate_from_unknown_ca_is_401(
    whoami: WhoAmI, pki: PKI, caplog: pytest.LogCaptureFixture
) -> None:
    write_pair(pki.dir, "stranger", issue_client_cert(new_ca("elsewhere"), "mallory", ("system:masters",)))
    caplog.set_level(logging.INFO, logger="aggregator.auth.authn")
    assert await whoami("stranger") == (401, UNAUTHORIZED)
    assert "x509: certificate signed by unknown authority" in logged_reasons(caplog)
    # Each authenticator's reason, the front proxy's first (the union authenticator's order).
    reasons = logged_reasons(caplog)
    assert "front-proxy certificate: x509: certificate signed by unknown authority" in reasons
    assert "; client certificate: verifying certificate SN=" in reasons
    assert reasons.index("front-proxy certificate:") < reasons.index("client certificate:")


async def test_expired_certificate_is_401(whoami: WhoAmI, pki: PKI, caplog: pytest.LogCaptureFixture) -> None:
    old = dt.datetime(2020, 1, 1, tzinfo=dt.UTC)
    write_pair(
        pki.dir,
        "expired",
        issue_client_cert(load_pair(pki.dir, "client-ca"), "old-user", not_before=old, days=30),
    )
    caplog.set_level(logging.INFO, logger="aggregator.auth.authn")
    assert await whoami("expired") == (401, UNAUTHORIZED)
    assert "x509: certificate has expired or is not yet valid: current time" in logged_reasons(caplog)
    assert "is after 2020-01-31T00:00:00Z" in logged_reasons(caplog)


async def test_server_certificate_cannot_be_used_as_a_client_certificate(
    whoami: WhoAmI, pki: PKI, tmp_path: Path
) -> None:
    from aggregator.tls.issue import issue_serving_cert

    write_pair(
        pki.dir, "serverish", issue_serving_cert(load_pair(pki.dir, "client-ca"), ["x"], common_name="x")
    )
    assert await whoami("serverish") == (401, UNAUTHORIZED)


async def test_no_credentials_is_401_except_on_health_paths(whoami: WhoAmI) -> None:
    assert await whoami(None) == (401, UNAUTHORIZED)
    status, body = await whoami(None, path="/readyz")
    assert (status, body) == (200, b"ok")


async def test_anonymous_auth_flag_admits_system_anonymous(start_gateway: StartGateway, pki: PKI) -> None:
    server = await start_gateway(anonymous_auth=True)

    async def echo(ctx: RequestContext) -> Response:
        user = user_of(ctx)
        return json_response(ctx, {"name": user.name, "groups": list(user.groups)})

    server.gateway.router.add_exact("/whoami", Route(echo, RouteKind.OWN, "whoami"))
    async with (
        aiohttp.ClientSession() as session,
        session.get(server.url + "/whoami", ssl=pki.client_context(None)) as resp,
    ):
        assert await resp.json() == {"name": "system:anonymous", "groups": ["system:unauthenticated"]}


async def test_unknown_bearer_token_is_401_even_with_anonymous(start_gateway: StartGateway, pki: PKI) -> None:
    server = await start_gateway(anonymous_auth=True)
    async with (
        aiohttp.ClientSession() as session,
        session.get(
            server.url + "/version", ssl=pki.client_context(None), headers={"Authorization": "Bearer nope"}
        ) as resp,
    ):
        assert resp.status == 401
        assert await resp.read() == UNAUTHORIZED


async def test_rotated_client_ca_file_is_picked_up(
    start_gateway: StartGateway, pki: PKI, tmp_path: Path
) -> None:
    ca_file = tmp_path / "client-ca.crt"
    ca_file.write_bytes(Path(pki.path("client-ca.crt")).read_bytes())
    server = await start_gateway(client_ca_file=str(ca_file))
    new = new_ca("next-client-ca")
    write_pair(pki.dir, "next-user", issue_client_cert(new, "dave"))
    async with aiohttp.ClientSession() as session:
        async with session.get(server.url + "/version", ssl=pki.client_context("next-user")) as resp:
            assert resp.status == 401
        ca_file.write_bytes(Path(pki.path("client-ca.crt")).read_bytes() + new.cert_pem)

        async def accepted() -> bool:
            async with session.get(server.url + "/version", ssl=pki.client_context("next-user")) as resp:
                return resp.status == 200

        await until_async(accepted, what="the new client CA in force")


# --- a bearer token offered as a WebSocket subprotocol -------------------------------------------------

WS_SECRET = "ws-s3cr3t-token-0123456789"
WS_UPGRADE = [("Connection", "Upgrade"), ("Upgrade", "websocket"), ("Sec-WebSocket-Version", "13")]


def ws_token(token: str) -> str:
    return BEARER_PROTOCOL_PREFIX + base64.urlsafe_b64encode(token.encode()).decode().rstrip("=")


@pytest.fixture
async def ws_whoami(start_gateway: StartGateway, pki: PKI, tmp_path: Path) -> WhoAmI:
    """A gateway with the token file `WS_SECRET,erin`; calls `/whoami` as a WebSocket upgrade offering
    the given subprotocols. `/whoami` serves no upgrade, so an authenticated caller gets the upgrade
    gate's 400 and an unauthenticated one the authentication gate's 401."""
    tokens = tmp_path / "tokens.csv"
    tokens.write_text(f'{WS_SECRET},erin,uid-e,"devs"\n')
    server = await start_gateway(token_auth_file=str(tokens), anonymous_auth=True, access_log="all")

    async def call(*protocols: str, upgrade: list[tuple[str, str]] = WS_UPGRADE) -> tuple[int, bytes]:
        headers = [*upgrade, ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")]
        headers += [("Sec-WebSocket-Protocol", p) for p in protocols]
        async with (
            aiohttp.ClientSession() as session,
            session.get(server.url + "/version", ssl=pki.client_context(None), headers=headers) as resp,
        ):
            return resp.status, await resp.read()

    return call


async def test_websocket_subprotocol_token_authenticates(
    ws_whoami: WhoAmI, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    status, body = await ws_whoami(ws_token(WS_SECRET) + ", v5.channel.k8s.io")
    # Authenticated, then refused by the upgrade gate: /version never tunnels.
    assert status == 400 and b"upgrade requests are not allowed" in body
    (line,) = [r for r in caplog.records if r.getMessage() == "request"]
    assert getattr(line, "fields", {})["user"] == "erin"
    assert all(WS_SECRET not in r.getMessage() and WS_SECRET not in str(getattr(r, "fields", "")) for r in caplog.records)


@pytest.mark.parametrize(
    ("protocols", "reason"),
    [
        ((ws_token("not-a-known-token") + ",v5.channel.k8s.io",), "invalid bearer token"),
        ((ws_token(WS_SECRET) + "," + ws_token(WS_SECRET) + ",v5",), MULTIPLE_TOKENS),
        ((BEARER_PROTOCOL_PREFIX + "%%%", "v5.channel.k8s.io"), INVALID_ENCODING),
        ((BEARER_PROTOCOL_PREFIX + "__8,v5.channel.k8s.io",), INVALID_TOKEN),
        ((ws_token(WS_SECRET),), MISSING_SUBPROTOCOL),
    ],
)
async def test_unusable_subprotocol_tokens_are_401_even_with_anonymous(
    ws_whoami: WhoAmI, caplog: pytest.LogCaptureFixture, protocols: tuple[str, ...], reason: str
) -> None:
    caplog.set_level(logging.INFO, logger="aggregator.auth.authn")
    assert await ws_whoami(*protocols) == (401, UNAUTHORIZED)
    assert logged_reasons(caplog) == f"websocket protocol token: {reason}"


async def test_subprotocol_tokens_are_read_only_on_websocket_upgrades(
    ws_whoami: WhoAmI, caplog: pytest.LogCaptureFixture
) -> None:
    """Elsewhere the authenticator abstains, as upstream's: here that makes the caller anonymous."""
    caplog.set_level(logging.INFO)
    spdy = [("Connection", "Upgrade"), ("Upgrade", "SPDY/3.1")]
    assert (await ws_whoami(ws_token(WS_SECRET) + ",v5.channel.k8s.io", upgrade=spdy))[0] == 400
    assert (await ws_whoami(ws_token(WS_SECRET) + ",v5.channel.k8s.io", upgrade=[]))[0] == 200
    assert (await ws_whoami(ws_token(WS_SECRET) + ",v5.channel.k8s.io"))[0] == 400
    users = [getattr(r, "fields", {})["user"] for r in caplog.records if r.getMessage() == "request"]
    assert users == ["system:anonymous", "system:anonymous", "erin"]


NO_AUTHN = "NO AUTHENTICATION CONFIGURED"


@pytest.mark.parametrize(
    ("anonymous", "expected_status", "outcome"),
    [
        (False, 401, "every request is refused with 401 Unauthorized, except the health paths"),
        (True, 404, "every caller is system:anonymous (--anonymous-auth)"),
    ],
)
async def test_no_authenticator_at_all_is_one_warning_that_says_what_callers_get(
    start_gateway: StartGateway,
    pki: PKI,
    caplog: pytest.LogCaptureFixture,
    anonymous: bool,
    expected_status: int,
    outcome: str,
) -> None:
    caplog.set_level(logging.WARNING)
    server = await start_gateway(
        client_ca_file=None,
        requestheader_client_ca_file=None,
        requestheader_allowed_names=[],
        anonymous_auth=anonymous,
    )
    warnings = [r.getMessage() for r in caplog.records if NO_AUTHN in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].endswith(f", so {outcome}"), warnings
    async with aiohttp.ClientSession() as session:
        # What the warning says is what a caller with a certificate (now unverifiable) gets.
        async with session.get(server.url + "/api/v1/pods", ssl=pki.client_context()) as resp:
            assert resp.status == expected_status
        async with session.get(server.url + "/readyz", ssl=pki.client_context()) as resp:
            assert resp.status == 200


async def test_any_authenticator_means_no_such_warning(
    start_gateway: StartGateway, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    await start_gateway(requestheader_client_ca_file=None, requestheader_allowed_names=[])
    assert not [r for r in caplog.records if NO_AUTHN in r.getMessage()]
