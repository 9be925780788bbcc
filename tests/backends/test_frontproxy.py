"""The one start-up warning when backends would get no front-proxy identity."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from aggregator.backends.frontproxy import MESSAGE
from tests.conftest import StartGateway
from tests.support.backend import apiservice_manifest, backend_service, write_manifests
from tests.support.logrecords import fields_of
from tests.support.polling import until

NO_CERT = {"proxy_client_cert_file": None, "proxy_client_key_file": None}


def warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage() == MESSAGE]


async def test_warned_once_when_the_store_syncs_with_an_apiservice(
    start_gateway: StartGateway, apiservices_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    write_manifests(apiservices_dir, "a", apiservice_manifest(port=1443, ca_pem=None), *backend_service(1443))
    write_manifests(apiservices_dir, "b", apiservice_manifest(port=2443, ca_pem=None, group="b.example.com"))
    server = await start_gateway(**NO_CERT)
    await until(lambda: warnings(caplog), what="the warning")
    # A later change to the APIServices says nothing more.
    write_manifests(apiservices_dir, "c", apiservice_manifest(port=3443, ca_pem=None, group="c.example.com"))
    await until(lambda: server.gateway.store.apiservice("v1.c.example.com") is not None)
    (record,) = warnings(caplog)
    assert fields_of(record) == {"apiservices": 2, "first": fields_of(record)["first"]}


async def test_warned_when_the_first_apiservice_appears_after_sync(
    start_gateway: StartGateway, apiservices_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    server = await start_gateway(**NO_CERT)
    await until(lambda: server.gateway.store.synced)
    assert not warnings(caplog)
    write_manifests(apiservices_dir, "a", apiservice_manifest(port=1443, ca_pem=None))
    await until(lambda: warnings(caplog), what="the warning")
    assert len(warnings(caplog)) == 1


async def test_no_warning_with_a_client_certificate(
    start_gateway: StartGateway, apiservices_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    write_manifests(apiservices_dir, "a", apiservice_manifest(port=1443, ca_pem=None))
    server = await start_gateway()
    await until(lambda: server.gateway.store.apiservice("v1.demo.example.com") is not None)
    assert not warnings(caplog)
    assert "front-proxy-warning" not in dict(server.gateway.components)
