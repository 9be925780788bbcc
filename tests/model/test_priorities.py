"""The built-in priority table (aggregator/model/priorities.json): where it came from, and what it says."""

from __future__ import annotations

import json
from collections import defaultdict
from importlib import resources
from typing import Any

from aggregator.discovery.aggregated import load_builtin_priorities


def raw() -> dict[str, Any]:
    text = resources.files("aggregator.model").joinpath("priorities.json").read_text()
    data: dict[str, Any] = json.loads(text)
    return data


def test_the_table_names_the_upstream_files_it_was_read_from() -> None:
    source = raw()["source"]
    assert source["repository"] == "kubernetes/kubernetes"
    assert source["generic"]["file"] == "pkg/controlplane/apiserver/aggregator.go"
    assert source["generic"]["symbol"] == "DefaultGenericAPIServicePriorities"
    assert source["generic"]["commit"] == "008b3652959ca58af8be3fb5b6ecfe9ae7638282"
    assert source["kube"]["file"] == "cmd/kube-apiserver/app/aggregator.go"
    assert source["kube"]["symbol"] == "apiVersionPriorities"
    # No kubernetes/kubernetes commit is claimed that was not read: the copy read is named instead.
    assert source["kube"]["commit"] is None
    read_from = source["kube"]["read_from"]
    assert read_from["repository"] == "openshift/microshift"
    assert read_from["commit"] == "8e16b12fda5b1dccc41a6de48b3e356cc7d5048b"
    assert read_from["path"] == "deps/github.com/openshift/kubernetes/cmd/kube-apiserver/app/aggregator.go"
    assert read_from["kubernetes"].startswith("v1.36.2 ")


def test_size_and_pinned_entries() -> None:
    table = load_builtin_priorities()
    assert len(table) == 51
    assert table["v1"] == (18000, 1)
    assert table["apps/v1"] == (17800, 15)
    assert table["certificates.k8s.io/v1beta1"] == (17300, 9)
    assert table["coordination.k8s.io/v1alpha2"] == (16500, 12)
    assert table["flowcontrol.apiserver.k8s.io/v1"] == (16100, 21)
    assert table["resource.k8s.io/v1beta2"] == (16200, 15)
    assert table["resource.k8s.io/v1alpha3"] == (16200, 1)  # the kube map overrides the generic 15900/9
    assert table["storagemigration.k8s.io/v1beta1"] == (15800, 9)
    assert table["scheduling.k8s.io/v1"] == (16600, 15)
    assert table["scheduling.k8s.io/v1alpha2"] == (16600, 2)


def test_dra_ga_outranks_its_betas() -> None:
    """resource.k8s.io/v1 (DRA's GA version, 1.34) sorts with its group, ahead of every beta."""
    table = load_builtin_priorities()
    assert table["resource.k8s.io/v1"] == (16200, 21)
    dra = sorted((v for k, v in table.items() if k.startswith("resource.k8s.io/")), key=lambda p: -p[1])
    assert dra == [(16200, 21), (16200, 15), (16200, 9), (16200, 1)]


def test_every_version_of_a_group_shares_its_group_priority() -> None:
    """Upstream gives each group one groupPriorityMinimum; a mismatch is a copying mistake."""
    by_group: defaultdict[str, set[int]] = defaultdict(set)
    for group_version, (group_priority, version_priority) in load_builtin_priorities().items():
        by_group[group_version.rpartition("/")[0]].add(group_priority)
        assert 0 < version_priority <= 1000 and 0 < group_priority <= 20000, group_version
    assert {group: p for group, p in by_group.items() if len(p) > 1} == {}
