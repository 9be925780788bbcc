"""Where OpenAPI documents come from: one extension server (a Service), or kube-apiserver.

A source refresh downloads, in the background:
- `/openapi/v3`, then each wanted group-version's document, only when its `?hash=` changed (or
  with `If-None-Match` when the server gives no hash);
- `/openapi/v2` as JSON with `If-None-Match` (upstream's downloader asks the same way).

Redirects are never followed. One is understood: kube-openapi answers a group-version request whose
`?hash=` is stale with a redirect to the same path and the current hash (`handler3`
`HandleGroupVersion`: 301, `Location: /openapi/v3/<gv>?hash=<H>`). The hash moves while a server
settles (kube-apiserver right after its start), so that answer means "the index you read is old":
the refresh reads the index again at once, up to `INDEX_READS` times, and only a server whose
hashes never hold still fails the refresh. Any other redirect (another path, another host, another
query) is refused as an error. One document that fails does not hold back the others: they are
downloaded and published, the failed one keeps its last good copy, and the refresh counts as failed
so the scheduler retries it.

A 404 means "not published": the source's documents are dropped and the refresh counts as not
successful, so the scheduler retries with backoff (upstream never retries a 404 until the
APIService changes: a backend that comes up without OpenAPI stays invisible to kubectl). A server
with v2 but no `/openapi/v3` is a healthy legacy server: its group-versions are served from the v2
document converted (`convert.py`), as kube-aggregator does. Any other failure keeps the last good
documents. Each transition is logged once; repeats are debug lines. A backend that cannot be
reached at all (`BackendError`) is the availability checker's to report: that failure and its
recovery are debug lines here.

Backends are asked as the gateway's own identity (system:kube-aggregator, system:masters), like
the discovery fetcher; upstream uses `system:aggregator` without groups, which extension servers
that authorize by group (our sample, many operators) refuse.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import parse_qs, urlsplit

from aggregator.backends.errors import BackendError
from aggregator.openapi.convert import group_version_document
from aggregator.openapi.documents import Document
from aggregator.openapi.metrics import OpenAPIMetrics
from aggregator.util.logs import fields
from aggregator.web.metrics import Children
from aggregator.wire.jsonenc import go_marshal

if TYPE_CHECKING:
    from prometheus_client import Counter

log = logging.getLogger(__name__)

JSON = dict[str, Any]
V3_ROOT = "/openapi/v3"
V2_PATH = "/openapi/v2"
ACCEPT_JSON = {"Accept": "application/json"}
REDIRECTS = frozenset({301, 302, 303, 307, 308})
# Reads of `/openapi/v3` in one refresh while documents answer "moved to a new hash": the first, and
# two re-reads (a settling kube-apiserver moves a hash once or twice, not on every read).
INDEX_READS = 3


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    headers: Mapping[str, str]
    body: bytes


class Getter(Protocol):
    """One GET against a source; raises (any Exception) when the source cannot be reached."""

    async def __call__(self, path: str, query: Mapping[str, str], headers: Mapping[str, str]) -> Answer: ...


class NotPublished(Exception):
    """The source answered 404: it publishes no such document."""


class SourceError(Exception):
    """The source answered, but not with a usable document."""


class HashMoved(Exception):
    """A group-version document answered with kube-openapi's redirect to its current `?hash=`."""


def _excerpt(body: bytes, limit: int = 300) -> str:
    return body[:limit].decode("utf-8", "replace").strip()


def _refused_redirect(answer: Answer, what: str) -> SourceError:
    location = answer.headers.get("Location", "")
    return SourceError(
        f"{what}: HTTP {answer.status}: redirect to {location[:200]!r} refused (never followed)"
    )


def _checked(answer: Answer, what: str) -> Answer:
    if answer.status == 404:
        raise NotPublished(f"{what}: 404 Not Found")
    if answer.status in REDIRECTS:
        raise _refused_redirect(answer, what)
    if answer.status not in (200, 304):
        raise SourceError(f"{what}: HTTP {answer.status}: {_excerpt(answer.body)}")
    return answer


def moved_hash(answer: Answer, path: str) -> str | None:
    """The new hash when `answer` is kube-openapi's stale-hash redirect for `path`, else None.

    Only a redirect to the very same path (no scheme, no host) whose query is exactly one non-empty
    `hash` qualifies (`handler3.constructServerRelativeURL`); anything else is a redirect elsewhere.
    """
    if answer.status not in REDIRECTS:
        return None
    location = urlsplit(answer.headers.get("Location", ""))
    if location.scheme or location.netloc or location.fragment or location.path != path:
        return None
    query = parse_qs(location.query, keep_blank_values=True)
    values = query.get("hash", [])
    if len(query) != 1 or len(values) != 1 or not values[0]:
        return None
    return values[0]


def _converted_documents(v2: bytes, keys: Iterable[str]) -> dict[str, bytes]:
    """Each key's v3 document converted from the v2 JSON (CPU-bound: runs in a worker thread)."""
    spec = json.loads(v2)
    out = {}
    for key in keys:
        document = group_version_document(spec, key)
        if document is not None:
            out[key] = go_marshal(document)
    return out


def _hash_of(url: str) -> str:
    values = parse_qs(urlsplit(url).query).get("hash")
    return values[0] if values else ""


def _parse_object(body: bytes, what: str) -> JSON:
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as err:
        raise SourceError(f"{what}: not JSON: {err}") from err
    if not isinstance(doc, dict):
        raise SourceError(f"{what}: not a JSON object")
    return doc


@dataclass(slots=True)
class Refreshed:
    ok: bool
    v3_changed: bool = False
    v2_changed: bool = False


@dataclass(slots=True)
class _Pass:
    """One walk over the index's documents: what moved, what failed, whether anything changed."""

    changed: bool = False
    moved: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


@dataclass(slots=True)
class OpenAPISource:
    """What the gateway holds from one source, and how to refresh it."""

    name: str  # a Service (`ns/name:port`), or "kube-apiserver"
    get: Getter
    # Which `/openapi/v3` keys (`apis/<g>/<v>`) to download from this source.
    wants: Callable[[str], bool]
    metrics: OpenAPIMetrics | None = None
    # The APIServices a backend's documents serve, by name: what logs and metrics are labelled
    # with (APIServices of one Service with different caBundles are different sources, and only
    # these names tell them apart). None for kube-apiserver, which is labelled by its `name`.
    apiservices: Callable[[], Sequence[str]] | None = None
    # The keys to convert from the v2 document when the source has no `/openapi/v3` (None: never).
    legacy_keys: Callable[[], Iterable[str]] | None = None
    v3: dict[str, Document] = field(default_factory=dict)
    # The v2 document as downloaded: bytes, parsed only when merging (kube-apiserver's is megabytes
    # of JSON, several times that as Python objects).
    v2: bytes | None = None
    v2_revision: int = 0  # bumped whenever `v2` changes
    v3_published: bool | None = None  # None until the first answer
    v2_published: bool | None = None
    failures: int = 0
    last_error: str = ""
    last_success: float | None = None
    # The index and every document it listed were downloaded in one refresh, at least once.
    v3_fetched: bool = False
    first_attempt: float | None = None  # time.monotonic() of the first refresh
    _v3_hashes: dict[str, str] = field(default_factory=dict)  # key -> the source's own hash
    _v2_etag: str = ""
    # The index as last read, with the ETag it came with: a steady source answers 304 to a
    # revalidation, and nothing has to be parsed (kube-openapi serves the index with ServeContent).
    _index: tuple[str, Mapping[str, Any]] | None = None
    # The last refresh failed to reach the source at all (its backend was down, not broken).
    unreachable: bool = False
    _failing: set[str] = field(default_factory=set)  # documents whose last attempt failed
    _warned: set[str] = field(default_factory=set)  # ... of which the failure was a warning
    _converted: tuple[int, tuple[str, ...]] | None = None  # (v2 revision, keys) the v3 came from
    _v3_touched: bool = False  # `v3` changed during the refresh in progress
    # `aggregator_openapi_fetches` by (apiservice, document, result), each child looked up once.
    _fetches: Children[Counter] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.metrics is not None:
            self._fetches = Children(self.metrics.fetches)

    # --- one refresh -----------------------------------------------------------------------------

    @property
    def answered(self) -> bool:
        """Both documents were downloaded once (or the source said it publishes none)."""
        v3 = self.v3_fetched or self.v3_published is False
        v2 = self.v2 is not None or self.v2_published is False
        return v3 and v2

    async def refresh(self) -> Refreshed:
        if self.first_attempt is None:
            self.first_attempt = time.monotonic()
        result = Refreshed(ok=True)
        convert = False
        self._v3_touched = False
        self.unreachable = False
        try:
            await self._refresh_v3()
            self._recovered("v3")
            self._converted = None
        except Exception as err:
            # No /openapi/v3 at all: serve the v2 document converted, as kube-aggregator does.
            convert = isinstance(err, NotPublished) and self.legacy_keys is not None
            result.ok = False
            self._v3_touched |= self._failed("v3", err, converting=convert)
        # Documents downloaded before a failure are served too: they were complete and valid.
        result.v3_changed = self._v3_touched
        try:
            result.v2_changed = await self._refresh_v2()
            self._recovered("v2")
        except Exception as err:
            result.ok = False
            result.v2_changed = self._failed("v2", err)
            if convert and isinstance(err, NotPublished):
                convert = False  # no OpenAPI at all: nothing to serve
                self._converted = None
                result.v3_changed |= self._drop("v3")
        if convert:
            result.v3_changed |= await self._convert_v2()
            result.ok = "v2" not in self._failing  # a legacy server with a good v2 is a healthy one
        if result.ok:
            self.failures = 0
            self.last_error = ""
            self.last_success = time.time()
        else:
            self.failures += 1
        return result

    async def _refresh_v3(self) -> None:
        """Read the index and the documents it lists; again at once while hashes move."""
        walk = _Pass()
        for attempt in range(INDEX_READS):
            # After a hash moved, the index is read again in full (a 304 would hand back the stale one).
            walk = await self._walk(await self._read_index(revalidate=attempt == 0))
            if not walk.moved:
                break
            log.debug(
                "OpenAPI documents moved to a new hash; reading the index again",
                extra=fields(**self.log_fields(), documents=",".join(walk.moved)),
            )
        self.v3_published = True
        if walk.moved:
            raise SourceError(
                f"GET {V3_ROOT}: the hash of {', '.join(walk.moved)} kept moving over {INDEX_READS} reads "
                "of the index"
            )
        if walk.errors:
            raise SourceError("; ".join(walk.errors))
        self.v3_fetched = True
        self._count("v3", "ok")

    async def _read_index(self, *, revalidate: bool = True) -> Mapping[str, Any]:
        headers = dict(ACCEPT_JSON)
        held = self._index if revalidate else None
        if held is not None:
            headers["If-None-Match"] = held[0]
        answer = _checked(await self.get(V3_ROOT, {}, headers), f"GET {V3_ROOT}")
        if answer.status == 304 and held is not None:
            return held[1]
        paths = _parse_object(answer.body, f"GET {V3_ROOT}").get("paths")
        entries: Mapping[str, Any] = paths if isinstance(paths, dict) else {}
        etag = answer.headers.get("ETag", "")
        self._index = (etag, entries) if etag else None
        return entries

    async def _walk(self, entries: Mapping[str, Any]) -> _Pass:
        """Bring the held documents in line with one read of the index."""
        walk = _Pass()
        wanted = {key: entry for key, entry in entries.items() if self.wants(key)}
        for key in [k for k in self.v3 if k not in wanted]:
            del self.v3[key]
            self._v3_hashes.pop(key, None)
            self._v3_touched = True
        for key, entry in sorted(wanted.items()):
            url = entry.get("serverRelativeURL", "") if isinstance(entry, dict) else ""
            url = url if isinstance(url, str) else ""
            try:
                self._v3_touched |= await self._refresh_group_version(key, url)
            except HashMoved:
                self._count("v3", "moved")
                walk.moved.append(key)
            except Exception as err:  # this document only: the others are still worth serving
                walk.errors.append(str(err) or type(err).__name__)
        return walk

    async def _refresh_group_version(self, key: str, url: str) -> bool:
        """Download one group-version's document if its hash moved; True when it changed.

        Raises HashMoved for kube-openapi's redirect to the current hash (the index is stale).
        """
        path = f"{V3_ROOT}/{key}"
        # Only the document this key names, whatever URL the index gives (a backend may not point
        # the gateway at other paths on its behalf).
        server_hash = _hash_of(url) if urlsplit(url).path == path else ""
        current = self.v3.get(key)
        if current is not None and server_hash and self._v3_hashes.get(key) == server_hash:
            return False
        headers = dict(ACCEPT_JSON)
        if current is not None and not server_hash:
            headers["If-None-Match"] = current.quoted_etag
        answer = await self.get(path, {"hash": server_hash} if server_hash else {}, headers)
        if answer.status == 304 and current is not None:
            return False
        if server_hash and moved_hash(answer, path) is not None:
            raise HashMoved(path)
        if answer.status in REDIRECTS:
            raise _refused_redirect(answer, f"GET {path}")
        if answer.status != 200:
            # Listed in the index but not served: a broken source, not an unpublished document.
            raise SourceError(f"GET {path}: HTTP {answer.status}: {_excerpt(answer.body)}")
        await asyncio.to_thread(_parse_object, answer.body, f"GET {path}")
        self._v3_hashes[key] = server_hash
        if current is not None and current.body == answer.body:
            return False
        self.v3[key] = Document.render(answer.body)
        return True

    async def _refresh_v2(self) -> bool:
        headers = dict(ACCEPT_JSON)
        if self.v2 is not None and self._v2_etag:
            headers["If-None-Match"] = self._v2_etag
        answer = _checked(await self.get(V2_PATH, {}, headers), f"GET {V2_PATH}")
        self.v2_published = True
        if answer.status == 304:
            if self.v2 is None:
                raise SourceError(f"GET {V2_PATH}: 304 Not Modified without a previous download")
            self._count("v2", "not_modified")
            return False
        if self.v2 != answer.body:
            await asyncio.to_thread(_parse_object, answer.body, f"GET {V2_PATH}")  # refuse what cannot merge
        # Only a server-given ETag is sent back (a locally computed one would never match).
        self._v2_etag = answer.headers.get("ETag", "")
        self._count("v2", "ok")
        if self.v2 == answer.body:
            return False
        self.v2 = answer.body
        self.v2_revision += 1
        return True

    async def _convert_v2(self) -> bool:
        """The wanted group-versions' v3 documents converted from v2; True when they changed."""
        assert self.legacy_keys is not None
        keys = tuple(sorted(k for k in self.legacy_keys() if self.wants(k)))
        signature = (self.v2_revision, keys)
        if signature == self._converted:
            return False
        bodies = await asyncio.to_thread(_converted_documents, self.v2, keys) if self.v2 is not None else {}
        self._converted = signature
        documents = {}
        for key, body in bodies.items():
            current = self.v3.get(key)
            documents[key] = (
                current if current is not None and current.body == body else Document.render(body)
            )
        changed = documents.keys() != self.v3.keys() or any(documents[k] is not self.v3[k] for k in documents)
        self.v3 = documents
        return changed

    # --- outcomes --------------------------------------------------------------------------------

    def _failed(self, document: str, err: Exception, *, converting: bool = False) -> bool:
        """Record a failed download; True when the served documents changed (404 drops them)."""
        first = document not in self._failing
        self._failing.add(document)
        if isinstance(err, NotPublished):
            self._count(document, "not_found")
            if converting:
                self.v3_published = False
                self._v3_hashes.clear()
                if first:
                    log.info(
                        "source publishes no OpenAPI v3; serving its v2 document converted",
                        extra=fields(**self.log_fields(), reason=str(err)),
                    )
                return False
            changed = self._drop(document)
            (log.info if first else log.debug)(
                f"source publishes no OpenAPI {document}; retrying with backoff",
                extra=fields(**self.log_fields(), reason=str(err), failures=self.failures + 1),
            )
            return changed
        message = str(err) or type(err).__name__
        if isinstance(err, TimeoutError):
            message = "timed out"
        self.unreachable |= isinstance(err, BackendError)
        self.last_error = f"{document}: {message}"
        self._count(document, "error")
        warn = first and not isinstance(err, BackendError)  # unreachable: the checker reports it
        if warn:
            self._warned.add(document)
        held = bool(self.v3) if document == "v3" else self.v2 is not None
        (log.warning if warn else log.debug)(
            f"OpenAPI {document} download failed; "
            + ("serving the last good documents" if held else "no documents to serve until one succeeds"),
            extra=fields(
                **self.log_fields(),
                hop=getattr(err, "hop", "") or "",
                error=message,
                failures=self.failures + 1,
            ),
        )
        return False

    def _recovered(self, document: str) -> None:
        if document in self._failing:
            self._failing.discard(document)
            level = log.info if document in self._warned else log.debug
            self._warned.discard(document)
            level(f"OpenAPI {document} download recovered", extra=fields(**self.log_fields()))

    # --- labels ----------------------------------------------------------------------------------

    def labels(self) -> Sequence[str]:
        """The `apiservice` label values of this source's metrics: each APIService it serves."""
        if self.apiservices is None:
            return (self.name,)
        return self.apiservices()

    def log_fields(self) -> dict[str, str]:
        if self.apiservices is None:
            return {"source": self.name}
        return {"apiservices": ",".join(self.apiservices()), "service": self.name}

    def _drop(self, document: str) -> bool:
        if document == "v3":
            self.v3_published = False
            self._v3_hashes.clear()
            self._index = None
            if self.v3:
                self.v3.clear()
                return True
            return False
        self.v2_published = False
        self._v2_etag = ""
        if self.v2 is not None:
            self.v2 = None
            self.v2_revision += 1
            return True
        return False

    def _count(self, document: str, result: str) -> None:
        """One download, counted for each APIService it serves."""
        fetches = self._fetches
        if fetches is None:
            return
        for label in self.labels():
            fetches(label, document, result).inc()
