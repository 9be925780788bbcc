"""OpenAPI v3 (index + per group-version) and v2 (JSON and gnostic protobuf) as kubectl reads them."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import yaml
from sample_apiserver.openapi import build_v2, build_v3

from aggregator.openapi.gnostic import encode_document
from tests.sample.conftest import Client
from tests.support.gnostic import gnostic_classes, unknown_fields

V3 = "/openapi/v3/apis/wardle.example.com"


async def test_index_points_at_hashed_documents(admin: Client) -> None:
    status, headers, index, _ = await admin.get("/openapi/v3")
    assert status == 200
    assert list(index["paths"]) == ["apis/wardle.example.com/v1alpha1", "apis/wardle.example.com/v1beta1"]
    for path, entry in index["paths"].items():
        url = entry["serverRelativeURL"]
        assert url.startswith(f"/openapi/v3/{path}?hash=")
        status, headers, _doc, raw = await admin.get(url)
        assert status == 200
        expected_hash = hashlib.sha512(raw).hexdigest().upper()
        assert url.endswith(expected_hash)
        assert headers["Etag"] == f'"{expected_hash}"'
        assert headers["Cache-Control"] == "public, immutable" and headers["Expires"]
        status, _, _, raw304 = await admin.get(url, headers={"If-None-Match": headers["Etag"]})
        assert (status, raw304) == (304, b"")


async def test_wrong_hash_redirects_and_no_hash_is_not_immutable(admin: Client) -> None:
    status, headers, _, _ = await admin.request("GET", f"{V3}/v1beta1?hash=OLD", headers={})
    # aiohttp follows the 301 to the current URL
    assert status == 200
    async with admin.session.get(
        admin.url + f"{V3}/v1beta1?hash=OLD", headers=admin.headers, ssl=admin.ssl, allow_redirects=False
    ) as r:
        assert r.status == 301
        assert r.headers["Location"].startswith(f"{V3}/v1beta1?hash=")
    status, headers, _, _ = await admin.get(f"{V3}/v1beta1")
    assert status == 200 and "Cache-Control" not in headers
    status, _, _, _ = await admin.get(f"{V3}/v9")
    assert status == 404


def _schema(doc: dict[str, Any], kind: str, version: str) -> dict[str, Any]:
    for schema in doc["components"]["schemas"].values():
        if {"group": "wardle.example.com", "kind": kind, "version": version} in schema.get(
            "x-kubernetes-group-version-kind", []
        ):
            found: dict[str, Any] = schema
            return found
    raise AssertionError(f"no schema for {kind}")


async def test_v3_documents_have_what_kubectl_needs(admin: Client) -> None:
    _, _, doc, _ = await admin.get(f"{V3}/v1beta1")
    assert doc["openapi"] == "3.0.0"
    flunder = _schema(doc, "Flunder", "v1beta1")
    assert flunder["properties"]["spec"]["allOf"] == [
        {"$ref": "#/components/schemas/com.example.wardle.v1beta1.FlunderSpec"}
    ]
    assert flunder["properties"]["metadata"]["allOf"] == [
        {"$ref": "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}
    ]
    spec = doc["components"]["schemas"]["com.example.wardle.v1beta1.FlunderSpec"]
    assert set(spec["properties"]) == {"flunderReference", "fischerReference", "referenceType"}
    assert all(p["description"] for p in spec["properties"].values())
    # every $ref resolves inside the document
    refs = {m for m in json.dumps(doc).split('"') if m.startswith("#/components/schemas/")}
    assert refs and all(r.removeprefix("#/components/schemas/") in doc["components"]["schemas"] for r in refs)
    # kubectl's queryParamVerifierV3: a PATCH for the GVK listing fieldValidation
    patch = doc["paths"]["/apis/wardle.example.com/v1beta1/namespaces/{namespace}/flunders/{name}"]["patch"]
    assert patch["x-kubernetes-group-version-kind"] == {
        "group": "wardle.example.com",
        "kind": "Flunder",
        "version": "v1beta1",
    }
    assert "fieldValidation" in [p["name"] for p in patch["parameters"]]
    assert set(patch["requestBody"]["content"]) == {
        "application/apply-patch+yaml",
        "application/json-patch+json",
        "application/merge-patch+json",
        "application/strategic-merge-patch+json",
    }
    _, _, alpha, _ = await admin.get(f"{V3}/v1alpha1")
    fischer = _schema(alpha, "Fischer", "v1alpha1")
    assert fischer["properties"]["disallowedFlunders"]["items"]["type"] == "string"
    assert "/apis/wardle.example.com/v1alpha1/fischers/{name}" in alpha["paths"]
    assert set(_schema(alpha, "Flunder", "v1alpha1")["properties"]) == {
        "apiVersion",
        "kind",
        "metadata",
        "spec",
        "status",
    }


async def test_v2_json_and_protobuf(admin: Client) -> None:
    status, headers, doc, raw = await admin.get("/openapi/v2")
    assert status == 200 and headers["Content-Type"] == "application/json"
    assert doc["swagger"] == "2.0"
    assert doc["definitions"]["com.example.wardle.v1beta1.Flunder"]["properties"]["metadata"]["$ref"] == (
        "#/definitions/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
    )
    assert headers["Etag"] == '"' + hashlib.sha512(raw).hexdigest().upper() + '"'
    accept = {"Accept": "application/com.github.proto-openapi.spec.v2@v1.0+protobuf"}
    status, headers, _, pb = await admin.get("/openapi/v2", headers=accept)
    assert status == 200
    assert headers["Content-Type"] == "application/com.github.proto-openapi.spec.v2.v1.0+protobuf"
    assert pb == encode_document(build_v2())
    assert pb.startswith(b"\n\x032.0")  # field 1 (swagger) = "2.0"
    status, _, _, _ = await admin.get("/openapi/v2", headers={"Accept": "text/html"})
    assert status == 406


def test_the_protobuf_document_reads_back_with_gnostics_classes() -> None:
    """gnostic's Document holds the GVK extension where kubectl looks for it (Schema.vendor_extension)."""
    classes = gnostic_classes()
    encoded = encode_document(build_v2())
    # Any: gnostic's classes are built at run time from its .proto, so no stub knows their fields.
    doc: Any = classes["Document"].FromString(encoded)
    assert list(unknown_fields(doc)) == []
    definitions = {entry.name: entry.value for entry in doc.definitions.additional_properties}
    flunder = definitions["com.example.wardle.v1beta1.Flunder"]
    extensions = {entry.name: entry.value for entry in flunder.vendor_extension}
    assert yaml.safe_load(extensions["x-kubernetes-group-version-kind"].yaml) == [
        {"group": "wardle.example.com", "kind": "Flunder", "version": "v1beta1"}
    ]


def test_documents_are_deterministic() -> None:
    assert build_v3("v1beta1") == build_v3("v1beta1")
    assert json.dumps(build_v2()) == json.dumps(build_v2())
