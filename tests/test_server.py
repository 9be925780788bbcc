"""What every request gets from the pipeline: Status errors, /version, access logs without secrets."""

from __future__ import annotations

import json
import logging

import aiohttp
import pytest

from aggregator import __version__
from tests.conftest import StartGateway
from tests.support.pki import PKI


async def test_unknown_path_in_local_mode_is_a_404_status(start_gateway: StartGateway, pki: PKI) -> None:
    server = await start_gateway()
    async with aiohttp.ClientSession() as session:
        async with session.get(
            f"{server.url}/api/v1/pods", ssl=pki.client_context(), headers={"User-Agent": "kubectl"}
        ) as resp:
            assert resp.status == 404
            assert resp.headers["Content-Type"] == "application/json"
            assert await resp.read() == (
                b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",'
                b'"message":"the server could not find the requested resource","reason":"NotFound","details":{},"code":404}\n'
            )
        # curl gets it indented, as from kube-apiserver
        async with session.get(
            f"{server.url}/nope", ssl=pki.client_context(), headers={"User-Agent": "curl/8.0"}
        ) as resp:
            text = await resp.text()
            assert text.startswith('{\n  "kind": "Status",\n')
            assert json.loads(text)["code"] == 404


async def test_version_in_local_mode(start_gateway: StartGateway, pki: PKI) -> None:
    server = await start_gateway()
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{server.url}/version", ssl=pki.client_context()) as resp,
    ):
        body = await resp.json()
    # The Kubernetes level the gateway follows, the gateway itself in the semver build metadata.
    assert body["gitVersion"] == f"v1.33.0+aggregator.{__version__}"
    assert (body["major"], body["minor"]) == ("1", "33")
    assert list(body)[:3] == ["major", "minor", "gitVersion"]


async def test_access_log_line_never_carries_credentials(
    start_gateway: StartGateway, pki: PKI, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    server = await start_gateway(access_log="all")
    async with (
        aiohttp.ClientSession() as session,
        session.get(
            f"{server.url}/livez?x=1",
            ssl=pki.client_context(),
            headers={"Authorization": "Bearer sup3rs3cr3t-token", "X-Remote-Extra-Secret": "hunter2"},
        ) as resp,
    ):
        assert resp.status == 200
    access = [r for r in caplog.records if r.name == "aggregator.access"]
    assert access
    assert access[-1].fields["path"] == "/livez"  # type: ignore[attr-defined]
    assert access[-1].fields["status"] == 200  # type: ignore[attr-defined]
    assert "duration_ms" in access[-1].fields  # type: ignore[attr-defined]
    assert "sup3rs3cr3t" not in caplog.text and "hunter2" not in caplog.text


def test_json_log_lines_are_json() -> None:
    from aggregator.util.logs import JSONFormatter, fields

    record = logging.LogRecord("x", logging.INFO, __file__, 1, "hello %s", ("world",), None)
    record.fields = fields(user="alice", token="abc")["fields"]
    doc = json.loads(JSONFormatter().format(record))
    assert doc["msg"] == "hello world" and doc["user"] == "alice"
    assert doc["token"] == "[redacted]"
