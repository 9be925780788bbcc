"""An OpenAPI v2 document as gnostic protobuf (`openapi.v2.Document`, OpenAPIv2.proto).

kubectl up to 1.28 asks `/openapi/v2` only for `application/com.github.proto-openapi.spec.v2@v1.0+protobuf`
(client-go `OpenAPISchema()`), before every create/apply with validation and for explain, and fails
without it. kube-openapi produces it with `openapi_v2.ParseDocument(json)` + `proto.Marshal`; this
module writes the same wire format from the JSON value directly, without a protobuf dependency.

It covers every message of OpenAPIv2.proto, as gnostic's compiler fills them: `x-` keys become
`vendor_extension` entries; values of `default`, `example`, `enum` and extensions are `Any`
messages holding YAML text (JSON flow style, which is what yaml.v3 writes for nodes parsed from
JSON); oneofs are chosen as the compiler does (`$ref` -> JsonReference; `in` picks the parameter
kind; `type: file` in a response is a FileSchema). Fields are written in field-number order and
zero values are omitted, as Go's `proto.Marshal` does. Unknown keys are ignored rather than
failing the whole document (gnostic rejects them). The tests read what it writes with gnostic's own
message classes, built from its OpenAPIv2.proto, so every field number is checked against it. The
sample server (samples/wardle) serves its own v2 document with this encoder too.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Callable, Mapping
from typing import Any

MEDIA_TYPE = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf"
# What kube-openapi answers with: Go's mime parser rejects `@`, so the response spells it with a dot.
CONTENT_TYPE = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf"

Encoder = Callable[[Any], bytes]


# --- wire format ------------------------------------------------------------------------------------


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative int64s are ten bytes of two's complement
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _tag(number: int, wire_type: int) -> bytes:
    return _varint(number << 3 | wire_type)


def _message(number: int, payload: bytes) -> bytes:
    """A length-delimited field; written even when empty (the message is present)."""
    return _tag(number, 2) + _varint(len(payload)) + payload


def _string(number: int, value: Any) -> bytes:
    if not isinstance(value, str) or not value:
        return b""
    return _message(number, value.encode())


def _strings(number: int, values: Any) -> bytes:
    if isinstance(values, str):
        values = [values]
    if not isinstance(values, list):
        return b""
    return b"".join(_message(number, v.encode()) for v in values if isinstance(v, str))


def _bool(number: int, value: Any) -> bytes:
    return _tag(number, 0) + b"\x01" if value is True else b""


def _int64(number: int, value: Any) -> bytes:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return b""
    number_value = int(value)
    return _tag(number, 0) + _varint(number_value) if number_value else b""


def _double(number: int, value: Any) -> bytes:
    if isinstance(value, bool) or not isinstance(value, int | float) or value == 0:
        return b""
    return _tag(number, 1) + struct.pack("<d", float(value))


def yaml_text(value: Any) -> str:
    """The YAML gnostic stores in an `Any`: flow style, as yaml.v3 re-emits a node parsed from JSON."""
    return json.dumps(value, separators=(", ", ": "), ensure_ascii=False) + "\n"


def _any(value: Any) -> bytes:
    """`Any{yaml: ...}` (field 2; field 1, a google.protobuf.Any, is never set by the compiler)."""
    return _message(2, yaml_text(value).encode())


def _any_field(number: int, obj: Mapping[str, Any], key: str) -> bytes:
    return _message(number, _any(obj[key])) if key in obj else b""


def _anys(number: int, values: Any) -> bytes:
    if not isinstance(values, list):
        return b""
    return b"".join(_message(number, _any(v)) for v in values)


def _vendor(number: int, obj: Mapping[str, Any]) -> bytes:
    """`repeated NamedAny vendor_extension`: every `x-` key, in document order."""
    return b"".join(
        _message(number, _string(1, key) + _message(2, _any(value)))
        for key, value in obj.items()
        if key.startswith("x-")
    )


def _named(number: int, mapping: Any, encode: Encoder, accept: Callable[[str], bool] | None = None) -> bytes:
    """`repeated Named<T>` (`name` = 1, `value` = 2) from a JSON object, in document order."""
    if not isinstance(mapping, Mapping):
        return b""
    return b"".join(
        _message(number, _string(1, name) + _message(2, encode(value)))
        for name, value in mapping.items()
        if accept is None or accept(name)
    )


_RESPONSE_CODE = re.compile(r"^([0-9]{3})$|^(default)$")


def _is_path(name: str) -> bool:
    return name.startswith("/")


def _is_response_code(name: str) -> bool:
    return _RESPONSE_CODE.match(name) is not None


def _optional(number: int, obj: Mapping[str, Any], key: str, encode: Encoder) -> bytes:
    value = obj.get(key)
    return _message(number, encode(value)) if isinstance(value, Mapping) else b""


def _object(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


# --- messages ---------------------------------------------------------------------------------------


def _external_docs(obj: Any) -> bytes:
    obj = _object(obj)
    return _string(1, obj.get("description")) + _string(2, obj.get("url")) + _vendor(3, obj)


def _xml(obj: Any) -> bytes:
    obj = _object(obj)
    return (
        _string(1, obj.get("name"))
        + _string(2, obj.get("namespace"))
        + _string(3, obj.get("prefix"))
        + _bool(4, obj.get("attribute"))
        + _bool(5, obj.get("wrapped"))
        + _vendor(6, obj)
    )


def schema(obj: Any) -> bytes:
    """`Schema`."""
    obj = _object(obj)
    out = [
        _string(1, obj.get("$ref")),
        _string(2, obj.get("format")),
        _string(3, obj.get("title")),
        _string(4, obj.get("description")),
        _any_field(5, obj, "default"),
        _double(6, obj.get("multipleOf")),
        _double(7, obj.get("maximum")),
        _bool(8, obj.get("exclusiveMaximum")),
        _double(9, obj.get("minimum")),
        _bool(10, obj.get("exclusiveMinimum")),
        _int64(11, obj.get("maxLength")),
        _int64(12, obj.get("minLength")),
        _string(13, obj.get("pattern")),
        _int64(14, obj.get("maxItems")),
        _int64(15, obj.get("minItems")),
        _bool(16, obj.get("uniqueItems")),
        _int64(17, obj.get("maxProperties")),
        _int64(18, obj.get("minProperties")),
        _strings(19, obj.get("required")),
        _anys(20, obj.get("enum")),
    ]
    additional = obj.get("additionalProperties")
    if isinstance(additional, Mapping):
        out.append(_message(21, _message(1, schema(additional))))
    elif isinstance(additional, bool):  # a oneof member: written even when false
        out.append(_message(21, _tag(2, 0) + (b"\x01" if additional else b"\x00")))
    if "type" in obj:
        out.append(_message(22, _strings(1, obj["type"])))
    items = obj.get("items")
    if isinstance(items, Mapping):
        out.append(_message(23, _message(1, schema(items))))
    elif isinstance(items, list):
        out.append(_message(23, b"".join(_message(1, schema(i)) for i in items)))
    all_of = obj.get("allOf")
    if isinstance(all_of, list):
        out.extend(_message(24, schema(s)) for s in all_of)
    if isinstance(obj.get("properties"), Mapping):
        out.append(_message(25, _named(1, obj["properties"], schema)))
    out.append(_string(26, obj.get("discriminator")))
    out.append(_bool(27, obj.get("readOnly")))
    out.append(_optional(28, obj, "xml", _xml))
    out.append(_optional(29, obj, "externalDocs", _external_docs))
    out.append(_any_field(30, obj, "example"))
    out.append(_vendor(31, obj))
    return b"".join(out)


def _file_schema(obj: Mapping[str, Any]) -> bytes:
    return b"".join(
        [
            _string(1, obj.get("format")),
            _string(2, obj.get("title")),
            _string(3, obj.get("description")),
            _any_field(4, obj, "default"),
            _strings(5, obj.get("required")),
            _string(6, obj.get("type")),
            _bool(7, obj.get("readOnly")),
            _optional(8, obj, "externalDocs", _external_docs),
            _any_field(9, obj, "example"),
            _vendor(10, obj),
        ]
    )


# The validation keywords shared by PrimitivesItems, Header and the non-body parameters, from
# `type` on; `start` is the field number of `type` in the message at hand.
def _primitive_fields(obj: Mapping[str, Any], start: int, *, with_description: bool = False) -> list[bytes]:
    n = start
    out = [
        _string(n, obj.get("type")),
        _string(n + 1, obj.get("format")),
        _optional(n + 2, obj, "items", _primitives_items),
        _string(n + 3, obj.get("collectionFormat")),
        _any_field(n + 4, obj, "default"),
        _double(n + 5, obj.get("maximum")),
        _bool(n + 6, obj.get("exclusiveMaximum")),
        _double(n + 7, obj.get("minimum")),
        _bool(n + 8, obj.get("exclusiveMinimum")),
        _int64(n + 9, obj.get("maxLength")),
        _int64(n + 10, obj.get("minLength")),
        _string(n + 11, obj.get("pattern")),
        _int64(n + 12, obj.get("maxItems")),
        _int64(n + 13, obj.get("minItems")),
        _bool(n + 14, obj.get("uniqueItems")),
        _anys(n + 15, obj.get("enum")),
        _double(n + 16, obj.get("multipleOf")),
    ]
    if with_description:
        out.append(_string(n + 17, obj.get("description")))
    out.append(_vendor(n + 17 + (1 if with_description else 0), obj))
    return out


def _primitives_items(obj: Any) -> bytes:
    return b"".join(_primitive_fields(_object(obj), 1))


def _header(obj: Any) -> bytes:
    return b"".join(_primitive_fields(_object(obj), 1, with_description=True))


def _non_body_parameter(obj: Mapping[str, Any]) -> bytes:
    """`NonBodyParameter`: header (1), formData (2), query (3) or path (4) sub-schema."""
    location = obj.get("in")
    head = (
        _bool(1, obj.get("required"))
        + _string(2, location)
        + _string(3, obj.get("description"))
        + _string(4, obj.get("name"))
    )
    if location in ("formData", "query"):
        body = head + _bool(5, obj.get("allowEmptyValue")) + b"".join(_primitive_fields(obj, 6))
        return _message(2 if location == "formData" else 3, body)
    body = head + b"".join(_primitive_fields(obj, 5))
    return _message(1 if location == "header" else 4, body)


def parameter(obj: Any) -> bytes:
    """`Parameter`: a body parameter (1) or a non-body one (2)."""
    obj = _object(obj)
    if obj.get("in") == "body":
        body = (
            _string(1, obj.get("description"))
            + _string(2, obj.get("name"))
            + _string(3, obj.get("in"))
            + _bool(4, obj.get("required"))
            + _optional(5, obj, "schema", schema)
            + _vendor(6, obj)
        )
        return _message(1, body)
    return _message(2, _non_body_parameter(obj))


def _json_reference(obj: Mapping[str, Any]) -> bytes:
    return _string(1, obj.get("$ref")) + _string(2, obj.get("description"))


def _parameters_item(obj: Any) -> bytes:
    obj = _object(obj)
    if "$ref" in obj:
        return _message(2, _json_reference(obj))
    return _message(1, parameter(obj))


def response(obj: Any) -> bytes:
    obj = _object(obj)
    out = [_string(1, obj.get("description"))]
    body = obj.get("schema")
    if isinstance(body, Mapping):
        item = _message(2, _file_schema(body)) if body.get("type") == "file" else _message(1, schema(body))
        out.append(_message(2, item))
    if isinstance(obj.get("headers"), Mapping):
        out.append(_message(3, _named(1, obj["headers"], _header)))
    if isinstance(obj.get("examples"), Mapping):
        examples = b"".join(
            _message(1, _string(1, k) + _message(2, _any(v))) for k, v in obj["examples"].items()
        )
        out.append(_message(4, examples))
    out.append(_vendor(5, obj))
    return b"".join(out)


def _response_value(obj: Any) -> bytes:
    obj = _object(obj)
    if "$ref" in obj:
        return _message(2, _json_reference(obj))
    return _message(1, response(obj))


def _security_requirement(obj: Any) -> bytes:
    return _named(1, obj, lambda scopes: _strings(1, scopes))


def operation(obj: Any) -> bytes:
    obj = _object(obj)
    out = [
        _strings(1, obj.get("tags")),
        _string(2, obj.get("summary")),
        _string(3, obj.get("description")),
        _optional(4, obj, "externalDocs", _external_docs),
        _string(5, obj.get("operationId")),
        _strings(6, obj.get("produces")),
        _strings(7, obj.get("consumes")),
    ]
    params = obj.get("parameters")
    if isinstance(params, list):
        out.extend(_message(8, _parameters_item(p)) for p in params)
    responses = obj.get("responses")
    if isinstance(responses, Mapping):
        out.append(
            _message(9, _named(1, responses, _response_value, _is_response_code) + _vendor(2, responses))
        )
    out.append(_strings(10, obj.get("schemes")))
    out.append(_bool(11, obj.get("deprecated")))
    security = obj.get("security")
    if isinstance(security, list):
        out.extend(_message(12, _security_requirement(s)) for s in security)
    out.append(_vendor(13, obj))
    return b"".join(out)


_METHODS = (("get", 2), ("put", 3), ("post", 4), ("delete", 5), ("options", 6), ("head", 7), ("patch", 8))


def path_item(obj: Any) -> bytes:
    obj = _object(obj)
    out = [_string(1, obj.get("$ref"))]
    out.extend(_optional(number, obj, method, operation) for method, number in _METHODS)
    params = obj.get("parameters")
    if isinstance(params, list):
        out.extend(_message(9, _parameters_item(p)) for p in params)
    out.append(_vendor(10, obj))
    return b"".join(out)


def _scopes(obj: Any) -> bytes:
    return b"".join(
        _message(1, _string(1, k) + _string(2, v)) for k, v in _object(obj).items() if isinstance(v, str)
    )


def _security_scheme(obj: Any) -> bytes:
    """`SecurityDefinitionsItem`, chosen by `type` (and `flow` for OAuth2)."""
    obj = _object(obj)
    kind, flow = obj.get("type"), obj.get("flow")
    common = _string(1, obj.get("type"))
    if kind == "basic":
        return _message(1, common + _string(2, obj.get("description")) + _vendor(3, obj))
    if kind == "apiKey":
        body = (
            common
            + _string(2, obj.get("name"))
            + _string(3, obj.get("in"))
            + _string(4, obj.get("description"))
            + _vendor(5, obj)
        )
        return _message(2, body)
    if kind == "oauth2":
        head = common + _string(2, flow) + _optional(3, obj, "scopes", _scopes)
        if flow == "implicit":
            tail = (
                _string(4, obj.get("authorizationUrl")) + _string(5, obj.get("description")) + _vendor(6, obj)
            )
            return _message(3, head + tail)
        if flow in ("password", "application"):
            tail = _string(4, obj.get("tokenUrl")) + _string(5, obj.get("description")) + _vendor(6, obj)
            return _message(4 if flow == "password" else 5, head + tail)
        tail = (
            _string(4, obj.get("authorizationUrl"))
            + _string(5, obj.get("tokenUrl"))
            + _string(6, obj.get("description"))
            + _vendor(7, obj)
        )
        return _message(6, head + tail)
    return b""


def _info(obj: Any) -> bytes:
    obj = _object(obj)
    contact = obj.get("contact")
    license_ = obj.get("license")
    out = [
        _string(1, obj.get("title")),
        _string(2, obj.get("version")),
        _string(3, obj.get("description")),
        _string(4, obj.get("termsOfService")),
    ]
    if isinstance(contact, Mapping):
        out.append(
            _message(
                5,
                _string(1, contact.get("name"))
                + _string(2, contact.get("url"))
                + _string(3, contact.get("email"))
                + _vendor(4, contact),
            )
        )
    if isinstance(license_, Mapping):
        out.append(
            _message(
                6, _string(1, license_.get("name")) + _string(2, license_.get("url")) + _vendor(3, license_)
            )
        )
    out.append(_vendor(7, obj))
    return b"".join(out)


def _tag_object(obj: Any) -> bytes:
    obj = _object(obj)
    return (
        _string(1, obj.get("name"))
        + _string(2, obj.get("description"))
        + _optional(3, obj, "externalDocs", _external_docs)
        + _vendor(4, obj)
    )


def encode_document(doc: Mapping[str, Any]) -> bytes:
    """gnostic `openapi.v2.Document` bytes for a Swagger 2.0 document (a decoded JSON object)."""
    out = [
        _string(1, doc.get("swagger")),
        _optional(2, doc, "info", _info),
        _string(3, doc.get("host")),
        _string(4, doc.get("basePath")),
        _strings(5, doc.get("schemes")),
        _strings(6, doc.get("consumes")),
        _strings(7, doc.get("produces")),
    ]
    paths = doc.get("paths")
    if isinstance(paths, Mapping):
        out.append(_message(8, _vendor(1, paths) + _named(2, paths, path_item, _is_path)))
    for number, key, encode in (
        (9, "definitions", schema),
        (10, "parameters", parameter),
        (11, "responses", response),
    ):
        if isinstance(doc.get(key), Mapping):
            out.append(_message(number, _named(1, doc[key], encode)))
    security = doc.get("security")
    if isinstance(security, list):
        out.extend(_message(12, _security_requirement(s)) for s in security)
    if isinstance(doc.get("securityDefinitions"), Mapping):
        out.append(_message(13, _named(1, doc["securityDefinitions"], _security_scheme)))
    tags = doc.get("tags")
    if isinstance(tags, list):
        out.extend(_message(14, _tag_object(t)) for t in tags)
    out.append(_optional(15, doc, "externalDocs", _external_docs))
    out.append(_vendor(16, doc))
    return b"".join(out)
