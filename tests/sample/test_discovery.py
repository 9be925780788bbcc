"""Legacy and aggregated discovery, byte for byte in kube-apiserver's shapes."""

from __future__ import annotations

import hashlib
import json

from tests.sample.conftest import Client

GROUP_VERSIONS = [
    {"groupVersion": "wardle.example.com/v1beta1", "version": "v1beta1"},
    {"groupVersion": "wardle.example.com/v1alpha1", "version": "v1alpha1"},
]
PREFERRED = {"groupVersion": "wardle.example.com/v1beta1", "version": "v1beta1"}
VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
V2 = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
V2BETA1 = "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList"


async def test_legacy_group_list(admin: Client) -> None:
    status, headers, _, raw = await admin.get("/apis")
    assert status == 200
    assert headers["Content-Type"] == "application/json"
    expected = {
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": [{"name": "wardle.example.com", "versions": GROUP_VERSIONS, "preferredVersion": PREFERRED}],
    }
    assert raw == json.dumps(expected, separators=(",", ":")).encode() + b"\n"


async def test_group_and_trailing_slash(admin: Client) -> None:
    for path in ("/apis/wardle.example.com", "/apis/wardle.example.com/"):
        status, _, body, _ = await admin.get(path)
        assert status == 200
        assert body == {
            "kind": "APIGroup",
            "apiVersion": "v1",
            "name": "wardle.example.com",
            "versions": GROUP_VERSIONS,
            "preferredVersion": PREFERRED,
        }
    # /apis/ is legacy only, even when aggregated discovery is asked for
    status, headers, body, _ = await admin.get("/apis/", headers={"Accept": V2 + ",application/json"})
    assert (status, body["kind"], headers["Content-Type"]) == (200, "APIGroupList", "application/json")


async def test_resource_lists(admin: Client) -> None:
    status, _, body, _raw = await admin.get("/apis/wardle.example.com/v1alpha1")
    assert status == 200
    assert list(body) == ["kind", "apiVersion", "groupVersion", "resources"]
    fischers, flunders = body["resources"]
    assert list(fischers) == [
        "name",
        "singularName",
        "namespaced",
        "kind",
        "verbs",
        "shortNames",
        "categories",
        "storageVersionHash",
    ]
    assert (
        fischers["name"] == "fischers" and fischers["namespaced"] is False and fischers["kind"] == "Fischer"
    )
    assert fischers["shortNames"] == ["fi"] and fischers["verbs"] == VERBS
    assert flunders["name"] == "flunders" and flunders["namespaced"] is True and flunders["kind"] == "Flunder"
    assert flunders["singularName"] == "flunder" and flunders["shortNames"] == ["fl"]
    assert flunders["categories"] == ["all", "wardle"]
    # storage version hash = base64(sha256("wardle.example.com/v1alpha1/Flunder")[:8])
    import base64

    assert (
        flunders["storageVersionHash"]
        == base64.b64encode(hashlib.sha256(b"wardle.example.com/v1alpha1/Flunder").digest()[:8]).decode()
    )
    status, _, body, _ = await admin.get("/apis/wardle.example.com/v1beta1")
    assert [r["name"] for r in body["resources"]] == ["flunders"]
    status, _, body, _ = await admin.get("/apis/wardle.example.com/v2")
    assert status == 404 and body["reason"] == "NotFound"


async def test_aggregated_discovery_v2(admin: Client) -> None:
    status, headers, body, _raw = await admin.get(
        "/apis", headers={"Accept": V2 + "," + V2BETA1 + ",application/json"}
    )
    assert status == 200
    assert headers["Content-Type"] == V2
    assert headers["Vary"] == "Accept" and headers["Cache-Control"] == "public"
    assert body["kind"] == "APIGroupDiscoveryList" and body["apiVersion"] == "apidiscovery.k8s.io/v2"
    (group,) = body["items"]
    assert group["metadata"] == {"name": "wardle.example.com"}
    beta, alpha = group["versions"]
    assert list(beta) == ["version", "resources", "freshness"]
    assert (beta["version"], alpha["version"], beta["freshness"]) == ("v1beta1", "v1alpha1", "Current")
    assert beta["resources"] == [
        {
            "resource": "flunders",
            "responseKind": {"group": "", "version": "", "kind": "Flunder"},
            "scope": "Namespaced",
            "singularResource": "flunder",
            "verbs": VERBS,
            "shortNames": ["fl"],
            "categories": ["all", "wardle"],
        }
    ]
    assert [r["resource"] for r in alpha["resources"]] == ["fischers", "flunders"]
    assert alpha["resources"][0]["scope"] == "Cluster"
    # ETag: uppercase hex SHA-512 of the list without kind/apiVersion
    items = json.dumps({"metadata": {}, "items": body["items"]}, separators=(",", ":")).encode()
    assert headers["Etag"] == '"' + hashlib.sha512(items).hexdigest().upper() + '"'
    # plain JSON listed first still gets the aggregated form (discovery restrictions skip it)
    status, headers, _, _ = await admin.get("/apis", headers={"Accept": "application/json, " + V2})
    assert headers["Content-Type"] == V2


async def test_aggregated_discovery_v2beta1_and_304(admin: Client) -> None:
    status, headers, body, _ = await admin.get("/apis", headers={"Accept": V2BETA1})
    assert status == 200
    assert headers["Content-Type"] == V2BETA1
    assert body["apiVersion"] == "apidiscovery.k8s.io/v2beta1"
    etag = headers["Etag"]
    status, headers2, _, raw = await admin.get("/apis", headers={"Accept": V2, "If-None-Match": etag})
    assert (status, raw) == (304, b"")
    assert headers2["Etag"] == etag and headers2["Content-Type"] == V2
    status, _, _, _ = await admin.get("/apis", headers={"Accept": V2, "If-None-Match": "W/" + etag})
    assert status == 200


async def test_not_acceptable_and_yaml(admin: Client) -> None:
    status, headers, body, raw = await admin.get(
        "/apis", headers={"Accept": "application/vnd.kubernetes.protobuf"}
    )
    assert status == 406
    assert (
        body["message"] == "only the following media types are accepted: application/json, application/yaml"
    )
    assert not raw.endswith(b"\n")  # apiserver writes this one indented, without a newline
    status, headers, _, raw = await admin.get(
        "/apis/wardle.example.com", headers={"Accept": "application/yaml"}
    )
    assert status == 200 and headers["Content-Type"] == "application/yaml"
    assert raw.startswith(b"kind: APIGroup\n")


async def test_pretty_for_curl(admin: Client) -> None:
    _, _, _, raw = await admin.get("/apis", headers={"User-Agent": "curl/8.0"})
    assert raw.startswith(b'{\n  "kind": "APIGroupList"')
