"""The local-mode manifests for the sample are accepted by the gateway's own manifest decoder."""

from __future__ import annotations

from pathlib import Path

from aggregator.model.apiservice import APIService
from aggregator.model.objects import EndpointSlice, Service
from aggregator.sample.registration import local_manifests
from aggregator.sources.manifests import to_object
from tests.support.pki import PKI


def test_manifests_decode_as_store_objects(pki: PKI) -> None:
    ca = Path(pki.path("ca.crt")).read_bytes()
    objects = [to_object(doc) for doc in local_manifests(ca, 8444)]
    apiservices = [o for o in objects if isinstance(o, APIService)]
    assert sorted(s.name for s in apiservices) == [
        "v1alpha1.wardle.example.com",
        "v1beta1.wardle.example.com",
    ]
    assert all(
        s.ca_bundle == ca and s.service is not None and s.service.server_name == "api.wardle.svc"
        for s in apiservices
    )
    assert sum(isinstance(o, Service) for o in objects) == 1
    (endpoints,) = [o for o in objects if isinstance(o, EndpointSlice)]
    assert endpoints.endpoints[0].addresses == ("127.0.0.1",)
