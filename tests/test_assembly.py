"""The composition root's `serving=False`: the control process of `--workers N` never listens, so
nothing of its request path follows the APIServices it loads (each cost the control about 2 KB at
5000 APIServices); its store and discovery fetches follow them as in one process."""

from __future__ import annotations

from pathlib import Path

import yaml

from aggregator.assembly import build_gateway
from aggregator.config import complete
from tests.support.backend import BackendPKI, apiservice_manifest, endpointslice_manifest, service_manifest
from tests.support.gateway import local_options
from tests.support.pki import PKI
from tests.support.ports import free_port

GROUP = "held.example.com"
NAME = f"v1.{GROUP}"


def write_folder(apiservices_dir: Path, backend_pki: BackendPKI) -> None:
    port = free_port()  # nothing listens: the checker finds it down
    docs = [
        apiservice_manifest(port=port, ca_pem=backend_pki.ca.cert_pem, group=GROUP, service="held"),
        service_manifest(port=port, name="held"),
        endpointslice_manifest("held-1", [("127.0.0.1", True)], port=port, service="held"),
    ]
    del docs[0]["status"]
    (apiservices_dir / "held.yaml").write_text(yaml.safe_dump_all(docs))


async def test_a_gateway_that_serves_nothing_holds_no_request_path_per_apiservice(
    pki: PKI, apiservices_dir: Path, backend_pki: BackendPKI
) -> None:
    write_folder(apiservices_dir, backend_pki)
    config = complete(local_options(pki, str(apiservices_dir)))
    held: dict[bool, tuple[bool, bool, bool, bool]] = {}
    for serving in (True, False):
        gateway = build_gateway(config, serving=serving)
        await gateway.start()
        try:  # the folder is loaded as the gateway starts, and each event handled as it happens
            held[serving] = (
                gateway.proxy.served(NAME) is not None,
                gateway.control.discovery.legacy.has_group(GROUP),
                gateway.store.apiservice(NAME) is not None,
                NAME in gateway.control.discovery.fetcher.states,
            )
        finally:
            await gateway.stop()
    # One process serving: routed, and listed in legacy `/apis`; a control of workers: neither, but
    # its store and its discovery fetches hold the APIService as before.
    assert held[True] == (True, True, True, True)
    assert held[False] == (False, False, True, True)
