"""What the demo knows of the sample server it runs: how to start it, and the local-mode manifests
that register it (APIServices, Service, EndpointSlice), as upstream ships sample-apiserver's
APIServices beside the server rather than inside it.

The sample (`samples/wardle/`, the `sample_apiserver` package) is not part of the gateway's
package: the demo runs it as a program and never imports it. The demo (and tests) write these
manifests into the `--apiservices-dir` folder so the gateway routes wardle.example.com to a sample
server listening on this machine. The gateway verifies the sample's serving certificate against
`ca_bundle` with the server name `<service>.<namespace>.svc`, so that name must be in the
certificate.
"""

from __future__ import annotations

import base64
from typing import Any

# The sample's API group (samples/wardle/sample_apiserver/api.py) and upstream sample-apiserver's
# registration: group priority 1000; v1beta1 above v1alpha1.
GROUP = "wardle.example.com"
GROUP_PRIORITY_MINIMUM = 1000
VERSION_PRIORITIES = {"v1beta1": 15, "v1alpha1": 9}
VERSIONS = tuple(VERSION_PRIORITIES)
# What the demo runs: the sample package's entry point (installed beside the gateway by `make demo`).
MODULE = "sample_apiserver"


def local_manifests(
    ca_bundle: bytes,
    port: int,
    *,
    address: str = "127.0.0.1",
    namespace: str = "wardle",
    service: str = "api",
) -> list[dict[str, Any]]:
    """Both APIServices, a Service and an EndpointSlice, all pointing at `address:port`.

    The Service's cluster IP is `address` and its port is `port`, so the gateway reaches the sample
    with its default ClusterIP resolver as well as with `--enable-aggregator-routing`.
    """
    docs: list[dict[str, Any]] = []
    for version, priority in VERSION_PRIORITIES.items():
        docs.append(
            {
                "apiVersion": "apiregistration.k8s.io/v1",
                "kind": "APIService",
                "metadata": {"name": f"{version}.{GROUP}"},
                "spec": {
                    "group": GROUP,
                    "version": version,
                    "groupPriorityMinimum": GROUP_PRIORITY_MINIMUM,
                    "versionPriority": priority,
                    "service": {"namespace": namespace, "name": service, "port": port},
                    "caBundle": base64.b64encode(ca_bundle).decode(),
                },
            }
        )
    docs.append(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"namespace": namespace, "name": service},
            "spec": {
                "clusterIP": address,
                "ports": [{"name": "https", "port": port, "targetPort": port, "protocol": "TCP"}],
            },
        }
    )
    docs.append(
        {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "namespace": namespace,
                "name": f"{service}-local",
                "labels": {"kubernetes.io/service-name": service},
            },
            "addressType": "IPv6" if ":" in address else "IPv4",
            "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
            "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
        }
    )
    return docs
