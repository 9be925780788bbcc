"""gnostic's own `openapi.v2` message classes, to read the gateway's protobuf OpenAPI v2 with.

The encoder (`aggregator/openapi/gnostic.py`) writes gnostic's wire format by hand, field number
by field number. Tests decode what it writes with classes built from gnostic's OpenAPIv2.proto
(Debian's golang-github-googleapis-gnostic-dev, which brings protoc along), so every field number
is checked against gnostic's schema rather than against a second copy of the encoder's beliefs.
The `protobuf` package (a test dependency) builds the classes from protoc's descriptor set.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import descriptor_pb2, message_factory
from google.protobuf.message import Message
from google.protobuf.unknown_fields import UnknownFieldSet

# Where Debian installs gnostic's sources (`dpkg -L golang-github-googleapis-gnostic-dev`).
GNOSTIC_SOURCES = Path("/usr/share/gocode/src/github.com/googleapis/gnostic")
PROTO = "openapiv2/OpenAPIv2.proto"
# google/protobuf/any.proto, which OpenAPIv2.proto imports (Debian's libprotobuf-dev).
PROTOBUF_INCLUDE = Path("/usr/include")
MISSING = (
    "gnostic's OpenAPIv2.proto and protoc are not installed: apt-get install "
    "golang-github-googleapis-gnostic-dev (.ci/run does)"
)


def gnostic_classes() -> dict[str, type[Message]]:
    """`openapi.v2.<Message>` classes by short name (`Document`, `Schema`, ...), or a skip."""
    protoc = shutil.which("protoc")
    if protoc is None or not (GNOSTIC_SOURCES / PROTO).is_file():
        pytest.skip(MISSING)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "openapiv2.pb"
        subprocess.run(
            [
                protoc,
                f"-I{GNOSTIC_SOURCES}",
                f"-I{PROTOBUF_INCLUDE}",
                "--include_imports",
                f"--descriptor_set_out={out}",
                PROTO,
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file
    classes = message_factory.GetMessages(files)
    prefix = "openapi.v2."
    return {name[len(prefix) :]: cls for name, cls in classes.items() if name.startswith(prefix)}


def unknown_fields(message: Message, where: str = "") -> Iterator[str]:
    """Where `message` (recursively) holds fields its schema does not know: a wrong field number
    or wire type in the encoder shows up here."""
    unknown = UnknownFieldSet(message)  # indexable, not iterable (its type stub)
    for i in range(len(unknown)):
        yield f"{where or message.DESCRIPTOR.name}: unknown field {unknown[i].field_number}"
    for descriptor, value in message.ListFields():
        if descriptor.message_type is None:
            continue
        values: list[Any] = list(value) if descriptor.is_repeated else [value]
        for i, child in enumerate(values):
            yield from unknown_fields(child, f"{where or message.DESCRIPTOR.name}.{descriptor.name}[{i}]")
