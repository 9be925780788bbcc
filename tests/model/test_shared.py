"""Texts many objects repeat are held once per process, and once in a worker's first state and
each status change it receives: at 5000 APIServices each such field held its own copy in every
process (about 4 MiB each). The test decodes what separate parses (separate files) give."""

from __future__ import annotations

import pickle

import yaml

from aggregator.model.apiservice import APIService, Condition, decode_apiservice
from aggregator.model.objects import EndpointSlice, Service, decode_endpointslice, decode_service

MANIFESTS = """
apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata: {name: v1.a%(i)d.example.com}
spec: {group: a%(i)d.example.com, version: v1, groupPriorityMinimum: 100, versionPriority: 10,
       insecureSkipTLSVerify: true, service: {namespace: team, name: api, port: 8443}}
---
apiVersion: v1
kind: Service
metadata: {namespace: team, name: api}
spec: {clusterIP: 10.0.0.7, ports: [{name: https, port: 8443}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {namespace: team, name: api-%(i)d, labels: {kubernetes.io/service-name: api}}
addressType: IPv4
ports: [{name: https, port: 8443}]
endpoints: [{addresses: [10.1.0.9], conditions: {ready: true}}]
"""


def decoded(i: int) -> tuple[APIService, Service, EndpointSlice]:
    apiservice, service, endpointslice = yaml.safe_load_all(MANIFESTS % {"i": i})
    return decode_apiservice(apiservice), decode_service(service), decode_endpointslice(endpointslice)


def test_repeated_texts_of_separately_parsed_objects_are_one_copy() -> None:
    (a1, s1, e1), (a2, s2, e2) = decoded(1), decoded(2)
    assert a1.service is not None and a2.service is not None
    assert a1.service.namespace is a2.service.namespace is s1.namespace is e2.namespace
    assert a1.service.name is s2.name is e1.service_name  # the Service's name, wherever it appears
    assert a1.version is a2.version
    assert a1.raw["apiVersion"] is a2.raw["apiVersion"] and a1.raw["kind"] is a2.raw["kind"]
    assert a1.raw["spec"]["service"]["namespace"] is a1.service.namespace  # the manifest shares it
    assert s1.cluster_ip is s2.cluster_ip and s1.ports[0].name is e1.ports[0].name
    assert e1.endpoints[0].addresses[0] is e2.endpoints[0].addresses[0]
    assert e1.address_type is e2.address_type
    # what is distinct stays distinct
    assert (a1.name, a1.group) != (a2.name, a2.group)


def test_a_condition_received_by_a_worker_shares_its_repeated_texts() -> None:
    def sent(message: str) -> Condition:  # each status change is its own pickle
        condition = Condition("Available", "False", "2026-11-28T12:00:00Z", "FailedDiscoveryCheck", message)
        received: Condition = pickle.loads(pickle.dumps(condition, protocol=pickle.HIGHEST_PROTOCOL))
        return received

    first, second = sent("failing: a"), sent("failing: b")
    assert first == Condition(
        "Available", "False", "2026-11-28T12:00:00Z", "FailedDiscoveryCheck", "failing: a"
    )
    assert first.type is second.type and first.status is second.status
    assert first.reason is second.reason and first.last_transition_time is second.last_transition_time
    assert pickle.loads(pickle.dumps(Condition("Available", "True"))) == Condition("Available", "True")
