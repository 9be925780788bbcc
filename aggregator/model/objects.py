"""`v1` Service and `discovery.k8s.io/v1` EndpointSlice: only the fields routing and availability need.

Unlike an APIService (served back as it was written), their manifests are not kept: nothing reads
them, and every process of the gateway (the control and each worker) would hold a copy of each,
about 2 KB a Service or slice, most of the objects' memory at thousands of Services.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aggregator.model.decode import DecodeError, int32, mapping, sequence, shared
from aggregator.model.decode import field as decode_field

SERVICE_NAME_LABEL = "kubernetes.io/service-name"


@dataclass(frozen=True, slots=True)
class ServicePort:
    name: str
    port: int
    target_port: int | str | None = None
    protocol: str = "TCP"


@dataclass(frozen=True, slots=True)
class Service:
    namespace: str
    name: str
    type: str = "ClusterIP"
    cluster_ip: str = ""
    ports: tuple[ServicePort, ...] = ()
    external_name: str = ""
    resource_version: str = ""

    def port_by_number(self, port: int) -> ServicePort | None:
        return next((p for p in self.ports if p.port == port), None)


@dataclass(frozen=True, slots=True)
class EndpointPort:
    name: str | None
    port: int | None
    protocol: str = "TCP"


@dataclass(frozen=True, slots=True)
class Endpoint:
    addresses: tuple[str, ...]
    # None means "unknown", which upstream treats as ready.
    ready: bool | None = None

    @property
    def usable(self) -> bool:
        return bool(self.addresses) and self.ready is not False


@dataclass(frozen=True, slots=True)
class EndpointSlice:
    namespace: str
    name: str
    service_name: str
    address_type: str = "IPv4"
    ports: tuple[EndpointPort, ...] = ()
    endpoints: tuple[Endpoint, ...] = ()
    resource_version: str = ""


def _meta(obj: Mapping[str, Any]) -> tuple[str, str, str, Mapping[str, Any]]:
    metadata = mapping(obj, "metadata", "metadata")
    return (
        shared(decode_field(metadata, "namespace", str, "metadata.namespace", "")),
        shared(decode_field(metadata, "name", str, "metadata.name", "")),
        decode_field(metadata, "resourceVersion", str, "metadata.resourceVersion", ""),
        mapping(metadata, "labels", "metadata.labels"),
    )


def decode_service(obj: Mapping[str, Any]) -> Service:
    namespace, name, rv, _ = _meta(obj)
    if not name:
        raise DecodeError("metadata.name: Required value")
    spec = mapping(obj, "spec", "spec")
    ports = []
    for i, item in enumerate(sequence(spec, "ports", "spec.ports")):
        path = f"spec.ports[{i}]"
        if not isinstance(item, dict):
            raise DecodeError(f"{path}: expected object")
        target = item.get("targetPort")
        if target is not None and (isinstance(target, bool) or not isinstance(target, int | str)):
            raise DecodeError(f"{path}.targetPort: expected integer or string")
        ports.append(
            ServicePort(
                name=shared(decode_field(item, "name", str, f"{path}.name", "")),
                port=int32(item, "port", f"{path}.port", 0) or 0,
                target_port=target,
                protocol=shared(decode_field(item, "protocol", str, f"{path}.protocol", "TCP")),
            )
        )
    return Service(
        namespace=namespace or "default",
        name=name,
        type=shared(decode_field(spec, "type", str, "spec.type", "ClusterIP")),
        cluster_ip=shared(decode_field(spec, "clusterIP", str, "spec.clusterIP", "")),
        ports=tuple(ports),
        external_name=decode_field(spec, "externalName", str, "spec.externalName", ""),
        resource_version=rv,
    )


def decode_endpointslice(obj: Mapping[str, Any]) -> EndpointSlice:
    namespace, name, rv, labels = _meta(obj)
    if not name:
        raise DecodeError("metadata.name: Required value")
    ports = []
    for i, item in enumerate(sequence(obj, "ports", "ports")):
        if not isinstance(item, dict):
            raise DecodeError(f"ports[{i}]: expected object")
        port_name = decode_field(item, "name", str, f"ports[{i}].name")
        ports.append(
            EndpointPort(
                name=None if port_name is None else shared(port_name),
                port=int32(item, "port", f"ports[{i}].port"),
                protocol=shared(decode_field(item, "protocol", str, f"ports[{i}].protocol", "TCP")),
            )
        )
    endpoints = []
    for i, item in enumerate(sequence(obj, "endpoints", "endpoints")):
        path = f"endpoints[{i}]"
        if not isinstance(item, dict):
            raise DecodeError(f"{path}: expected object")
        addresses = sequence(item, "addresses", f"{path}.addresses")
        if not all(isinstance(a, str) for a in addresses):
            raise DecodeError(f"{path}.addresses: expected strings")
        conditions = mapping(item, "conditions", f"{path}.conditions")
        endpoints.append(
            Endpoint(
                addresses=tuple(map(shared, addresses)),
                ready=decode_field(conditions, "ready", bool, f"{path}.conditions.ready"),
            )
        )
    service_name = labels.get(SERVICE_NAME_LABEL, "")
    if not isinstance(service_name, str):
        raise DecodeError(f"metadata.labels[{SERVICE_NAME_LABEL}]: expected string")
    return EndpointSlice(
        namespace=namespace or "default",
        name=name,
        service_name=shared(service_name),
        address_type=shared(decode_field(obj, "addressType", str, "addressType", "IPv4")),
        ports=tuple(ports),
        endpoints=tuple(endpoints),
        resource_version=rv,
    )
