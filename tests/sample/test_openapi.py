"""OpenAPI v3 (index + per group-version) and v2 (JSON and gnostic protobuf) as kubectl reads them."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from sample_apiserver.openapi import build_v2, build_v3
from sample_apiserver.openapi_pb import encode_document

from tests.sample.conftest import Client

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
            return schema  # type: ignore[no-any-return]
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


def test_protobuf_fields_round_trip() -> None:
    """Decode our encoding generically and find the GVK extension where gnostic keeps it."""

    def fields(data: bytes) -> list[tuple[int, Any]]:
        out, i = [], 0
        while i < len(data):
            key, i = _varint(data, i)
            number, wire = key >> 3, key & 7
            if wire == 0:
                value, i = _varint(data, i)
            else:
                assert wire == 2
                length, i = _varint(data, i)
                value, i = data[i : i + length], i + length
            out.append((number, value))
        return out

    doc = build_v2()
    top = fields(encode_document(doc))
    definitions = next(v for n, v in top if n == 9)
    named = {fields(v)[0][1].decode(): fields(v)[1][1] for _, v in fields(definitions)}
    flunder = fields(named["com.example.wardle.v1beta1.Flunder"])
    extension = next(v for n, v in flunder if n == 31)
    name, any_value = fields(extension)
    assert name == (1, b"x-kubernetes-group-version-kind")
    yaml_text = fields(any_value[1])[0][1].decode()
    assert "kind: Flunder" in yaml_text and "group: wardle.example.com" in yaml_text


def _varint(data: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, i


def test_documents_are_deterministic() -> None:
    assert build_v3("v1beta1") == build_v3("v1beta1")
    assert json.dumps(build_v2()) == json.dumps(build_v2())
