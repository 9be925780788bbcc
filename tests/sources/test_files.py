"""Local mode's folder source: hot reload within 2 s, broken files and invalid objects isolated."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from aggregator.sources.files import FolderSource
from aggregator.sources.problems import REFUSED, SKIPPED, UNREADABLE
from aggregator.sources.store import Store
from tests.support.logrecords import fields_of
from tests.support.polling import until

APISERVICE = """
apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata:
  name: {version}.{group}
spec:
  group: {group}
  version: {version}
  groupPriorityMinimum: 1000
  versionPriority: {vp}
  service:
    namespace: wardle
    name: api
"""


def manifest(group: str = "wardle.example.com", version: str = "v1alpha1", vp: int = 15) -> str:
    return APISERVICE.format(group=group, version=version, vp=vp)


@pytest.fixture
async def source(tmp_path: Path) -> AsyncIterator[FolderSource]:
    src = FolderSource(tmp_path, Store(), interval=0.2)
    await src.start()
    yield src
    await src.stop()


async def test_add_change_remove_within_two_seconds(source: FolderSource, tmp_path: Path) -> None:
    store = source.store
    assert store.synced
    path = tmp_path / "wardle.yaml"
    path.write_text(manifest())
    await until(lambda: store.apiservice("v1alpha1.wardle.example.com") is not None)
    path.write_text(manifest(vp=99))
    await until(
        lambda: getattr(store.apiservice("v1alpha1.wardle.example.com"), "version_priority", None) == 99
    )
    path.unlink()
    await until(lambda: store.apiservice("v1alpha1.wardle.example.com") is None)


async def test_multi_document_list_json_and_nested_folders(source: FolderSource, tmp_path: Path) -> None:
    (tmp_path / "nested" / "deeper").mkdir(parents=True)
    (tmp_path / "multi.yml").write_text(manifest(version="v1") + "---\n" + manifest(version="v2") + "---\n")
    items = {
        "apiVersion": "v1",
        "kind": "List",
        "items": [
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"namespace": "wardle", "name": "api"},
                "spec": {
                    "clusterIP": "10.0.0.9",
                    "ports": [{"name": "https", "port": 443, "targetPort": 8443}],
                },
            },
            {
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {
                    "namespace": "wardle",
                    "name": "api-x",
                    "labels": {"kubernetes.io/service-name": "api"},
                },
                "addressType": "IPv4",
                "ports": [{"name": "https", "port": 8443}],
                "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": True}}],
            },
            {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "ignored"}},
        ],
    }
    (tmp_path / "nested" / "deeper" / "objects.json").write_text(json.dumps(items))
    (tmp_path / "README.md").write_text("not a manifest")
    store = source.store
    await until(lambda: len(store.apiservices()) == 2 and store.service("wardle", "api") is not None)
    service = store.service("wardle", "api")
    assert service is not None and service.ports[0].target_port == 8443
    slices = store.endpointslices_for("wardle", "api")
    assert [s.endpoints[0].addresses for s in slices] == [("127.0.0.1",)]


async def test_broken_file_keeps_its_objects_and_reports_file_and_line(
    source: FolderSource, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR)
    path = tmp_path / "wardle.yaml"
    path.write_text(manifest())
    await until(lambda: source.store.apiservice("v1alpha1.wardle.example.com") is not None)
    path.write_text(manifest() + "  broken: [unclosed\n")
    await until(lambda: bool(source.problems()))
    assert source.store.apiservice("v1alpha1.wardle.example.com") is not None
    (problem,) = source.problems()
    assert (problem.path, problem.what, problem.kept) == (path, UNREADABLE, 1)
    reason = problem.reason
    assert reason.startswith(f"{path}:")
    assert problem.describe() == f"{reason} (file not loaded; the object it held before still served)"
    line = int(reason.split(":")[1])
    assert line >= 14
    assert any(str(path) in r.fields.get("reason", "") for r in caplog.records if hasattr(r, "fields"))
    path.write_text(manifest(vp=5))
    await until(
        lambda: getattr(source.store.apiservice("v1alpha1.wardle.example.com"), "version_priority", None) == 5
    )
    assert source.problems() == []


async def test_one_broken_file_and_one_valid_apiservice(tmp_path: Path) -> None:
    """The issue's case: start with a broken file beside a valid one; the valid one is served."""
    (tmp_path / "a-broken.json").write_text('{"apiVersion": "apiregistration.k8s.io/v1",\n "kind": ')
    (tmp_path / "b-valid.yaml").write_text(manifest())
    source = FolderSource(tmp_path, Store())
    await source.start()
    try:
        assert [s.name for s in source.store.apiservices()] == ["v1alpha1.wardle.example.com"]
        (problem,) = source.problems()
        assert (problem.path, problem.what, problem.kept) == (tmp_path / "a-broken.json", UNREADABLE, 0)
        assert problem.reason.startswith(f"{tmp_path / 'a-broken.json'}:2:")
        assert problem.describe().endswith(" (file not loaded)")
    finally:
        await source.stop()


async def test_invalid_object_is_skipped_with_every_field_error(
    source: FolderSource, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR)
    bad = manifest(group="other.example.com").replace("name: v1alpha1.other.example.com", "name: wrong-name")
    bad = bad.replace("versionPriority: 15", "versionPriority: 0")
    (tmp_path / "all.yaml").write_text(bad + "---\n" + manifest())
    await until(lambda: source.store.apiservice("v1alpha1.wardle.example.com") is not None)
    assert [s.name for s in source.store.apiservices()] == ["v1alpha1.wardle.example.com"]
    messages = [r.getMessage() for r in caplog.records]
    assert (
        'APIService.apiregistration.k8s.io "wrong-name" is invalid: ['
        'metadata.name: Invalid value: "wrong-name": must be `spec.version+"."+spec.group`: "v1alpha1.other.example.com", '
        "spec.versionPriority: Invalid value: 0: must be positive and less than 1000]"
    ) in messages


async def test_invalid_edit_keeps_the_previous_valid_version(
    source: FolderSource, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR)
    path = tmp_path / "wardle.yaml"
    path.write_text(manifest(vp=7))
    await until(lambda: source.store.apiservice("v1alpha1.wardle.example.com") is not None)
    path.write_text(manifest(vp=7).replace("groupPriorityMinimum: 1000", "groupPriorityMinimum: 0"))
    await until(
        lambda: any(getattr(r, "fields", {}).get("kept_previous") is True for r in caplog.records),
        what="the invalid edit read and refused",
    )
    kept = source.store.apiservice("v1alpha1.wardle.example.com")
    assert kept is not None and kept.group_priority_minimum == 1000


async def test_v1beta1_apiservice_is_refused_with_a_reason(
    source: FolderSource, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR)
    (tmp_path / "old.yaml").write_text(
        manifest().replace("apiregistration.k8s.io/v1", "apiregistration.k8s.io/v1beta1")
    )
    await until(
        lambda: any("v1beta1 APIService is not served" in r.getMessage() for r in caplog.records)
    )
    assert source.store.apiservices() == []


async def test_an_unknown_field_is_refused_in_kube_apiservers_words(
    source: FolderSource, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`kubectl apply` has kube-apiserver refuse a typo (strict field validation); so does the folder.

    The previous valid version stays, as for any refused edit.
    """
    caplog.set_level(logging.ERROR)
    path = tmp_path / "wardle.yaml"
    path.write_text(manifest())
    await until(lambda: source.store.apiservice("v1alpha1.wardle.example.com") is not None)
    path.write_text(manifest().replace("  version: v1alpha1", "  versoin: v1alpha1\n  version: v1alpha1"))
    expected = (
        'APIService in version "v1" cannot be handled as a APIService: strict decoding error: '
        'unknown field "spec.versoin"'
    )
    await until(lambda: any(r.getMessage() == expected for r in caplog.records))
    (record,) = [r for r in caplog.records if r.getMessage() == expected]
    assert fields_of(record)["file"] == str(path)
    assert fields_of(record)["name"] == "v1alpha1.wardle.example.com"
    assert fields_of(record)["kept_previous"] is True
    assert source.store.apiservice("v1alpha1.wardle.example.com") is not None


async def test_every_unknown_field_of_a_service_is_named_with_its_path(
    source: FolderSource, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR)
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"namespace": "wardle", "name": "api", "lables": {"a": "b"}},
        "spec": {"ports": [{"port": 443}, {"nmae": "https", "port": 8443}], "selector": {"any-key": "x"}},
    }
    (tmp_path / "service.json").write_text(json.dumps(service))
    expected = (
        'Service in version "v1" cannot be handled as a Service: strict decoding error: '
        'unknown field "metadata.lables", unknown field "spec.ports[1].nmae"'
    )
    await until(lambda: any(r.getMessage() == expected for r in caplog.records))
    assert source.store.service("wardle", "api") is None


async def test_a_document_of_another_kind_is_said_once_per_file(
    source: FolderSource, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    deployment = "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\n"
    path = tmp_path / "mixed.yaml"
    path.write_text(manifest() + "---\n" + deployment)
    await until(lambda: source.store.apiservice("v1alpha1.wardle.example.com") is not None)
    path.write_text(manifest(vp=20) + "---\n" + deployment + "---\n" + deployment.replace("web", "api"))
    await until(
        lambda: (
            getattr(source.store.apiservice("v1alpha1.wardle.example.com"), "version_priority", None) == 20
        )
    )
    source.reload()
    skipped = [r for r in caplog.records if r.getMessage().startswith("manifest skipped")]
    assert len(skipped) == 1, [r.getMessage() for r in skipped]
    assert fields_of(skipped[0]) == {"file": str(path), "apiVersion": "apps/v1", "kind": "Deployment"}
    assert "reads only APIService (apiregistration.k8s.io/v1), Service (v1)" in skipped[0].getMessage()
    # What another reader of the folder takes (local mode's RBAC) is not said to be skipped.
    source.read_elsewhere = lambda doc: doc.get("kind") == "ClusterRole"
    rbac = "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: r\nrules: []\n"
    (tmp_path / "rbac.yaml").write_text(rbac)
    source.reload()
    assert len([r for r in caplog.records if r.getMessage().startswith("manifest skipped")]) == 1
    # Another file is another line.
    (tmp_path / "other.yaml").write_text(deployment)
    await until(lambda: len([r for r in caplog.records if r.getMessage().startswith("manifest skipped")]) == 2)


async def test_every_document_not_loaded_is_a_problem_until_its_file_is_fixed(
    source: FolderSource, tmp_path: Path
) -> None:
    """The issue's files: a typo'd field, a kind in the wrong letter case, a kind the gateway does
    not read. Each is named with its file and cause, and goes when the file is fixed or removed."""
    typo = tmp_path / "typo.yaml"
    typo.write_text(manifest(vp=7))
    await until(lambda: source.store.apiservice("v1alpha1.wardle.example.com") is not None)
    typo.write_text(manifest(vp=7).replace("groupPriorityMinimum", "groupPriorityMinimun"))
    (tmp_path / "case.yaml").write_text(manifest(group="other.example.com").replace("kind: APIService", "kind: ApiService"))
    (tmp_path / "deploy.yaml").write_text("apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\n")
    await until(lambda: len(source.problems()) == 3)
    case, deploy, refused = source.problems()  # by file name
    assert (case.path, case.what, case.kept) == (tmp_path / "case.yaml", REFUSED, 0)
    assert case.reason == (
        'no matches for kind "ApiService" in version "apiregistration.k8s.io/v1": did you mean "APIService"?'
    )
    assert (deploy.path, deploy.what, deploy.reason) == (tmp_path / "deploy.yaml", SKIPPED, "apps/v1 Deployment")
    assert deploy.describe().startswith(f"{tmp_path / 'deploy.yaml'}: apps/v1 Deployment (skipped: the gateway reads only APIService")
    assert (refused.path, refused.what, refused.kept) == (typo, REFUSED, 1)
    assert refused.describe() == (
        f'{typo}: APIService in version "v1" cannot be handled as a APIService: strict decoding error: '
        'unknown field "spec.groupPriorityMinimun" (refused; its previous version still served)'
    )
    kept = source.store.apiservice("v1alpha1.wardle.example.com")
    assert kept is not None and kept.version_priority == 7
    typo.write_text(manifest(vp=8))
    (tmp_path / "case.yaml").unlink()
    await until(lambda: [p.path for p in source.problems()] == [tmp_path / "deploy.yaml"])


def test_a_kind_differing_in_version_case_too_names_both() -> None:
    from aggregator.sources.manifests import Rejected, to_object

    doc = {"apiVersion": "Discovery.k8s.io/v1", "kind": "Endpointslice", "metadata": {"name": "x"}}
    assert to_object(doc) == Rejected(
        'no matches for kind "Endpointslice" in version "Discovery.k8s.io/v1": '
        'did you mean "EndpointSlice" in version "discovery.k8s.io/v1"?'
    )
