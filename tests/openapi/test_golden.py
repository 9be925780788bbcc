"""The OpenAPI documents the gateway and the sample server build themselves, pinned to the byte.

Both are built in code (`aggregator/openapi/local.py`, `samples/wardle/sample_apiserver/openapi.py`), and what
they serve is hashed into the ETags and `?hash=` URLs kubectl caches under, so an unintended change
in any path, parameter, key order or schema is a change clients see. The other tests check what
kubectl needs from the documents; this one checks that nothing else moved. Digests are kept per
document (the served bytes, key order included), per path item and per schema, so a failure names
what changed.

After an intended change, rewrite the digests: `.venv/bin/python -m tests.openapi.test_golden`.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from sample_apiserver.api import GROUP, VERSIONS
from sample_apiserver.openapi import OpenAPIDocuments, build_v2, build_v3

from aggregator import __version__
from aggregator.openapi.local import build_documents
from aggregator.wire.jsonenc import go_marshal

JSON = dict[str, Any]

GOLDEN = Path(__file__).parent / "golden" / "built-documents.json"
# The gateway's info.version follows the release; the rest of its documents must not.
VERSION_PLACEHOLDER = "v<aggregator.__version__>"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _unversioned(doc: JSON) -> JSON:
    assert doc["info"]["version"] == f"v{__version__}"
    return {**doc, "info": {**doc["info"], "version": VERSION_PLACEHOLDER}}  # keeps key order


def _digests(doc: JSON, served: bytes) -> JSON:
    schemas = doc["components"]["schemas"] if "components" in doc else doc["definitions"]
    return {
        "served": _sha256(served),
        "paths": {path: _sha256(go_marshal(item)) for path, item in doc["paths"].items()},
        "schemas": {name: _sha256(go_marshal(schema)) for name, schema in schemas.items()},
    }


def current() -> JSON:
    """Digests of every document as built now."""
    v3, v2 = (_unversioned(doc) for doc in build_documents())
    out: JSON = {
        "gateway v3 apiregistration.k8s.io/v1": _digests(v3, go_marshal(v3)),
        "gateway v2": _digests(v2, go_marshal(v2)),
    }
    served = OpenAPIDocuments()
    for version in VERSIONS:
        out[f"sample v3 {GROUP}/{version}"] = _digests(
            build_v3(version), served.v3[f"apis/{GROUP}/{version}"]
        )
    out["sample v2"] = _digests(build_v2(), served.v2)
    out["sample v2 protobuf"] = _sha256(served.v2_protobuf)
    out["sample v3 index"] = _sha256(served.index)
    return out


def test_built_documents_are_unchanged() -> None:
    golden: JSON = json.loads(GOLDEN.read_text())
    now = current()
    assert list(now) == list(golden)
    for name, digests in now.items():
        assert digests == golden[name], f"{name} changed"


if __name__ == "__main__":
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(json.dumps(current(), indent=1) + "\n")
    print(f"wrote {GOLDEN}")
