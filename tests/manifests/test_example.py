"""manifests/examples/wardle: the sample extension API server, registered behind the gateway.

The example's args are run for real: a sample server started with exactly those flags (file paths
pointed at a test PKI) answers the kubelet's probes without credentials, serves the gateway's
front-proxy certificate (CN front-proxy-client from the front-proxy CA) as the caller it names,
and refuses any other certificate.
"""

from __future__ import annotations

import dataclasses
import ssl
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from sample_apiserver.api import GROUP, VERSIONS
from sample_apiserver.options import build_parser, options_from_args, validate
from sample_apiserver.server import SampleServer

from tests.manifests.k8s import MANIFESTS, Obj, find, load_documents
from tests.support.pki import PKI

EXAMPLE = MANIFESTS / "examples" / "wardle"


def _objects() -> list[Obj]:
    return [
        doc
        for path in sorted(EXAMPLE.glob("*.yaml"))
        if path.name != "kustomization.yaml"
        for doc in load_documents(path.read_text())
    ]


@pytest.fixture(scope="module")
def objs() -> list[Obj]:
    return _objects()


@pytest.fixture(scope="module")
def pod(objs: list[Obj]) -> Obj:
    spec: Obj = find(objs, "Deployment", "wardle-apiserver", "wardle")["spec"]["template"]["spec"]
    return spec


def _container(pod: Obj) -> Obj:
    (container,) = pod["containers"]
    return dict(container)


def test_it_runs_the_sample_from_its_own_image(pod: Obj) -> None:
    container = _container(pod)
    # samples/wardle/Dockerfile's image (its ENTRYPOINT is the sample); kustomize sets the tag.
    assert container["image"] == "wardle-apiserver"
    assert "command" not in container
    kustomization = load_documents((EXAMPLE / "kustomization.yaml").read_text())[0]
    assert kustomization["images"] == [{"name": "wardle-apiserver", "newTag": "0.1.0"}]
    options = options_from_args(build_parser().parse_args(container["args"]))
    validate(options)
    assert options.requestheader_allowed_names == ["front-proxy-client"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"https": options.secure_port}


def test_its_files_come_from_the_secret_and_configmap_it_mounts(pod: Obj) -> None:
    container = _container(pod)
    options = options_from_args(build_parser().parse_args(container["args"]))
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    sources = {
        options.tls_cert_file: ("secret", "wardle-serving-cert", "tls.crt"),
        options.tls_private_key_file: ("secret", "wardle-serving-cert", "tls.key"),
        options.requestheader_client_ca_file: ("configMap", "front-proxy-ca", "ca.crt"),
    }
    for path, (kind, name, key) in sources.items():
        assert path is not None
        mount = mounts[str(Path(path).parent)]
        assert mount["readOnly"] is True
        volume = volumes[mount["name"]]
        source = volume[kind]
        assert source.get("secretName", source.get("name")) == name
        assert Path(path).name == key


def test_the_pod_is_locked_down_like_the_gateway(pod: Obj) -> None:
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False  # it makes no kube-apiserver calls
    sc = _container(pod)["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}


def test_the_apiservices_register_what_the_sample_serves_through_its_service(objs: list[Obj]) -> None:
    service = find(objs, "Service", "api", "wardle")
    ports = {p["port"] for p in service["spec"]["ports"]}
    apiservices = [o for o in objs if o["kind"] == "APIService"]
    assert sorted(a["spec"]["version"] for a in apiservices) == sorted(VERSIONS)
    for apiservice in apiservices:
        spec = apiservice["spec"]
        assert apiservice["metadata"]["name"] == f"{spec['version']}.{spec['group']}"
        assert spec["group"] == GROUP
        assert spec["service"] == {"namespace": "wardle", "name": "api", "port": spec["service"]["port"]}
        assert spec["service"]["port"] in ports
        assert not spec.get("insecureSkipTLSVerify"), "verify the backend: caBundle, never skip"
    # The preferred version (listed first in discovery) gets the higher versionPriority.
    by_version = {a["spec"]["version"]: a["spec"]["versionPriority"] for a in apiservices}
    assert by_version[VERSIONS[0]] > by_version[VERSIONS[1]]
    selector = service["spec"]["selector"]
    labels = find(objs, "Deployment", "wardle-apiserver", "wardle")["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= labels.items()


async def test_the_sample_started_with_the_example_flags_trusts_only_the_front_proxy(
    pod: Obj, pki: PKI
) -> None:
    container = _container(pod)
    options = options_from_args(build_parser().parse_args(container["args"]))
    options = dataclasses.replace(
        options,
        bind_address="127.0.0.1",
        secure_port=0,
        tls_cert_file=pki.path("serving.crt"),
        tls_private_key_file=pki.path("serving.key"),
        requestheader_client_ca_file=pki.path("front-proxy-ca.crt"),
    )
    server = SampleServer(options)
    await server.start()
    try:
        anonymous = ssl.create_default_context(cafile=pki.path("ca.crt"))
        front_proxy = pki.client_context("front-proxy-client")
        user = pki.client_context("admin")  # a client-CA certificate: proves who, not "speak for"
        caller: dict[str, Any] = {"X-Remote-User": "alice", "X-Remote-Group": "system:masters"}
        url = f"{server.url}/apis/{GROUP}/{VERSIONS[0]}/namespaces/default/flunders"
        async with aiohttp.ClientSession() as session:
            for probe in ("readinessProbe", "livenessProbe"):
                get = container[probe]["httpGet"]
                async with session.get(f"{server.url}{get['path']}", ssl=anonymous) as response:
                    assert response.status == 200, get
            async with session.get(url, ssl=front_proxy, headers=caller) as response:
                assert response.status == 200, await response.text()
            async with session.get(url, ssl=user, headers=caller) as response:
                assert response.status == 401
    finally:
        await server.stop()
