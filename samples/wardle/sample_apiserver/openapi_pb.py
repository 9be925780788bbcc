"""The OpenAPI v2 document as gnostic protobuf (`application/com.github.proto-openapi.spec.v2@v1.0+protobuf`).

client-go's `OpenAPISchema()` asks only for this encoding, and kubectl up to 1.28 calls it for
`explain` and before every `create`/`apply` with validation: without it they fail with "the server
could not find the requested resource". This encodes the subset of gnostic's `openapi.v2.Document`
(OpenAPIv2.proto) that our document uses; vendor extensions and defaults travel as YAML text in
`Any.yaml`, as gnostic's compiler stores them.
"""

from __future__ import annotations

from typing import Any

import yaml

MEDIA_TYPE = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf"
# What kube-openapi answers with (and also accepts): `@` is not a valid token character for Go's
# mime parser, so the served Content-Type spells it with a dot.
CONTENT_TYPE = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf"

JSON = dict[str, Any]


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _bytes_field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _string(number: int, value: str) -> bytes:
    return _bytes_field(number, value.encode()) if value else b""


def _bool(number: int, value: bool) -> bytes:
    return _varint(number << 3) + b"\x01" if value else b""


def _message(number: int, payload: bytes, *, keep_empty: bool = False) -> bytes:
    return _bytes_field(number, payload) if payload or keep_empty else b""


def _any(value: Any) -> bytes:
    """gnostic `Any`: the value as YAML text in field 2."""
    return _string(2, yaml.safe_dump(value, default_flow_style=False, sort_keys=True))


def _named_any(number: int, name: str, value: Any) -> bytes:
    return _message(number, _string(1, name) + _message(2, _any(value), keep_empty=True), keep_empty=True)


def _extensions(obj: JSON, number: int) -> bytes:
    return b"".join(_named_any(number, k, v) for k, v in obj.items() if k.startswith("x-"))


def schema(obj: JSON) -> bytes:
    out = [
        _string(1, obj.get("$ref", "")),
        _string(2, obj.get("format", "")),
        _string(3, obj.get("title", "")),
        _string(4, obj.get("description", "")),
    ]
    if "default" in obj:
        out.append(_message(5, _any(obj["default"]), keep_empty=True))
    out.append(_bool(16, bool(obj.get("uniqueItems"))))
    out.extend(_string(19, r) for r in obj.get("required", []))
    out.extend(_message(20, _any(e), keep_empty=True) for e in obj.get("enum", []))
    additional = obj.get("additionalProperties")
    if isinstance(additional, dict):
        out.append(_message(21, _message(1, schema(additional), keep_empty=True), keep_empty=True))
    elif isinstance(additional, bool):
        out.append(_message(21, _varint(2 << 3) + (b"\x01" if additional else b"\x00"), keep_empty=True))
    if "type" in obj:
        types = obj["type"] if isinstance(obj["type"], list) else [obj["type"]]
        out.append(_message(22, b"".join(_string(1, t) for t in types), keep_empty=True))
    if "items" in obj:
        items = obj["items"] if isinstance(obj["items"], list) else [obj["items"]]
        out.append(
            _message(23, b"".join(_message(1, schema(i), keep_empty=True) for i in items), keep_empty=True)
        )
    out.extend(_message(24, schema(s), keep_empty=True) for s in obj.get("allOf", []))
    if "properties" in obj:
        named = b"".join(
            _message(1, _string(1, name) + _message(2, schema(prop), keep_empty=True), keep_empty=True)
            for name, prop in obj["properties"].items()
        )
        out.append(_message(25, named, keep_empty=True))
    out.append(_extensions(obj, 31))
    return b"".join(out)


def _parameter(param: JSON) -> bytes:
    if "$ref" in param:
        reference = _string(1, param["$ref"]) + _string(2, param.get("description", ""))
        return _message(2, reference, keep_empty=True)
    if param.get("in") == "body":
        body = (
            _string(1, param.get("description", ""))
            + _string(2, param.get("name", ""))
            + _string(3, "body")
            + _bool(4, bool(param.get("required")))
            + _message(5, schema(param.get("schema", {})), keep_empty=True)
        )
        parameter = _message(1, body, keep_empty=True)
    else:
        location = param.get("in", "query")
        common = (
            _bool(1, bool(param.get("required")))
            + _string(2, location)
            + _string(3, param.get("description", ""))
            + _string(4, param.get("name", ""))
        )
        if location == "path":
            sub = common + _string(5, param.get("type", "")) + _bool(19, bool(param.get("uniqueItems")))
            non_body = _message(4, sub, keep_empty=True)
        else:
            sub = common + _string(6, param.get("type", "")) + _bool(20, bool(param.get("uniqueItems")))
            non_body = _message(3, sub, keep_empty=True)
        parameter = _message(2, non_body, keep_empty=True)
    return _message(1, parameter, keep_empty=True)


def _operation(op: JSON) -> bytes:
    out = [b"".join(_string(1, t) for t in op.get("tags", []))]
    out.append(_string(3, op.get("description", "")))
    out.append(_string(5, op.get("operationId", "")))
    out.extend(_string(6, p) for p in op.get("produces", []))
    out.extend(_string(7, c) for c in op.get("consumes", []))
    out.extend(_message(8, _parameter(p), keep_empty=True) for p in op.get("parameters", []))
    responses = b""
    for code, response in op.get("responses", {}).items():
        body = _string(1, response.get("description", ""))
        if "schema" in response:
            body += _message(2, _message(1, schema(response["schema"]), keep_empty=True), keep_empty=True)
        value = _message(1, body, keep_empty=True)
        responses += _message(1, _string(1, code) + _message(2, value, keep_empty=True), keep_empty=True)
    out.append(_message(9, responses, keep_empty=True))
    out.extend(_string(10, s) for s in op.get("schemes", []))
    out.append(_extensions(op, 13))
    return b"".join(out)


_METHOD_FIELDS = {"get": 2, "put": 3, "post": 4, "delete": 5, "options": 6, "head": 7, "patch": 8}


def _path_item(item: JSON) -> bytes:
    out = []
    for method, number in _METHOD_FIELDS.items():
        if method in item:
            out.append(_message(number, _operation(item[method]), keep_empty=True))
    out.extend(_message(9, _parameter(p), keep_empty=True) for p in item.get("parameters", []))
    return b"".join(out)


def encode_document(doc: JSON) -> bytes:
    """gnostic `openapi.v2.Document` bytes for a swagger 2.0 document."""
    info = doc.get("info", {})
    out = [_string(1, doc.get("swagger", "2.0"))]
    out.append(
        _message(2, _string(1, info.get("title", "")) + _string(2, info.get("version", "")), keep_empty=True)
    )
    paths = b"".join(
        _message(2, _string(1, path) + _message(2, _path_item(item), keep_empty=True), keep_empty=True)
        for path, item in doc.get("paths", {}).items()
    )
    out.append(_message(8, paths, keep_empty=True))
    definitions = b"".join(
        _message(1, _string(1, name) + _message(2, schema(s), keep_empty=True), keep_empty=True)
        for name, s in doc.get("definitions", {}).items()
    )
    out.append(_message(9, definitions, keep_empty=True))
    for requirement in doc.get("security", []):
        named = b"".join(
            _message(
                1,
                _string(1, name) + _message(2, b"".join(_string(1, v) for v in values), keep_empty=True),
                keep_empty=True,
            )
            for name, values in requirement.items()
        )
        out.append(_message(12, named, keep_empty=True))
    security_definitions = b""
    for name, definition in doc.get("securityDefinitions", {}).items():
        api_key = (
            _string(1, definition.get("type", ""))
            + _string(2, definition.get("name", ""))
            + _string(3, definition.get("in", ""))
            + _string(4, definition.get("description", ""))
        )
        item = _message(2, api_key, keep_empty=True)
        security_definitions += _message(
            1, _string(1, name) + _message(2, item, keep_empty=True), keep_empty=True
        )
    if security_definitions:
        out.append(_message(13, security_definitions))
    out.append(_extensions(doc, 16))
    return b"".join(out)
