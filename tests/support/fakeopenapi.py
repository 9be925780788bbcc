"""OpenAPI v3 (and v2) served exactly as kube-openapi's handlers serve it, for the fakes.

`k8s.io/kube-openapi/pkg/handler3/handler.go`:
- `GET /openapi/v3` (`HandleDiscovery`): `{"paths":{"<gv>":{"serverRelativeURL":
  "/openapi/v3/<gv>?hash=<H>"}}}` (keys sorted, as Go marshals a map), `H` the upper-case hex
  SHA-512 of the group-version's JSON (`computeETag`); `Etag` the quoted SHA-512 of the index,
  `Content-Type: application/json`, served by `http.ServeContent` (304 on `If-None-Match`).
- `GET /openapi/v3/<gv>` (`HandleGroupVersion`): `Vary: Accept`, `Content-Type`, `Etag: "<H>"`;
  a `?hash=` other than `H` is a **301 to `/openapi/v3/<gv>?hash=<H>`** with no body (Content-Type
  was already set, so `http.Redirect` writes none); the current hash adds `Cache-Control: public,
  immutable` and `Expires` a year ahead; no hash keeps the chain's `Cache-Control: no-cache,
  private` (`filters.WithCacheControl`). Accept without JSON (or `*`) is a 406 here: kube-openapi
  would also serve protobuf, which no caller of these fakes asks for.

`KubeOpenAPI` puts that on the fake kube-apiserver, with the knob that makes it behave like a
kube-apiserver that is still settling: `settle(n)` changes every document right after each of the
next `n` index answers, so a client that read that index asks for hashes that are already stale.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from email.utils import formatdate
from typing import Any
from urllib.parse import urlencode

from aiohttp import web

from tests.support.fakekube import FakeKube, status_response

JSON = dict[str, Any]
V3 = "/openapi/v3"
ONE_YEAR = 365 * 24 * 3600
CHAIN_CACHE_CONTROL = "no-cache, private"  # kube-apiserver's WithCacheControl default


def compact(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


def etag_of(body: bytes) -> str:
    """`computeETag`: upper-case hex SHA-512."""
    return hashlib.sha512(body).hexdigest().upper()


def server_relative_url(key: str, body: bytes) -> str:
    """`constructServerRelativeURL`."""
    return f"{V3}/{key}?{urlencode({'hash': etag_of(body)})}"


def _not_modified(request: web.Request, etag: str) -> bool:
    sent = request.headers.get("If-None-Match", "")
    candidates = {c.strip().removeprefix("W/") for c in sent.split(",") if c.strip()}
    return "*" in candidates or etag in candidates


def _accepts_json(request: web.Request) -> bool:
    for clause in (request.headers.get("Accept", "") or "*/*").split(","):
        media = clause.split(";")[0].strip()
        kind, _, subtype = media.partition("/")
        if kind in ("application", "*") and subtype in ("json", "*"):
            return True
    return False


def index_response(request: web.Request, paths: dict[str, str]) -> web.Response:
    """`HandleDiscovery` for `paths` (key -> serverRelativeURL)."""
    body = json.dumps(
        {"paths": {k: {"serverRelativeURL": v} for k, v in sorted(paths.items())}}, separators=(",", ":")
    ).encode()
    etag = f'"{etag_of(body)}"'
    headers = {"Etag": etag, "Cache-Control": CHAIN_CACHE_CONTROL, "Accept-Ranges": "bytes"}
    if _not_modified(request, etag):
        return web.Response(status=304, headers=headers)
    headers["Last-Modified"] = formatdate(usegmt=True)
    return web.Response(body=body, headers={**headers, "Content-Type": "application/json"})


def group_version_response(request: web.Request, key: str, body: bytes, last_modified: float) -> web.Response:
    """`HandleGroupVersion` for one document."""
    headers = {"Vary": "Accept", "Cache-Control": CHAIN_CACHE_CONTROL}
    if not _accepts_json(request):
        return web.Response(status=406, headers=headers)
    etag = etag_of(body)
    headers.update({"Content-Type": "application/json", "Etag": f'"{etag}"'})
    requested = request.query.get("hash", "")
    if requested:
        if requested != etag:
            headers["Location"] = f"{V3}/{key}?{urlencode({'hash': etag})}"
            return web.Response(status=301, headers=headers)
        headers["Cache-Control"] = "public, immutable"
        headers["Expires"] = time.strftime("%a, %d %b %Y %H:%M:%S UTC", time.gmtime(time.time() + ONE_YEAR))
    if _not_modified(request, f'"{etag}"'):
        for name in ("Content-Type",):
            headers.pop(name)
        return web.Response(status=304, headers=headers)
    headers["Last-Modified"] = formatdate(last_modified, usegmt=True)
    headers["Accept-Ranges"] = "bytes"
    return web.Response(body=body, headers=headers)


@dataclass(frozen=True)
class Answered:
    """One OpenAPI answer of the fake: the path, the `?hash=` asked for, the status given."""

    path: str
    hash: str
    status: int


@dataclass
class KubeOpenAPI:
    """kube-apiserver's `/openapi/v3`, `/openapi/v3/<gv>` and `/openapi/v2` on a FakeKube.

    `documents` maps `apis/<g>/<v>` (or `api/v1`) to a v3 document; `v2` is the v2 document (None:
    404). Change them with `set_document()`. `answers` records every answer in order.
    """

    fake: FakeKube
    documents: dict[str, JSON] = field(default_factory=dict)
    v2: JSON | None = None
    settling: int = 0
    failing: int = 0  # index answers still to fail with a 503 (a kube-apiserver still starting)
    revision: int = 0
    answers: list[Answered] = field(default_factory=list)
    _modified: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.fake.add_route("GET", V3, self._index)
        self.fake.add_route("GET", "/openapi/v2", self._v2)
        for key in list(self.documents):
            self.set_document(key, self.documents[key])

    # --- knobs -----------------------------------------------------------------------------------

    def set_document(self, key: str, doc: JSON) -> None:
        self.documents[key] = doc
        self._modified[key] = time.time()
        self.fake.add_route("GET", f"{V3}/{key}", self._group_version)

    def settle(self, index_reads: int) -> None:
        """After each of the next `index_reads` index answers, every document changes (a new hash)."""
        self.settling = index_reads

    def fail(self, index_reads: int) -> None:
        """The next `index_reads` index requests get a 503 Status."""
        self.failing = index_reads

    def body(self, key: str) -> bytes:
        return compact(self.documents[key])

    def hash(self, key: str) -> str:
        return etag_of(self.body(key))

    def statuses(self, path: str) -> list[int]:
        return [a.status for a in self.answers if a.path == path]

    # --- handlers ----------------------------------------------------------------------------------

    def _record(self, request: web.Request, response: web.Response) -> web.Response:
        self.answers.append(Answered(request.path, request.query.get("hash", ""), response.status))
        return response

    async def _index(self, request: web.Request) -> web.Response:
        if self.failing > 0:
            self.failing -= 1
            return self._record(request, status_response(503, "ServiceUnavailable", "not ready yet"))
        response = index_response(request, {k: server_relative_url(k, self.body(k)) for k in self.documents})
        if self.settling > 0:
            self.settling -= 1
            self._move_every_document()
        return self._record(request, response)

    async def _group_version(self, request: web.Request) -> web.Response:
        key = request.path.removeprefix(V3 + "/")
        if key not in self.documents:
            return self._record(request, web.Response(status=404))
        return self._record(
            request, group_version_response(request, key, self.body(key), self._modified[key])
        )

    async def _v2(self, request: web.Request) -> web.Response:
        if self.v2 is None:
            return self._record(request, web.Response(status=404, text="404 page not found"))
        body = compact(self.v2)
        etag = f'"{etag_of(body)}"'
        if _not_modified(request, etag):
            return self._record(request, web.Response(status=304, headers={"Etag": etag}))
        return self._record(
            request, web.Response(body=body, headers={"Etag": etag, "Content-Type": "application/json"})
        )

    def _move_every_document(self) -> None:
        """What a settling kube-apiserver does to its documents: new content, so new hashes."""
        self.revision += 1
        for key, doc in self.documents.items():
            info = dict(doc.get("info") or {})
            info["x-fake-revision"] = self.revision
            self.documents[key] = {**doc, "info": info}
            self._modified[key] = time.time()
