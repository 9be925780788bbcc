"""The local-mode manifests for the sample are accepted by the gateway's own manifest decoder."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from aggregator.commands.wardle import MODULE, local_manifests
from aggregator.model.apiservice import APIService
from aggregator.model.objects import EndpointSlice, Service
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


def test_the_demo_runs_the_sample_as_a_program_of_its_own_package(tmp_path: Path) -> None:
    from aggregator.commands.demo import sample_command
    from aggregator.commands.demofiles import DemoLayout

    command = sample_command(DemoLayout(tmp_path), 9443, "127.0.0.1")
    assert command[1:3] == ["-m", MODULE]
    assert importlib.util.find_spec(MODULE) is not None  # installed beside the gateway (make demo, make test)


async def test_a_demo_without_the_sample_installed_says_how_to_get_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from aggregator.commands import demo

    real = importlib.util.find_spec
    # demo.py's importlib.util is this very module: patching it here patches what run_demo calls.
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == MODULE else real(name, *a)
    )
    certs = tmp_path / "certs"
    assert await demo.run_demo(str(certs), gateway_port=0) == 1
    err = capsys.readouterr().err
    assert "the sample extension API server (sample_apiserver) is not installed" in err
    assert "make demo" in err and "pip install -e samples/wardle" in err
    assert not certs.exists()  # refused before the lock, the ports and the files
