"""Reading Kubernetes protobuf: the `k8s\\x00` envelope and protobuf wire-format fields.

kubectl's typed clients send built-in kinds as `application/vnd.kubernetes.protobuf`
(`kubectl auth can-i` posts its SelfSubjectAccessReview that way): the magic `k8s\\x00`, then a
`runtime.Unknown` message (`typeMeta` = 1 with `apiVersion` = 1 and `kind` = 2, `raw` = 2 holding
the object's own message). Only decoding is needed, of messages whose fields the caller names.
"""

from __future__ import annotations

from collections.abc import Iterator

MAGIC = b"k8s\x00"
MEDIA_TYPE = "application/vnd.kubernetes.protobuf"

VARINT, FIXED64, BYTES, FIXED32 = 0, 1, 2, 5


class ProtobufError(ValueError):
    """Bytes that are not the protobuf they claim to be."""


def _varint(data: bytes, offset: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if offset >= len(data) or shift > 63:
            raise ProtobufError("truncated varint")
        byte = data[offset]
        offset += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, offset
        shift += 7


def fields(data: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) in order: an int for varints and fixed widths, the bytes
    of a length-delimited field (a string, bytes, or an embedded message)."""
    offset = 0
    while offset < len(data):
        key, offset = _varint(data, offset)
        number, wire = key >> 3, key & 7
        value: int | bytes
        if wire == VARINT:
            value, offset = _varint(data, offset)
        elif wire in (FIXED64, FIXED32):
            width = 8 if wire == FIXED64 else 4
            if offset + width > len(data):
                raise ProtobufError("truncated fixed-width field")
            value, offset = int.from_bytes(data[offset : offset + width], "little"), offset + width
        elif wire == BYTES:
            length, offset = _varint(data, offset)
            if offset + length > len(data):
                raise ProtobufError("truncated length-delimited field")
            value, offset = data[offset : offset + length], offset + length
        else:
            raise ProtobufError(f"unsupported wire type {wire}")
        yield number, wire, value


def messages(data: bytes) -> dict[int, list[bytes]]:
    """The length-delimited fields of `data` by number (repeated ones in order)."""
    out: dict[int, list[bytes]] = {}
    for number, wire, value in fields(data):
        if wire == BYTES:
            assert isinstance(value, bytes)
            out.setdefault(number, []).append(value)
    return out


def strings(data: bytes, names: dict[int, str]) -> dict[str, str]:
    """The named string fields of a message (the last value wins, as protobuf merges)."""
    out: dict[str, str] = {}
    for number, values in messages(data).items():
        if number in names:
            try:
                out[names[number]] = values[-1].decode("utf-8")
            except UnicodeDecodeError as err:
                raise ProtobufError(f"field {names[number]} is not UTF-8") from err
    return out


def unwrap(body: bytes) -> tuple[str, str, bytes]:
    """(apiVersion, kind, the object's message) of a Kubernetes protobuf body."""
    if not body.startswith(MAGIC):
        raise ProtobufError("the body does not start with the Kubernetes protobuf prefix")
    unknown = messages(body[len(MAGIC) :])
    type_meta = strings(unknown.get(1, [b""])[-1], {1: "apiVersion", 2: "kind"})
    return type_meta.get("apiVersion", ""), type_meta.get("kind", ""), unknown.get(2, [b""])[-1]
