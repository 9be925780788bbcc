"""Where an APIService's `Available` condition is recorded, and only when it changed.

- local mode: the store (`kubectl get apiservices` through the gateway shows it);
- kube mode: in memory, or with `--write-apiservice-status` the status subresource in
  kube-apiserver (a PUT with the object's resourceVersion; a 409 means someone else wrote first,
  so the latest object is read again and the condition re-applied to it), from the elected
  replica only, and only when the status or reason changed (`KubeStatusWriter`).

Every sink applies the condition with `set_condition`, so `lastTransitionTime` moves only when the
status flips, and a steady state writes nothing (upstream's `updateAPIServiceStatus`).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any, Protocol

from aggregator.availability.conditions import Verdict
from aggregator.kube import calls
from aggregator.kube.client import KubeAPIError, KubeClient
from aggregator.model.apiservice import APIService, Condition, decode_apiservice, set_condition
from aggregator.model.decode import DecodeError
from aggregator.sources.store import Store
from aggregator.util.logs import fields

log = logging.getLogger(__name__)

# Conflicts in a row before giving up until the next check (another writer keeps winning).
MAX_CONFLICTS = 3


@dataclass(frozen=True, slots=True)
class Change:
    """Conditions before and after a recorded change."""

    before: tuple[Condition, ...]
    after: tuple[Condition, ...]


class StatusSink(Protocol):
    async def apply(self, svc: APIService, verdict: Verdict) -> Change | None:
        """Record the verdict on `svc`; the change, or None when nothing changed (or could not be written)."""
        ...

    def forget(self, name: str) -> None: ...


class MemoryStatus:
    """Kube mode without `--write-apiservice-status`: conditions live only in this gateway."""

    def __init__(self) -> None:
        self._conditions: dict[str, tuple[Condition, ...]] = {}

    def current(self, svc: APIService) -> tuple[Condition, ...]:
        # Until this gateway has an opinion, the object's own status (kube-apiserver's aggregator).
        return self._conditions.get(svc.name, svc.conditions)

    async def apply(self, svc: APIService, verdict: Verdict) -> Change | None:
        before = self.current(svc)
        if verdict.held_by(before):
            return None
        after = set_condition(before, verdict.condition())
        if after == before:
            return None
        self._conditions[svc.name] = after
        return Change(before, after)

    def forget(self, name: str) -> None:
        self._conditions.pop(name, None)


class StoreStatus:
    """Local mode: the store holds the status, as kube-apiserver would."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def apply(self, svc: APIService, verdict: Verdict) -> Change | None:
        current = self.store.apiservice(svc.name)
        if current is None or verdict.held_by(current.conditions):
            return None
        after = set_condition(current.conditions, verdict.condition())
        if after == current.conditions:
            return None
        self.store.set_apiservice_conditions(svc.name, after)
        return Change(current.conditions, after)

    def forget(self, name: str) -> None:
        return None


def status_body(svc: APIService, conditions: tuple[Condition, ...]) -> dict[str, Any]:
    """The object to PUT to `.../apiservices/<name>/status`: as last seen, with new conditions."""
    body = dict(svc.raw)
    metadata = dict(body.get("metadata") or {})
    metadata["name"] = svc.name
    if svc.resource_version:
        metadata["resourceVersion"] = svc.resource_version
    metadata.pop("managedFields", None)
    body["apiVersion"] = "apiregistration.k8s.io/v1"
    body["kind"] = "APIService"
    body["metadata"] = metadata
    body["status"] = {"conditions": [c.to_json() for c in conditions]}
    return body


class Leadership(Protocol):
    """Whether this replica is the one that writes (a `LeaderElector`, or `ALWAYS_LEADS`)."""

    @property
    def is_leader(self) -> bool: ...


class _AlwaysLeads:
    """`--leader-elect=false`: every replica with `--write-apiservice-status` writes."""

    @property
    def is_leader(self) -> bool:
        return True


ALWAYS_LEADS: Leadership = _AlwaysLeads()


def needs_write(stored: tuple[Condition, ...], condition: Condition) -> bool:
    """True when the stored `Available` condition is missing or has another status or reason.

    A different message alone (or transition time) is no reason to write: kube-apiserver's own
    availability controller writes the same condition with its own wording (`updateAPIServiceStatus`
    rewrites on any difference), so rewriting for the message would make the two take turns forever.
    """
    current = next((c for c in stored if c.type == condition.type), None)
    return current is None or (current.status, current.reason) != (condition.status, condition.reason)


class KubeStatusWriter:
    """`--write-apiservice-status`: PUT the status subresource, from the leader, when the verdict changed.

    Two rules keep the writers of one cluster from fighting over the `Available` condition:

    - only the replica that `leadership` says leads writes (the gateway's replicas elect one with a
      Lease); the others return None, so the checker records nothing and counts no transition;
    - a write happens only when the stored condition's status or reason differs from the verdict
      (`needs_write`); a message or lastTransitionTime difference alone writes nothing. When this
      gateway and kube-apiserver's aggregator agree on status and reason, whichever wrote last
      keeps its message. When they disagree (say the gateway cannot reach a backend that
      kube-apiserver can), each rewrites on its next check, so the condition alternates and its
      lastTransitionTime moves with every flip: `kubectl get apiservices` then shows whichever wrote
      last, while this gateway's proxying always follows its own verdict.
    """

    def __init__(self, client: KubeClient, store: Store, leadership: Leadership) -> None:
        self.client = client
        self.store = store
        self.leadership = leadership

    async def apply(self, svc: APIService, verdict: Verdict) -> Change | None:
        current = self.store.apiservice(svc.name) or svc
        condition = verdict.condition()
        for _ in range(MAX_CONFLICTS):
            if not self.leadership.is_leader:
                return None
            if not needs_write(current.conditions, condition):
                return None
            after = set_condition(current.conditions, condition)
            response = await self.client.request(
                calls.UPDATE_APISERVICE_STATUS, name=svc.name, json_body=status_body(current, after)
            )
            if 200 <= response.status < 300:
                return Change(current.conditions, after)
            if response.status == 404:
                return None  # deleted meanwhile; the watch will tell the checker
            if response.status != 409:
                raise _api_error(calls.UPDATE_APISERVICE_STATUS, response.status, response.body)
            log.debug("APIService status conflict; reading it again", extra=fields(apiservice=svc.name))
            fresh = await self._read(svc.name)
            if fresh is None:
                return None
            current = fresh
        raise StatusConflict(
            f"apiservice {svc.name}: status kept changing under us ({MAX_CONFLICTS} conflicts)"
        )

    async def _read(self, name: str) -> APIService | None:
        response = await self.client.request(calls.GET_APISERVICES, name=name)
        if response.status == 404:
            return None
        if response.status != 200:
            raise _api_error(calls.GET_APISERVICES, response.status, response.body)
        try:
            return decode_apiservice(response.json())
        except (DecodeError, ValueError) as err:
            raise StatusConflict(f"apiservice {name}: cannot decode the latest object: {err}") from err

    def forget(self, name: str) -> None:
        return None


class StatusConflict(Exception):
    """The status could not be written after re-reading; the next check tries again."""


def _api_error(call: calls.ApiCall, status: int, body: bytes) -> KubeAPIError:
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    return KubeAPIError(call, status, doc if isinstance(doc, dict) else None, body.decode("utf-8", "replace"))
