"""Turn decoded manifests into store objects: dispatch on kind, decode, validate, explain refusals.

Shared by the folder source and by anything else that reads manifests (tests, `aggregator check`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from aggregator.model import apiservice as apisvc
from aggregator.model import fielderrors as fe
from aggregator.model.decode import DecodeError
from aggregator.model.objects import decode_endpointslice, decode_service
from aggregator.model.strict import (
    APISERVICE,
    ENDPOINT_SLICE,
    SERVICE,
    Fields,
    strict_decoding_error,
    unknown_fields,
)
from aggregator.sources.store import Obj

# (apiVersion, kind) -> qualified kind used in messages, as apimachinery prints it.
SUPPORTED = {
    (apisvc.API_VERSION, apisvc.KIND): "APIService.apiregistration.k8s.io",
    ("v1", "Service"): "Service",
    ("discovery.k8s.io/v1", "EndpointSlice"): "EndpointSlice.discovery.k8s.io",
}
# The fields each kind has, for strict field validation (`kubectl apply`'s default).
FIELDS: dict[str, Fields] = {apisvc.KIND: APISERVICE, "Service": SERVICE, "EndpointSlice": ENDPOINT_SLICE}


@dataclass(frozen=True)
class Rejected:
    """An object that was read but not accepted; `message` is the one log line explaining why."""

    message: str


@dataclass(frozen=True)
class Ignored:
    """A document of a kind the gateway does not use."""

    api_version: str
    kind: str


def flatten(doc: Any) -> Iterator[Any]:
    """Documents, with `kind: List` (and `*List`) expanded into their items."""
    if isinstance(doc, Mapping) and isinstance(doc.get("kind"), str) and doc["kind"].endswith("List"):
        items = doc.get("items") or []
        if isinstance(items, list):
            for item in items:
                yield from flatten(item)
            return
    yield doc


def case_twin(api_version: str, kind: str) -> tuple[str, str] | None:
    """The supported (apiVersion, kind) these differ from only in letter case (`ApiService`):
    kinds are case-sensitive, so such a document is no APIService, though it was meant as one."""
    folded = (api_version.lower(), kind.lower())
    return next((known for known in SUPPORTED if (known[0].lower(), known[1].lower()) == folded), None)


def no_match(api_version: str, kind: str, twin: tuple[str, str]) -> str:
    """kubectl's refusal of an unknown kind (apimachinery `meta.NoKindMatchError.Error`, one version
    searched), and the kind meant."""
    meant = f'"{twin[1]}"' if twin[0] == api_version else f'"{twin[1]}" in version "{twin[0]}"'
    return f'no matches for kind "{kind}" in version "{api_version}": did you mean {meant}?'


def to_object(doc: Any) -> Obj | Rejected | Ignored | None:
    """One manifest document -> a valid object, a rejection, an ignored kind, or None (empty doc)."""
    if doc is None:
        return None
    if not isinstance(doc, Mapping):
        return Rejected(f"document is a {type(doc).__name__}, not an object")
    api_version, kind = doc.get("apiVersion"), doc.get("kind")
    if not isinstance(api_version, str) or not isinstance(kind, str):
        return Rejected("document has no apiVersion and kind")
    qualified = SUPPORTED.get((api_version, kind))
    if qualified is None:
        if kind == apisvc.KIND and api_version.startswith(apisvc.GROUP + "/"):
            return Rejected(
                f"{api_version} APIService is not served (removed in Kubernetes 1.22); use {apisvc.API_VERSION}"
            )
        twin = case_twin(api_version, kind)
        if twin is not None:
            return Rejected(no_match(api_version, kind, twin))
        return Ignored(api_version, kind)
    unknown = unknown_fields(doc, FIELDS[kind])
    if unknown:
        return Rejected(strict_decoding_error(kind, api_version.rpartition("/")[2], unknown))
    metadata = doc.get("metadata")
    name = metadata.get("name", "") if isinstance(metadata, Mapping) else ""
    try:
        if kind == apisvc.KIND:
            svc = apisvc.decode_apiservice(doc)
            errors = apisvc.validate_apiservice(svc) + apisvc.validate_status(svc)
            if errors:
                return Rejected(fe.invalid_object(qualified, str(name), errors))
            return svc
        if kind == "Service":
            return decode_service(doc)
        return decode_endpointslice(doc)
    except DecodeError as err:
        return Rejected(f'{qualified} "{name}" could not be decoded: {err}')
