"""An APIService of the folder has one uid and one creationTimestamp, set as kube-apiserver sets
them, whichever worker serves it, and its condition never changed before it was created."""

from __future__ import annotations

import datetime as dt
import os
import signal
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from aggregator.model.apiservice import APIService, Condition, decode_apiservice, now_rfc3339
from aggregator.sources.identity import with_system_fields
from tests.support.backend import APISERVICE, apiservice_manifest, write_manifests
from tests.support.pki import PKI
from tests.support.polling import until, until_async
from tests.workers.group import PID_NOTE, Group, running_group

pytestmark = pytest.mark.long(15)


def _svc(**metadata: Any) -> APIService:
    doc = apiservice_manifest(port=443, ca_pem=None)
    doc["metadata"].update(metadata)
    doc["status"]["conditions"][0]["lastTransitionTime"] = "2020-01-01T00:00:00Z"
    return decode_apiservice(doc)


def test_created_once_then_kept_whatever_the_manifest_says() -> None:
    created = with_system_fields(
        _svc(uid="from-manifest", creationTimestamp="2000-01-01T00:00:00Z"),
        None,
        now=lambda: "2026-05-01T10:00:00Z",
        new_uid=lambda: "u-1",
    )
    assert created.raw["metadata"]["uid"] == "u-1"
    assert created.raw["metadata"]["creationTimestamp"] == "2026-05-01T10:00:00Z"
    # The manifest's condition is recorded at creation at the earliest.
    assert created.conditions[0].last_transition_time == "2026-05-01T10:00:00Z"
    edited = with_system_fields(_svc(), created, now=lambda: "2026-05-01T11:00:00Z", new_uid=lambda: "u-2")
    assert (edited.raw["metadata"]["uid"], edited.raw["metadata"]["creationTimestamp"]) == (
        "u-1",
        "2026-05-01T10:00:00Z",
    )
    later = Condition("Available", "True", "2026-06-01T00:00:00Z")
    kept = with_system_fields(
        APIService("v1.x", "x", "v1", None, 1, 1, conditions=(later,)), None, now=lambda: "2026-05-01T10:00:00Z"
    )
    assert kept.conditions == (later,) and kept.raw["metadata"]["creationTimestamp"] == "2026-05-01T10:00:00Z"


async def _served(group: Group) -> tuple[int, dict[str, Any]]:
    """(worker pid, the APIService as served), both from the worker of one keep-alive connection."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as session:
        context = group.context()
        async with session.get(group.url + "/livez?verbose", ssl=context) as resp:
            note = PID_NOTE.search(await resp.text())
            assert note is not None
        path = f"/apis/apiregistration.k8s.io/v1/apiservices/{APISERVICE}"
        async with session.get(group.url + path, ssl=context) as resp:
            assert resp.status == 200
            return int(note.group(3)), await resp.json()


async def _every_worker(group: Group, count: int = 2) -> dict[int, dict[str, Any]]:
    seen: dict[int, dict[str, Any]] = {}

    async def all_seen() -> bool:
        pid, obj = await _served(group)
        seen[pid] = obj
        return len(seen) >= count

    await until_async(all_seen, 30.0, f"{count} workers to answer")
    return seen


def _identity(obj: dict[str, Any]) -> tuple[str, str]:
    return obj["metadata"]["uid"], obj["metadata"]["creationTimestamp"]


def _transition(obj: dict[str, Any]) -> str:
    (condition,) = obj["status"]["conditions"]
    return str(condition["lastTransitionTime"])


def _instant(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


async def test_every_worker_serves_the_same_identity_and_no_condition_before_creation(
    pki: PKI, apiservices_dir: Path, tmp_path: Path
) -> None:
    svc = apiservice_manifest(port=443, ca_pem=None)  # no such Service: Available False, ServiceNotFound
    del svc["status"]
    write_manifests(apiservices_dir, "demo", svc)
    async with running_group(pki, apiservices_dir, tmp_path / "serve.log", "--workers", "2") as group:
        views = await _every_worker(group)
        identities = {_identity(obj) for obj in views.values()}
        assert len(identities) == 1, views
        ((uid, created),) = identities
        for obj in views.values():
            assert _instant(_transition(obj)) >= _instant(created), obj
        # A worker started again a second later serves the same object, not one created at its start.
        transition = _transition(next(iter(views.values())))
        await until(lambda: now_rfc3339() > transition, 5.0, "the next second")
        victim = min(views)
        os.kill(victim, signal.SIGKILL)
        await until(lambda: "killed by SIGKILL" in group.log(), what="the supervisor to notice")
        views = await _every_worker(group)  # the survivor and the new worker
        assert victim not in views
        for obj in views.values():
            assert _identity(obj) == (uid, created), obj
            assert _transition(obj) == transition, obj
