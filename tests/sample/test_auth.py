"""Only the front proxy is trusted; the user comes from its headers; a static policy authorizes."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

import pytest
from sample_apiserver import SampleServer

from aggregator.tls.issue import issue_client_cert, new_ca, write_pair
from tests.sample.conftest import MakeClient
from tests.support.pki import PKI

UNAUTHORIZED = {
    "kind": "Status",
    "apiVersion": "v1",
    "metadata": {},
    "status": "Failure",
    "message": "Unauthorized",
    "reason": "Unauthorized",
    "code": 401,
}
FLUNDERS = "/apis/wardle.example.com/v1beta1/namespaces/default/flunders"


@pytest.mark.parametrize("path", ["/apis", FLUNDERS, "/openapi/v3", "/version", "/nothing-here"])
async def test_request_without_client_certificate_is_401(
    sample: SampleServer, make_client: MakeClient, path: str
) -> None:
    status, headers, body, _ = await make_client(sample, cert=None).get(path)
    assert status == 401
    assert body == UNAUTHORIZED
    assert headers["Content-Type"] == "application/json"


async def test_certificate_from_another_ca_is_401(
    sample: SampleServer, make_client: MakeClient, pki: PKI, tmp_path: Path
) -> None:
    """A user certificate signed by the client CA (not the front-proxy CA) cannot assert identities."""
    status, _, body, _ = await make_client(sample, cert="admin").get(FLUNDERS)
    assert (status, body) == (401, UNAUTHORIZED)
    write_pair(pki.dir, "stranger", issue_client_cert(new_ca("stranger-ca"), "front-proxy-client"))
    status, _, body, _ = await make_client(sample, cert="stranger").get(FLUNDERS)
    assert (status, body) == (401, UNAUTHORIZED)


async def test_front_proxy_cn_must_be_allowed(
    sample: SampleServer, make_client: MakeClient, pki: PKI
) -> None:
    pki.issue_user("other-proxy", "other-proxy", ca="front-proxy-ca")
    status, _, body, _ = await make_client(sample, cert="other-proxy").get(FLUNDERS)
    assert (status, body) == (401, UNAUTHORIZED)


async def test_empty_allowed_names_accept_any_cn_from_the_front_proxy_ca(
    start_sample: Any, make_client: MakeClient, pki: PKI
) -> None:
    server = await start_sample(requestheader_allowed_names=[])
    pki.issue_user("other-proxy", "other-proxy", ca="front-proxy-ca")
    status, _, _, _ = await make_client(server, cert="other-proxy").get(FLUNDERS)
    assert status == 200


async def test_missing_user_header_is_401(sample: SampleServer, make_client: MakeClient) -> None:
    client = make_client(sample, headers={"X-Remote-Group": "system:masters"})
    status, _, body, _ = await client.get(FLUNDERS)
    assert (status, body) == (401, UNAUTHORIZED)


async def test_health_probes_need_no_certificate(sample: SampleServer, make_client: MakeClient) -> None:
    for path in ("/healthz", "/livez", "/readyz"):
        status, _, _, raw = await make_client(sample, cert=None).get(path)
        assert (status, raw) == (200, b"ok")


async def test_user_without_rights_gets_upstreams_403(sample: SampleServer, make_client: MakeClient) -> None:
    bob = make_client(sample, headers={"X-Remote-User": "bob", "X-Remote-Group": "devs"})
    status, _, body, _ = await bob.get(FLUNDERS)
    assert status == 403
    assert body == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'flunders.wardle.example.com is forbidden: User "bob" cannot list resource "flunders" in '
        'API group "wardle.example.com" in the namespace "default"',
        "reason": "Forbidden",
        "details": {"group": "wardle.example.com", "kind": "flunders"},
        "code": 403,
    }
    status, _, body, _ = await bob.request("DELETE", "/apis/wardle.example.com/v1alpha1/fischers/fred")
    assert status == 403
    assert body["message"] == (
        'fischers.wardle.example.com "fred" is forbidden: User "bob" cannot delete resource "fischers" in '
        'API group "wardle.example.com" at the cluster scope'
    )
    assert body["details"] == {"name": "fred", "group": "wardle.example.com", "kind": "fischers"}


async def test_any_authenticated_user_may_read_discovery_and_openapi(
    sample: SampleServer, make_client: MakeClient
) -> None:
    bob = make_client(sample, headers={"X-Remote-User": "bob"})
    for path in (
        "/apis",
        "/apis/wardle.example.com",
        "/apis/wardle.example.com/v1alpha1",
        "/openapi/v3",
        "/openapi/v2",
        "/version",
    ):
        status, _, _, _ = await bob.get(path)
        assert status == 200, path
    status, _, body, _ = await bob.get("/metrics")
    assert status == 403
    assert body["message"] == 'forbidden: User "bob" cannot get path "/metrics"'
    assert body["details"] == {}


async def test_allowed_users_and_groups_flags(start_sample: Any, make_client: MakeClient) -> None:
    server = await start_sample(authorization_allow_users=["carol"], authorization_allow_groups=["wardens"])
    carol = make_client(server, headers={"X-Remote-User": "carol"})
    warden = make_client(server, headers={"X-Remote-User": "dave", "X-Remote-Group": "wardens"})
    admin = make_client(server)  # system:masters is no longer enough
    assert (await carol.get(FLUNDERS))[0] == 200
    assert (await warden.get(FLUNDERS))[0] == 200
    assert (await admin.get(FLUNDERS))[0] == 403


async def test_second_user_header_and_group_headers(start_sample: Any, make_client: MakeClient) -> None:
    """Configured header names are read case-insensitively; the first non-empty user header wins."""
    server = await start_sample(
        requestheader_username_headers=["X-Proxy-User", "X-Remote-User"],
        requestheader_group_headers=["X-Proxy-Group"],
    )
    client = make_client(
        server, headers={"x-proxy-user": "", "X-Remote-User": "eve", "x-proxy-group": "system:masters"}
    )
    assert (await client.get(FLUNDERS))[0] == 200
    client = make_client(server, headers={"X-Remote-User": "eve", "X-Remote-Group": "system:masters"})
    assert (await client.get(FLUNDERS))[0] == 403


async def test_front_proxy_ca_file_is_reloaded(
    start_sample: Any, make_client: MakeClient, pki: PKI, tmp_path: Path
) -> None:
    """Rotating the front-proxy CA file takes effect without a restart."""
    import shutil

    ca_file = tmp_path / "front-proxy-ca.crt"
    shutil.copy(pki.path("front-proxy-ca.crt"), ca_file)
    server = await start_sample(requestheader_client_ca_file=str(ca_file))
    client = make_client(server)
    assert (await client.get(FLUNDERS))[0] == 200
    other = new_ca("other-front-proxy-ca")
    ca_file.write_bytes(other.cert_pem)
    server.api.front_proxy_ca.reload()
    assert (await client.get(FLUNDERS))[0] == 401


class _Transport:
    def __init__(self, der: bytes) -> None:
        self.der = der

    def get_extra_info(self, name: str) -> object:
        return _SSLObject(self.der) if name == "ssl_object" else None


class _SSLObject(ssl.SSLObject):
    def __init__(self, der: bytes) -> None:  # no real TLS state needed for this check
        self.der = der

    def getpeercert(self, binary_form: bool = False) -> Any:
        return self.der


def test_identity_from_headers_follows_requestheader_rules(pki: PKI) -> None:
    """Groups from every group header value, extras unescaped and lower-cased, system:authenticated added."""
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import Encoding
    from multidict import CIMultiDict, CIMultiDictProxy
    from sample_apiserver.auth import FrontProxyAuthenticator

    from aggregator.tls.verify import CAFile

    der = x509.load_pem_x509_certificate(Path(pki.path("front-proxy-client.crt")).read_bytes()).public_bytes(
        Encoding.DER
    )
    headers = CIMultiDict(
        [
            ("X-Remote-User", "alice"),
            ("X-Remote-Group", "devs"),
            ("X-Remote-Group", ""),
            ("X-Remote-Group", "ops"),
            ("X-Remote-Extra-Scopes", "a"),
            ("x-remote-extra-scopes", "b"),
            ("X-Remote-Extra-Example.com%2Fteam", "blue"),
        ]
    )

    class Request:
        transport = _Transport(der)

    request: Any = Request()
    request.headers = CIMultiDictProxy(headers)
    authenticator = FrontProxyAuthenticator(CAFile(pki.path("front-proxy-ca.crt")), ["front-proxy-client"])
    user = authenticator.authenticate(request)
    assert user.name == "alice"
    assert user.groups == ("devs", "ops", "system:authenticated")
    assert dict(user.extra) == {"scopes": ("a", "b"), "example.com/team": ("blue",)}
