"""Which RBAC objects the folder holds, read as the folder source reads its manifests."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import yaml

from aggregator.auth.rbacfolder import RBACFolder
from tests.support.rbac import cluster_role, cluster_role_binding, rule, user

READER = cluster_role("reader", rule(["get"], ["g"], ["r"]))
BINDING = cluster_role_binding("alice-reads", "reader", user("alice"))


def loaded(folder: Path) -> RBACFolder:
    rbac = RBACFolder(folder)
    rbac.reload(initial=True)
    return rbac


def test_lists_and_mixed_files_are_read(tmp_path: Path) -> None:
    (tmp_path / "list.yaml").write_text(
        yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [READER]})
    )
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "api", "namespace": "x"}}
    (tmp_path / "mixed.yaml").write_text(yaml.safe_dump_all([service, BINDING]))
    policy = loaded(tmp_path).current
    assert policy.present and policy.counts == {"ClusterRole": 1, "ClusterRoleBinding": 1}
    assert "reader" in policy.cluster_roles


def test_the_same_object_in_two_files_the_later_wins(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(READER))
    (tmp_path / "b.yaml").write_text(yaml.safe_dump(cluster_role("reader", rule(["list"], ["g"], ["r"]))))
    with caplog.at_level(logging.WARNING, logger="aggregator.auth.rbacfolder"):
        policy = loaded(tmp_path).current
    assert policy.cluster_roles["reader"][0].verbs == ("list",)
    assert "RBAC object defined in two files; the later file wins" in caplog.text


def test_files_without_rbac_are_not_its_business(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "broken.yaml").write_text("kind: APIService\nspec: [\n")
    (tmp_path / "binary.yaml").write_bytes(b"\xff\xfe")
    with caplog.at_level(logging.DEBUG, logger="aggregator.auth.rbacfolder"):
        policy = loaded(tmp_path).current
    assert not policy.present
    assert caplog.records == []  # the folder source reports those files


def test_a_broken_rbac_file_counts_as_rbac_from_the_start_and_removing_it_does_not(tmp_path: Path) -> None:
    path = tmp_path / "rbac.yaml"
    path.write_text(yaml.safe_dump_all([READER, BINDING]) + "- {\n")
    rbac = loaded(tmp_path)
    assert rbac.current.present and rbac.current.counts == {}
    path.unlink()
    rbac.reload()
    assert not rbac.current.present


def test_listeners_hear_every_change_with_the_previous_policy(tmp_path: Path) -> None:
    rbac = RBACFolder(tmp_path)
    heard: list[tuple[bool, bool]] = []
    rbac.add_listener(lambda new, old: heard.append((old.present, new.present)))
    rbac.reload(initial=True)
    (tmp_path / "rbac.yaml").write_text(yaml.safe_dump(READER))
    rbac.reload()
    (tmp_path / "other.yaml").write_text("kind: Service\n")  # no RBAC: nothing to hear
    rbac.reload()
    assert heard == [(False, False), (False, True)]


def test_a_refused_object_is_a_problem_of_its_file_until_fixed(tmp_path: Path) -> None:
    from aggregator.sources.problems import REFUSED

    path = tmp_path / "rbac.yaml"
    path.write_text(yaml.safe_dump_all([READER, BINDING]))
    rbac = loaded(tmp_path)
    assert rbac.problems() == []
    bad = cluster_role("reader", rule(["get"], ["g"], ["r"]))
    bad["rules"][0]["verbs"] = []
    path.write_text(yaml.safe_dump_all([bad, BINDING]))
    rbac.reload()
    (problem,) = rbac.problems()
    assert (problem.path, problem.what, problem.kept) == (path, REFUSED, 1)
    assert "ClusterRole.rbac.authorization.k8s.io \"reader\" is invalid" in problem.reason
    assert problem.describe().endswith("(refused; its previous version still served)")
    path.unlink()
    rbac.reload()
    assert rbac.problems() == []
