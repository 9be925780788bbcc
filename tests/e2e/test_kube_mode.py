"""Real kubectl (1.27, 1.32, 1.33) against the gateway as it ships (`aggregator serve` in kube mode,
no CA flags: the cluster's ConfigMap), in front of the fake kube-apiserver, with `--workers 2`
(every kubectl) and `--workers 1` (the newest).

- `kubectl explain` of a built-in type works the moment `/readyz` is 200, although the fake
  kube-apiserver is still settling: its OpenAPI hashes move between the index and the
  group-version GETs, and its documents answer 301 to the current hash, as kube-openapi does.
- `--as` and `--as-group` on both kinds of path: aggregated ones (the gateway checks the
  impersonation with SubjectAccessReviews and tells the backend the impersonated identity) and
  delegated ones (forwarded to kube-apiserver with the `Impersonate-*` headers, which the fake
  judges with the same policy); a refusal reads the same on both.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.support.e2e import FLUNDER
from tests.support.kubestack import REPLICAS_DOC, WARDLE_ADMINS, KubeStack
from tests.support.pki import PKI


def _binaries(*minors: int) -> list[str]:
    main = shutil.which("kubectl")
    if main is None:
        return []
    folder = Path(os.path.realpath(main)).parent
    return [str(folder / f"kubectl.1.{m}") for m in minors if (folder / f"kubectl.1.{m}").exists()]


KUBECTLS = _binaries(27, 32, 33)
pytestmark = [
    pytest.mark.long(45),
    pytest.mark.e2e,
    pytest.mark.skipif(not KUBECTLS, reason="kubectl 1.27/1.32/1.33 not installed"),
]
# Every kubectl against two workers (what the Deployment runs on 2 CPUs); one process with the
# newest: the worker count changes nothing a client can see.
SETUPS = [(binary, 2) for binary in KUBECTLS] + [(binary, 1) for binary in KUBECTLS[-1:]]
IDS = [f"{Path(binary).name}-workers={workers}" for binary, workers in SETUPS]
FLUNDERS = "/apis/wardle.example.com/v1beta1/namespaces/default/flunders"
CONFIGMAPS = "/api/v1/namespaces/default/configmaps"
SECRETS = "/api/v1/namespaces/default/secrets"
MALLORY = 'users "mallory" is forbidden: User "ops" cannot impersonate resource "users" in API group "" at the cluster scope'


def flat(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize(("binary", "workers"), SETUPS, ids=IDS)
async def test_explain_a_built_in_type_the_moment_readyz_is_200(
    binary: str, workers: int, pki: PKI, tmp_path: Path
) -> None:
    async with KubeStack(pki, tmp_path, workers=workers, gateway_args=["--access-log", "all"]) as stack:
        openapi = stack.kube_openapi
        # Still settling: the documents move right after each of the first 2 index reads (so every
        # group-version GET of those reads is a 301 to a newer hash), and apps/v1 is slow to answer:
        # the first download takes over a second, far longer than every other readiness check.
        openapi.settle(2)
        stack.kube.slow(0.5, verb="GET", resource="/openapi/v3/apis/apps/v1")
        await stack.start_gateway()  # ready
        code, out, err = await stack.kubectl(binary)("explain", "deployments.spec.replicas", check=False)
        assert code == 0, err
        text = flat(out)
        assert "KIND: Deployment" in text and "VERSION: v1" in text
        assert "FIELD: replicas <integer>" in text and REPLICAS_DOC in text
        assert openapi.statuses("/openapi/v3/apis/apps/v1")[:3] == [301, 301, 200]  # the settling was met
        assert openapi.settling == 0
        # kubectl offers h2 and the shipped process serves it: every request of kubectl's came over it.
        kubectl_lines = [
            line
            for line in stack.served.log().splitlines()
            if "aggregator.access" in line and "user=kubernetes-admin" in line
        ]
        assert len(kubectl_lines) >= 2, stack.served.log()
        assert all(" protocol=HTTP/2.0" in line for line in kubectl_lines), kubectl_lines


def policy(spec: dict[str, Any]) -> dict[str, Any]:
    """ops may impersonate jane and the group wardle-admins (not mallory); jane may not read secrets."""
    attributes = spec.get("resourceAttributes") or {}
    if "system:masters" in spec.get("groups", []):
        return {"allowed": True}
    if attributes.get("verb") == "impersonate":
        return {"allowed": spec["user"] == "ops" and attributes.get("name") in ("jane", WARDLE_ADMINS)}
    if spec["user"] == "jane" and attributes.get("resource") == "secrets":
        return {"allowed": False}
    return {"allowed": True}


@pytest.mark.parametrize(("binary", "workers"), SETUPS, ids=IDS)
async def test_as_and_as_group_on_aggregated_and_delegated_paths(
    binary: str, workers: int, pki: PKI, tmp_path: Path
) -> None:
    async with KubeStack(pki, tmp_path, policy=policy, workers=workers) as stack:
        kube = stack.kube
        kube.add_object("configmaps", {"metadata": {"name": "settings", "namespace": "default"}})
        await stack.start_gateway()
        manifest = tmp_path / "flunder.yaml"
        manifest.write_text(FLUNDER)
        await stack.kubectl(binary)("create", "-f", str(manifest))  # as admin
        ops = stack.kubectl(binary, "ops")

        # delegated: kube-apiserver (the fake) applies the headers with its own authorizer
        _, out, _ = await ops(
            "get", "configmaps", "-n", "default", "-o", "name", "--as=jane", f"--as-group={WARDLE_ADMINS}"
        )
        assert out.split() == ["configmap/settings"]
        ran_as = [r.identity for r in kube.requests if r.path == CONFIGMAPS]
        assert ran_as == ["jane"]
        code, _, err = await ops("get", "--raw", SECRETS, "--as=jane", check=False)
        assert code != 0 and (
            'secrets is forbidden: User "jane" cannot list resource "secrets" in API group "" in the namespace "default"'
            in err
        ), err
        code, _, delegated_refusal = await ops("get", "--raw", CONFIGMAPS, "--as=mallory", check=False)
        assert code != 0 and MALLORY in delegated_refusal, delegated_refusal

        # aggregated: the gateway checks the impersonation, the backend is told who it is now
        code, _, err = await ops("get", "flunders", "-n", "default", "--as=jane", check=False)
        assert code != 0 and 'User "jane" cannot list resource "flunders"' in err, (
            err
        )  # the sample's own refusal
        _, out, _ = await ops(
            "get", "flunders", "-n", "default", "-o", "name", "--as=jane", f"--as-group={WARDLE_ADMINS}"
        )
        assert out.split() == ["flunder.wardle.example.com/my-flunder"]
        code, _, aggregated_refusal = await ops("get", "--raw", FLUNDERS, "--as=mallory", check=False)
        assert code != 0 and MALLORY in aggregated_refusal, aggregated_refusal
        assert _error_line(aggregated_refusal) == _error_line(delegated_refusal)

        # the gateway asked kube-apiserver about each impersonation, as the caller
        assert stack.reviews is not None
        asked = {(s["user"], s["resourceAttributes"]["resource"], s["resourceAttributes"]["name"])
                 for s in stack.reviews.access_reviews if s.get("resourceAttributes", {}).get("verb") == "impersonate"}  # fmt: skip
        assert {
            ("ops", "users", "jane"),
            ("ops", "groups", WARDLE_ADMINS),
            ("ops", "users", "mallory"),
        } <= asked


def _error_line(stderr: str) -> str:
    return next(line for line in stderr.splitlines() if line.startswith("Error from server"))
