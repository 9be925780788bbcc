"""Watches: initial events, resume from a resourceVersion, selectors, bookmarks, 410, Table events."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from sample_apiserver import SampleServer

from tests.sample.conftest import Client, MakeClient
from tests.sample.test_resources import BETA, create, flunder

TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"


class Stream:
    def __init__(self, response: Any) -> None:
        self.response = response

    async def next(self, timeout: float = 3.0) -> dict[str, Any]:
        line = await asyncio.wait_for(self.response.content.readline(), timeout)
        assert line, "watch ended"
        event: dict[str, Any] = json.loads(line)
        return event

    async def quiet(self, seconds: float = 0.3) -> bool:
        try:
            await asyncio.wait_for(self.response.content.readline(), seconds)
        except TimeoutError:
            return True
        return False


@asynccontextmanager
async def watch(
    client: Client, path: str = BETA, headers: dict[str, str] | None = None, **params: str
) -> AsyncIterator[Stream]:
    async with client.session.get(
        client.url + path,
        params={"watch": "true", **params},
        headers={**client.headers, **(headers or {})},
        ssl=client.ssl,
    ) as response:
        assert response.status == 200
        yield Stream(response)


async def test_watch_without_resource_version_starts_with_current_state(admin: Client) -> None:
    await create(admin, flunder("a"))
    async with watch(admin) as stream:
        event = await stream.next()
        assert event["type"] == "ADDED" and event["object"]["metadata"]["name"] == "a"
        assert list(event) == ["type", "object"]
        await create(admin, flunder("b"))
        event = await stream.next()
        assert (event["type"], event["object"]["metadata"]["name"]) == ("ADDED", "b")
        await admin.request(
            "PATCH",
            f"{BETA}/b",
            body={"metadata": {"labels": {"x": "y"}}},
            content_type="application/merge-patch+json",
        )
        event = await stream.next()
        assert event["type"] == "MODIFIED" and event["object"]["metadata"]["labels"] == {"x": "y"}
        _status, _, _, _ = await admin.request("DELETE", f"{BETA}/b")
        event = await stream.next()
        assert (event["type"], event["object"]["metadata"]["name"]) == ("DELETED", "b")


async def test_watch_resumes_after_a_resource_version(admin: Client) -> None:
    a = await create(admin, flunder("a"))
    await create(admin, flunder("b"))
    async with watch(admin, resourceVersion=a["metadata"]["resourceVersion"]) as stream:
        event = await stream.next()
        assert (event["type"], event["object"]["metadata"]["name"]) == ("ADDED", "b")
        assert await stream.quiet()


async def test_watch_in_other_version_and_other_namespace(admin: Client) -> None:
    async with watch(
        admin, "/apis/wardle.example.com/v1alpha1/namespaces/default/flunders", resourceVersion="1"
    ) as stream:
        await create(
            admin,
            flunder("other", namespace="elsewhere"),
            "/apis/wardle.example.com/v1beta1/namespaces/elsewhere/flunders",
        )
        await create(admin, flunder("a", {"referenceType": "Flunder", "flunderReference": "x"}))
        event = await stream.next()
        assert event["object"]["apiVersion"] == "wardle.example.com/v1alpha1"
        assert event["object"]["metadata"]["name"] == "a" and event["object"]["spec"]["reference"] == "x"


async def test_watch_selector_boundaries(admin: Client) -> None:
    await create(admin, flunder("a"))
    async with watch(admin, labelSelector="team=x", resourceVersion="1") as stream:
        merge = "application/merge-patch+json"
        await admin.request(
            "PATCH", f"{BETA}/a", body={"metadata": {"labels": {"team": "x"}}}, content_type=merge
        )
        event = await stream.next()
        assert event["type"] == "ADDED"  # entered the selection
        await admin.request(
            "PATCH", f"{BETA}/a", body={"metadata": {"labels": {"team": "y"}}}, content_type=merge
        )
        event = await stream.next()
        assert event["type"] == "DELETED"  # left it
        await admin.request(
            "PATCH", f"{BETA}/a", body={"metadata": {"labels": {"other": "1"}}}, content_type=merge
        )
        assert await stream.quiet()
    async with watch(admin, fieldSelector="metadata.name=b", resourceVersion="1") as stream:
        await create(admin, flunder("c"))
        await create(admin, flunder("b"))
        event = await stream.next()
        assert event["object"]["metadata"]["name"] == "b"


async def test_bookmarks_when_allowed(admin: Client, sample: SampleServer) -> None:
    created = await create(admin, flunder("a"))
    rv = created["metadata"]["resourceVersion"]
    async with watch(admin, resourceVersion=rv, allowWatchBookmarks="true") as stream:
        event = await stream.next()
        assert event == {
            "type": "BOOKMARK",
            "object": {
                "kind": "Flunder",
                "apiVersion": "wardle.example.com/v1beta1",
                "metadata": {"resourceVersion": str(sample.store.revision)},
                "spec": {},
                "status": {},
            },
        }
    async with watch(admin, resourceVersion=rv) as stream:
        assert await stream.quiet(0.5)  # bookmark interval is 0.2s in these tests, but not asked for


async def test_send_initial_events_ends_with_annotated_bookmark(admin: Client) -> None:
    await create(admin, flunder("a"))
    async with watch(
        admin, sendInitialEvents="true", allowWatchBookmarks="true", resourceVersionMatch="NotOlderThan"
    ) as stream:
        assert (await stream.next())["type"] == "ADDED"
        bookmark = await stream.next()
        assert bookmark["type"] == "BOOKMARK"
        assert bookmark["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}
    status, _, err, _ = await admin.get(
        BETA, params={"watch": "true", "sendInitialEvents": "true", "allowWatchBookmarks": "true"}
    )
    assert status == 422
    assert err["message"] == (
        'ListOptions.meta.k8s.io "" is invalid: resourceVersionMatch: Forbidden: sendInitialEvents requires '
        "setting resourceVersionMatch to NotOlderThan"
    )


async def test_too_old_resource_version_gets_410_error_event(
    start_sample: Any, make_client: MakeClient
) -> None:
    server = await start_sample(watch_history=3)
    client = make_client(server)
    for i in range(6):
        await create(client, flunder(f"f{i}"))
    async with watch(client, resourceVersion="2") as stream:
        event = await stream.next()
        assert event == {
            "type": "ERROR",
            "object": {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": "too old resource version: 2 (4)",
                "reason": "Expired",
                "code": 410,
            },
        }
    async with watch(client, resourceVersion="4") as stream:
        assert (await stream.next())["object"]["metadata"]["name"] == "f3"


async def test_table_watch_sends_headers_once(admin: Client) -> None:
    await create(admin, flunder("a"))
    async with watch(admin, headers={"Accept": TABLE}) as stream:
        first = await stream.next()
        assert first["object"]["kind"] == "Table"
        assert [c["name"] for c in first["object"]["columnDefinitions"]] == [
            "Name",
            "Age",
            "Reference Type",
            "Reference",
        ]
        assert first["object"]["rows"][0]["cells"][0] == "a"
        await create(admin, flunder("b"))
        second = await stream.next()
        assert second["object"]["columnDefinitions"] is None
        assert second["object"]["rows"][0]["cells"][0] == "b"
        assert second["object"]["rows"][0]["object"]["kind"] == "PartialObjectMetadata"


async def test_watch_timeout_and_server_stop_end_the_stream(
    start_sample: Any, make_client: MakeClient
) -> None:
    server = await start_sample()
    client = make_client(server)
    async with watch(client, timeoutSeconds="1") as stream:
        line = await asyncio.wait_for(stream.response.content.readline(), 3)
        assert line == b""
    async with watch(client) as stream:
        await server.stop()
        line = await asyncio.wait_for(stream.response.content.readline(), 5)
        assert line == b""


async def test_removing_the_last_finalizer_deletes_with_one_event(admin: Client) -> None:
    created = await create(admin, flunder("fin", finalizers=["example.com/hold"]))
    async with watch(admin, resourceVersion=created["metadata"]["resourceVersion"]) as stream:
        await admin.request("DELETE", f"{BETA}/fin")
        marked = await stream.next()
        assert marked["type"] == "MODIFIED" and marked["object"]["metadata"]["deletionTimestamp"]
        await admin.request(
            "PATCH",
            f"{BETA}/fin",
            body={"metadata": {"finalizers": None}},
            content_type="application/merge-patch+json",
        )
        gone = await stream.next()
        assert gone["type"] == "DELETED" and "finalizers" not in gone["object"]["metadata"]
        assert await stream.quiet()
