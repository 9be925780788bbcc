"""The shared builder on what neither of its documents exercises, against kube-apiserver's own spec.

The gateway's apiregistration.k8s.io/v1 is cluster-scoped with a status subresource; the sample's
wardle kinds are namespaced or cluster-scoped without one. Here: a namespaced kind with status
(apps/v1 Deployment) and a dotted `.k8s.io` group, with the operation ids, tags, descriptions and
path parameters kube-apiserver's `api/openapi-spec` publishes for them.
"""

from __future__ import annotations

from typing import Any

from aggregator.openapi import builder


def _v3_paths(resource: builder.Resource) -> Any:
    meta = builder.load_meta()
    paths = builder.resource_paths(resource)
    doc = builder.Spec({"title": "t", "version": "v"}, paths, {}, meta["parameters"]).v3()
    return doc["paths"]


def _names(params: list[dict[str, Any]]) -> list[str]:
    return [p["name"] for p in params]


def test_a_namespaced_kind_with_status_is_laid_out_as_upstream() -> None:
    deployments = builder.Resource(
        "apps",
        "v1",
        "Deployment",
        "deployments",
        "io.k8s.api.apps.v1.",
        namespaced=True,
        subresources=("status",),
    )
    paths = _v3_paths(deployments)
    status = paths["/apis/apps/v1/namespaces/{namespace}/deployments/{name}/status"]
    assert status["get"]["operationId"] == "readAppsV1NamespacedDeploymentStatus"
    assert status["get"]["description"] == "read status of the specified Deployment"
    assert status["patch"]["operationId"] == "patchAppsV1NamespacedDeploymentStatus"
    assert status["put"]["tags"] == ["apps_v1"]
    assert _names(status["parameters"]) == ["name", "namespace", "pretty"]
    assert status["parameters"][0]["description"] == "name of the Deployment"
    watch = paths["/apis/apps/v1/watch/namespaces/{namespace}/deployments"]
    assert _names(watch["parameters"]) == [
        "allowWatchBookmarks",
        "continue",
        "fieldSelector",
        "labelSelector",
        "limit",
        "namespace",
        "pretty",
        "resourceVersion",
        "resourceVersionMatch",
        "sendInitialEvents",
        "timeoutSeconds",
        "watch",
    ]
    operation_ids = {
        op["operationId"] for item in paths.values() for m, op in item.items() if m != "parameters"
    }
    assert {
        "createAppsV1NamespacedDeployment",
        "deleteAppsV1CollectionNamespacedDeployment",
        "listAppsV1DeploymentForAllNamespaces",
        "watchAppsV1DeploymentListForAllNamespaces",
        "watchAppsV1NamespacedDeploymentList",
    } <= operation_ids
    create = paths["/apis/apps/v1/namespaces/{namespace}/deployments"]["post"]
    assert create["description"] == "create a Deployment"


def test_operation_names_follow_upstreams_rules() -> None:
    assert builder.operation_id_prefix("rbac.authorization.k8s.io", "v1") == "RbacAuthorizationV1"
    assert builder.operation_tag("rbac.authorization.k8s.io", "v1") == "rbacAuthorization_v1"
    assert (
        builder.operation_id_prefix("flowcontrol.apiserver.k8s.io", "v1beta3")
        == "FlowcontrolApiserverV1beta3"
    )
    assert builder.operation_tag("wardle.example.com", "v1beta1") == "wardleExampleCom_v1beta1"
    assert [builder.article(n) for n in ("Ingress", "APIService", "Endpoints", "Pod")] == [
        " an ",
        " an ",
        " ",
        " a ",
    ]
