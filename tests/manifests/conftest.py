"""The discovery-only API server kubectl's client dry runs talk to (tests/manifests/k8s.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.manifests.k8s import (
    KUBECTL,
    DiscoveryServer,
    kustomization_dirs,
    kustomize,
    load_documents,
    manifest_files,
    resource_for,
)


@pytest.fixture(scope="session")
def discovery(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DiscoveryServer, Path]]:
    """A discovery-only API server knowing every kind the manifests use, and a kubeconfig for it:
    the kinds of every file, and of what kustomize generates (the dashboard's ConfigMap)."""
    docs = [doc for path in manifest_files() for doc in load_documents(path.read_text())]
    if KUBECTL is not None:
        docs += [doc for directory in kustomization_dirs() for doc in kustomize(directory)]
    kinds = {(d["apiVersion"], d["kind"]): resource_for(d) for d in docs}
    server = DiscoveryServer([(resource, kind) for (_, kind), resource in sorted(kinds.items())])
    with server.running():
        yield server, server.write_kubeconfig(tmp_path_factory.mktemp("kube") / "config")
