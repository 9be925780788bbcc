"""Every reason upstream gives, produced with real objects and real TLS servers.

Each message starts with upstream's exact text (what alerts and runbooks match) and then names the
hop that failed, with what an operator needs to fix it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from aggregator.availability.conditions import failed_discovery_check, passed
from aggregator.availability.probe import FAIL, PASS, SKIP, Attempt, DiscoveryProbe, Report, check_apiservice
from aggregator.backends.errors import BackendError, Hop
from aggregator.sources.store import Kind
from tests.availability.conftest import StartBackend
from tests.availability.support import AlertingBackend, Harness
from tests.support.backend import (
    APISERVICE,
    SERVER_NAME,
    BackendPKI,
    apiservice_manifest,
    endpointslice_manifest,
    service_manifest,
)
from tests.support.gateway import local_options
from tests.support.pki import PKI
from tests.support.polling import until
from tests.support.ports import free_port

DISCOVERY = "/apis/demo.example.com/v1"


def states(report: Report) -> list[tuple[str, str]]:
    return [(s.hop, s.state) for s in report.steps]


async def test_local_apiservice_is_always_available(harness: Harness) -> None:
    local = apiservice_manifest(port=1, ca_pem=None)
    del local["spec"]["service"]
    harness.add(local)
    report = await harness.check()
    assert (report.verdict.status, report.verdict.reason, report.verdict.message) == (
        "True",
        "Local",
        "Local APIServices are always available",
    )


async def test_service_not_found(harness: Harness) -> None:
    harness.add(apiservice_manifest(port=443, ca_pem=None))
    report = await harness.check()
    assert (report.verdict.status, report.verdict.reason) == ("False", "ServiceNotFound")
    assert report.verdict.message == 'service/api in "demo" is not present [hop: service]'
    assert states(report) == [("apiservice", PASS), ("service", FAIL)]


async def test_service_access_error_when_services_cannot_be_read(harness: Harness) -> None:
    harness.add(apiservice_manifest(port=443, ca_pem=None))
    denied = 'services is forbidden: User "gateway" cannot list resource "services" in API group ""'

    def access(kind: Kind) -> str | None:
        return denied if kind is Kind.SERVICE else None

    report = await harness.check(access=access)
    assert (report.verdict.status, report.verdict.reason) == ("Unknown", "ServiceAccessError")
    assert (
        report.verdict.message == f'service/api in "demo" cannot be checked due to: {denied} [hop: service]'
    )


async def test_service_port_error_lists_the_ports_the_service_has(harness: Harness) -> None:
    harness.register(443, ca_pem=None, service_port=8443)
    report = await harness.check()
    assert (report.verdict.status, report.verdict.reason) == ("False", "ServicePortError")
    assert report.verdict.message == (
        'service/api in "demo" is not listening on port 443 [hop: port; service ports: 8443 ("https")]'
    )


async def test_endpoints_not_found(harness: Harness) -> None:
    harness.add(apiservice_manifest(port=443, ca_pem=None), service_manifest(port=443))
    report = await harness.check()
    assert (report.verdict.status, report.verdict.reason) == ("False", "EndpointsNotFound")
    assert report.verdict.message == 'cannot find endpointslices for service/api in "demo" [hop: endpoints]'


async def test_endpoints_access_error(harness: Harness) -> None:
    harness.add(apiservice_manifest(port=443, ca_pem=None), service_manifest(port=443))

    def access(kind: Kind) -> str | None:
        return "the server is currently unable to handle the request" if kind is Kind.ENDPOINTSLICE else None

    report = await harness.check(access=access)
    assert (report.verdict.status, report.verdict.reason) == ("Unknown", "EndpointsAccessError")
    assert report.verdict.message.startswith('service/api in "demo" cannot be checked due to: the server is')
    assert report.verdict.message.endswith("[hop: endpoints]")


async def test_missing_endpoints_names_the_port_names_the_slices_have(harness: Harness) -> None:
    # The most common mistake (calico#9344): the Service port is "https", the slice's port "http".
    harness.register(443, ca_pem=None, slice_port_name="http")
    report = await harness.check()
    assert (report.verdict.status, report.verdict.reason) == ("False", "MissingEndpoints")
    assert report.verdict.message == (
        'endpointslices for service/api in "demo" have no addresses with port name "https" '
        '[hop: endpoints; slices: api-1 (port names "http"; 1 endpoints, 1 ready)]'
    )


async def test_missing_endpoints_when_no_endpoint_is_ready(harness: Harness) -> None:
    harness.register(443, ca_pem=None, ready=False)
    report = await harness.check()
    assert report.verdict.reason == "MissingEndpoints"
    assert report.verdict.message.endswith(
        '[hop: endpoints; slices: api-1 (port names "https"; 1 endpoints, 0 ready)]'
    )


async def test_non_cluster_ip_services_skip_the_port_and_endpoint_hops(
    harness: Harness, start_backend: StartBackend, backend_pki: BackendPKI
) -> None:
    backend = await start_backend()
    node_port = service_manifest(port=backend.port, type_="NodePort")
    harness.add(apiservice_manifest(port=backend.port, ca_pem=backend_pki.ca.cert_pem), node_port)
    report = await harness.check()
    assert report.verdict.reason == "Passed"
    assert ("port", SKIP) in states(report) and ("endpoints", SKIP) in states(report)


async def test_passed_through_the_proxy_transport_as_the_aggregator(
    harness: Harness, start_backend: StartBackend, backend_pki: BackendPKI
) -> None:
    backend = await start_backend()
    harness.register(backend.port, ca_pem=backend_pki.ca.cert_pem)
    report = await harness.check()
    assert (report.verdict.status, report.verdict.reason, report.verdict.message) == (
        "True",
        "Passed",
        "all checks passed",
    )
    assert [s.state for s in report.steps] == [PASS] * len(report.steps)
    seen = backend.seen_by("system:kube-aggregator")
    assert seen and {r.raw_path for r in seen} == {DISCOVERY}
    assert seen[0].all("X-Remote-Group") == ["system:masters"]
    assert seen[0].peer_cn == "front-proxy-client"  # the proxy's client certificate
    assert len(seen) <= 5


async def test_connection_refused_names_the_address_dialed(harness: Harness) -> None:
    port = free_port()
    harness.register(port, ca_pem=None)
    report = await harness.check()
    url = f"https://127.0.0.1:{port}{DISCOVERY}"
    assert (report.verdict.status, report.verdict.reason) == ("False", "FailedDiscoveryCheck")
    assert report.verdict.message == (
        f'failing or missing response from {url}: Get "{url}": dial tcp 127.0.0.1:{port}: connect: '
        f"connection refused [hop: connect; dialed: 127.0.0.1:{port} (the cluster IP of service demo/api)]"
    )
    assert states(report)[-2:] == [("address", PASS), ("connect", FAIL)]


async def test_tls_with_the_wrong_ca_names_expected_and_presented_names(
    harness: Harness, start_backend: StartBackend, backend_pki: BackendPKI
) -> None:
    backend = await start_backend(hosts=[SERVER_NAME, "localhost"])
    harness.register(backend.port, ca_pem=backend_pki.other_ca.cert_pem)
    report = await harness.check()
    url = f"https://127.0.0.1:{backend.port}{DISCOVERY}"
    message = report.verdict.message
    assert message.startswith(
        f'failing or missing response from {url}: Get "{url}": tls: failed to verify certificate: '
        "x509: certificate signed by unknown authority [hop: tls; "
    )
    assert f"dialed: 127.0.0.1:{backend.port}" in message
    assert f"expected name: {SERVER_NAME}" in message
    assert f"certificate names: {SERVER_NAME}, localhost" in message
    assert "certificate issuer: CN=extension-ca" in message
    assert "trusted CA: spec.caBundle: CN=unrelated-ca" in message
    assert states(report)[-2:] == [("connect", PASS), ("tls", FAIL)]


async def test_tls_with_the_wrong_name(
    harness: Harness, start_backend: StartBackend, backend_pki: BackendPKI
) -> None:
    backend = await start_backend(hosts=["metrics.kube-system.svc", "127.0.0.1"])
    harness.register(backend.port, ca_pem=backend_pki.ca.cert_pem)
    report = await harness.check()
    assert (
        "tls: failed to verify certificate: x509: certificate is valid for metrics.kube-system.svc, "
        f"not {SERVER_NAME} [hop: tls;"
    ) in report.verdict.message
    assert "certificate names: metrics.kube-system.svc, 127.0.0.1" in report.verdict.message


async def test_backend_refusing_the_client_certificate(harness: Harness, backend_pki: BackendPKI) -> None:
    # The extension server trusts another front-proxy CA (a requestheader misconfiguration).
    other = backend_pki.dir / "other-front-proxy-ca.crt"
    other.write_bytes(backend_pki.other_ca.cert_pem)
    cert, key = backend_pki.serving("alerting", [SERVER_NAME])
    backend = AlertingBackend(cert, key, str(other))
    try:
        harness.register(backend.port, ca_pem=backend_pki.ca.cert_pem)
        report = await harness.check()
    finally:
        backend.close()
    url = f"https://127.0.0.1:{backend.port}{DISCOVERY}"
    assert report.verdict.message.startswith(
        f'failing or missing response from {url}: Get "{url}": remote error: tls: unknown certificate '
        "authority [hop: tls; "
    )
    assert (
        "client certificate: CN=front-proxy-client (issuer CN=aggregator-front-proxy-ca)"
        in report.verdict.message
    )
    assert states(report)[-2:] == [("connect", PASS), ("tls", FAIL)]
    assert backend.refused >= 5


async def test_backend_closing_without_an_alert_hints_at_the_client_certificate(
    harness: Harness, start_backend: StartBackend, backend_pki: BackendPKI
) -> None:
    other = backend_pki.dir / "other-front-proxy-ca.crt"
    other.write_bytes(backend_pki.other_ca.cert_pem)
    backend = await start_backend(client_ca=str(other))  # asyncio closes without the alert
    harness.register(backend.port, ca_pem=backend_pki.ca.cert_pem)
    report = await harness.check()
    url = f"https://127.0.0.1:{backend.port}{DISCOVERY}"
    assert report.verdict.message.startswith(f'failing or missing response from {url}: Get "{url}": ')
    assert "the backend closed the connection without answering" in report.verdict.message
    assert "client certificate: CN=front-proxy-client" in report.verdict.message


@pytest.mark.parametrize(
    ("code", "hop"), [(403, "http"), (404, "http"), (302, "redirect"), (304, "redirect")]
)
async def test_bad_status_gives_status_and_body(
    harness: Harness, start_backend: StartBackend, backend_pki: BackendPKI, code: int, hop: str
) -> None:
    backend = await start_backend()
    body = (
        '{"kind":"Status","apiVersion":"v1","status":"Failure","message":"forbidden: User '
        '\\"system:kube-aggregator\\" cannot get path \\"/apis/demo.example.com/v1\\"","code":403}'
    )

    async def answer(_request: web.Request) -> web.StreamResponse:
        if code == 304:
            return web.Response(status=304)
        headers = {"Location": "http://attacker.invalid/steal"} if code == 302 else {}
        return web.Response(status=code, text=body, headers=headers, content_type="application/json")

    backend.routes[DISCOVERY] = answer
    harness.register(backend.port, ca_pem=backend_pki.ca.cert_pem)
    report = await harness.check()
    url = f"https://127.0.0.1:{backend.port}{DISCOVERY}"
    message = report.verdict.message
    assert message.startswith(
        f"failing or missing response from {url}: bad status from {url}: {code} [hop: {hop}; "
    )
    assert f"dialed: 127.0.0.1:{backend.port}" in message
    phrase = {403: "Forbidden", 404: "Not Found", 302: "Found", 304: "Not Modified"}[code]
    assert f"status: {code} {phrase}" in message
    if code == 304:
        assert message.endswith("body: (empty)]")
    else:
        assert (
            'body: {"kind":"Status","apiVersion":"v1","status":"Failure","message":"forbidden: User'
            in message
        )
    if hop == "redirect":
        assert "redirects are not followed" in message
        assert "attacker.invalid" not in message
    assert states(report)[-1] == ("http", FAIL)
    assert all(r.raw_path == DISCOVERY for r in backend.received)  # nothing followed


async def test_timeout(harness: Harness, start_backend: StartBackend, backend_pki: BackendPKI) -> None:
    backend = await start_backend()
    release = asyncio.Event()

    async def hang(_request: web.Request) -> web.StreamResponse:
        await release.wait()
        return web.Response(text="late")

    backend.routes[DISCOVERY] = hang
    harness.register(backend.port, ca_pem=backend_pki.ca.cert_pem)
    harness.probe.timeout = 0.3
    try:
        report = await harness.check()
    finally:
        release.set()
    url = f"https://127.0.0.1:{backend.port}{DISCOVERY}"
    assert report.verdict.message.startswith(
        f'failing or missing response from {url}: Get "{url}": context deadline exceeded '
        "(Client.Timeout exceeded while awaiting headers) [hop: timeout; "
    )
    assert "no response within 0.3s" in report.verdict.message


async def test_headless_service_is_upstreams_resolver_error(harness: Harness) -> None:
    harness.register(443, ca_pem=None, cluster_ip="None")
    report = await harness.check()
    assert report.verdict.reason == "FailedDiscoveryCheck"
    assert report.verdict.message == 'cannot route to service with ClusterIP "None" [hop: service]'


async def test_denied_address_is_never_dialed(harness: Harness) -> None:
    harness.register(443, ca_pem=None, cluster_ip="169.254.169.254")
    report = await harness.check()
    assert report.verdict.message == (
        "address 169.254.169.254 of service demo/api is in --backend-deny-cidrs range 169.254.0.0/16 "
        "[hop: deny-cidr]"
    )
    assert states(report)[-1] == ("address", FAIL)


async def test_unusable_ca_bundle(harness: Harness) -> None:
    manifest = apiservice_manifest(port=443, ca_pem=b"not a certificate")
    harness.add(
        manifest, service_manifest(port=443), endpointslice_manifest("api-1", [("127.0.0.1", True)], port=443)
    )
    report = await harness.check()
    assert report.verdict.message.startswith(
        "unable to load root certificates: unable to parse bytes as PEM block [hop: transport; "
    )


# --- up to five attempts, hedged; the first 2xx wins -------------------------------------------------------


class ScriptedProbe(DiscoveryProbe):
    """Attempts answered from a script, each after its delay, to pin down the race."""

    def __init__(self, harness: Harness, script: list[tuple[float, Attempt]]) -> None:
        super().__init__(harness.backends, hedge_after=0.2)
        self.script = list(script)
        self.started: list[float] = []

    async def attempt(
        self, svc: object, path: str, *, deadline: float | None = None, target: object = None
    ) -> Attempt:
        delay, result = self.script.pop(0)
        self.started.append(asyncio.get_running_loop().time())
        await asyncio.sleep(delay)  # the scripted attempt takes this long
        return result


def failure(cause: str) -> Attempt:
    return Attempt(error=BackendError(Hop.CONNECT, cause, url="https://10.0.0.1:443/apis/g/v"))


async def test_first_success_wins_over_failures(harness: Harness) -> None:
    harness.register(443, ca_pem=None)
    svc = harness.store.apiservice(APISERVICE)
    assert svc is not None
    ok = Attempt(status=200, url="https://10.0.0.2:443/apis/g/v")
    probe = ScriptedProbe(
        harness,
        [(0.0, failure("a")), (0.01, failure("b")), (0.02, ok), (30, failure("c")), (30, failure("d"))],
    )
    started = asyncio.get_running_loop().time()
    result, failed = await probe.run(svc, "/apis/g/v")
    assert result is ok and failed == 2
    assert asyncio.get_running_loop().time() - started < 10  # the 30 s ones were not awaited


async def test_a_quick_success_is_the_only_attempt(harness: Harness) -> None:
    harness.register(443, ca_pem=None)
    svc = harness.store.apiservice(APISERVICE)
    assert svc is not None
    ok = Attempt(status=200, url="https://10.0.0.2:443/apis/g/v")
    probe = ScriptedProbe(harness, [(0.0, ok)] + [(0.0, failure(str(i))) for i in range(4)])
    assert await probe.run(svc, "/apis/g/v") == (ok, 0)
    assert len(probe.started) == 1  # a healthy backend gets one request per check, not five


async def test_a_slow_first_attempt_brings_in_the_others(harness: Harness) -> None:
    harness.register(443, ca_pem=None)
    svc = harness.store.apiservice(APISERVICE)
    assert svc is not None
    ok = Attempt(status=200, url="https://10.0.0.2:443/apis/g/v")
    probe = ScriptedProbe(harness, [(30, failure("hanging")), (0.0, ok)] + [(30, failure("x"))] * 3)
    started = asyncio.get_running_loop().time()
    result, failed = await probe.run(svc, "/apis/g/v")
    assert result is ok and failed == 0
    assert len(probe.started) == 5
    assert probe.started[1] - started >= 0.2  # the hedge waited for the first one
    assert asyncio.get_running_loop().time() - started < 10  # not the 30 s of the others


async def test_all_failing_reports_the_last_error(harness: Harness) -> None:
    harness.register(443, ca_pem=None)
    svc = harness.store.apiservice(APISERVICE)
    assert svc is not None
    probe = ScriptedProbe(
        harness,
        [
            (0.0, failure("a")),
            (0.03, failure("late")),
            (0.01, failure("b")),
            (0.0, failure("c")),
            (0.02, failure("d")),
        ],
    )
    result, failed = await probe.run(svc, "/apis/g/v")
    assert failed == 5
    assert result.error is not None and result.error.cause == "late"


async def test_the_check_makes_five_attempts(
    harness: Harness, start_backend: StartBackend, backend_pki: BackendPKI
) -> None:
    backend = await start_backend()

    async def refuse(_request: web.Request) -> web.StreamResponse:
        return web.Response(status=503, text="not yet")

    backend.routes[DISCOVERY] = refuse
    harness.register(backend.port, ca_pem=backend_pki.ca.cert_pem)
    await harness.check()
    assert len(backend.seen_by("system:kube-aggregator")) == 5


async def test_a_verdict_about_an_apiservice_that_changed_meanwhile_is_dropped(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A check that started before a new caBundle landed must not record its (stale) failure over
    the changed APIService: the change asked for a check of its own."""
    from aggregator.availability import checker as checker_module
    from aggregator.availability.checker import AvailabilityChecker
    from aggregator.availability.status import MemoryStatus

    harness.register(443, ca_pem=None)
    started, release = asyncio.Event(), asyncio.Event()
    checked: list[bytes] = []

    async def slow_check(svc: Any, store: Any, probe: Any, **_: Any) -> Report:
        checked.append(svc.ca_bundle)
        if len(checked) == 1:
            started.set()
            await release.wait()
            return Report(svc.name, failed_discovery_check("the old caBundle fails", []))
        return Report(svc.name, passed())

    monkeypatch.setattr(checker_module, "check_apiservice", slow_check)
    checker = AvailabilityChecker(harness.store, harness.probe, harness.metrics, MemoryStatus())
    harness.store.add_listener(checker.on_store_event)  # as the composition root subscribes it
    recorded: list[bool | None] = []
    checker.add_listener(lambda name: recorded.append(getattr(checker.verdict(name), "available", None)))
    harness.store.mark_synced()
    await checker.start()
    try:
        await started.wait()
        harness.register(443, ca_pem=b"-----BEGIN CERTIFICATE-----\nnew\n-----END CERTIFICATE-----\n")
        release.set()
        await until(lambda: len(checked) == 2, what="the re-check of the changed APIService")
        await until(lambda: checker.verdict(APISERVICE) is not None, what="its verdict")
        verdict = checker.verdict(APISERVICE)
        assert verdict is not None and verdict.available
        assert recorded == [True]  # the failure about the old caBundle was never the verdict
    finally:
        await checker.stop()


async def test_with_endpoint_routing_a_check_passes_while_any_endpoint_answers(
    pki: PKI, tmp_path: Path, start_backend: StartBackend, backend_pki: BackendPKI
) -> None:
    """Two of three ready endpoints refuse connections (nothing listens on 127.0.0.2 and .3): the
    check still finds the one that answers, with five attempts and with the one a known-down
    backend gets. Upstream sends all of a check's attempts to one random endpoint."""
    backend = await start_backend()
    harness = Harness(local_options(pki, str(tmp_path), enable_aggregator_routing=True))
    try:
        harness.add(
            apiservice_manifest(port=backend.port, ca_pem=backend_pki.ca.cert_pem, available=False),
            service_manifest(port=backend.port),
            endpointslice_manifest(
                "api-1", [("127.0.0.2", True), ("127.0.0.1", True), ("127.0.0.3", True)], port=backend.port
            ),
        )
        svc = harness.store.apiservice(APISERVICE)
        assert svc is not None
        for attempts in [None] * 8 + [1] * 8:
            report = await check_apiservice(
                svc, harness.store, harness.probe, detail=False, attempts=attempts
            )
            assert report.verdict == passed(), report.verdict.message
        # Every check reached it; the hedges after a refused first attempt cycle over the three.
        assert 16 <= len(backend.seen_by("system:kube-aggregator")) <= 16 + 8 * 2
    finally:
        await harness.close()
