"""Where APIService, Service and EndpointSlice objects come from: `--kubeconfig` (kube mode) or
`--apiservices-dir` (local mode). Shared by `serve` and `check`."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from aggregator.kube.client import KubeClient
from aggregator.util.flags import ConfigError, FlagSet, Problems, check_readable

IN_CLUSTER_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")


_HELP = {
    "serve": {
        "--kubeconfig": "kubeconfig of the kube-apiserver to watch APIServices, Services and EndpointSlices in "
        "and to delegate unknown paths to. Without it (and without --apiservices-dir) the in-cluster service "
        "account is used.",
        "--apiservices-dir": "local mode: read APIService, Service and EndpointSlice manifests (*.yaml, *.yml, "
        "*.json) from this folder and reload them on change; no cluster is needed.",
    },
    "check": {
        "--kubeconfig": "kubeconfig of the kube-apiserver to list APIServices, Services and EndpointSlices "
        "from, once. Without it (and without --apiservices-dir) found as kubectl finds it: the first existing "
        "file of $KUBECONFIG, else ~/.kube/config, else the pod's service account.",
        "--apiservices-dir": "check the APIServices of this folder of manifests (*.yaml, *.yml, *.json), read "
        "as a gateway in local mode reads them; a file it would not load (invalid YAML, a refused object, a "
        "kind it does not read) is named and fails the check.",
    },
}


class _Mode:
    """The mode a folder selects, read alike from the options and from the config they complete."""

    apiservices_dir: str | None

    @property
    def local_mode(self) -> bool:
        """Objects come from a folder; the kubeconfig (if any) is only used for reviews."""
        return self.apiservices_dir is not None

    @property
    def kube_mode(self) -> bool:
        return not self.local_mode


@dataclass
class SourceOptions(_Mode):
    kubeconfig: str | None = None
    apiservices_dir: str | None = None

    @property
    def in_cluster(self) -> bool:
        """True when no kubeconfig is given but a pod service account is mounted."""
        return (
            self.kubeconfig is None
            and bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
            and IN_CLUSTER_TOKEN.exists()
        )

    @classmethod
    def add_flags(cls, parser: argparse.ArgumentParser, prefix: str, *, command: str = "serve") -> None:
        """The flags, described for `serve` (what the gateway watches) or `check` (what it reads once)."""
        flags = FlagSet(parser, "object source", prefix)
        flags.add("--kubeconfig", field="kubeconfig", help=_HELP[command]["--kubeconfig"])
        flags.add("--apiservices-dir", field="apiservices_dir", help=_HELP[command]["--apiservices-dir"])

    def validate(self) -> list[ConfigError]:
        problems = Problems()
        problems.check(check_readable, "--kubeconfig", self.kubeconfig)
        if self.apiservices_dir is not None and not Path(self.apiservices_dir).is_dir():
            problems.add("--apiservices-dir", f"{self.apiservices_dir} is not a readable directory")
        if self.apiservices_dir is None and self.kubeconfig is None and not self.in_cluster:
            problems.add(
                "--apiservices-dir",
                "neither --apiservices-dir nor --kubeconfig is set and no in-cluster service account was found",
            )
        return problems.errors

    def apply_to(self, config: SourceTarget) -> None:
        """Whether a pod's service account is mounted is looked at here, once."""
        config.source = SourceConfig(self.kubeconfig, self.apiservices_dir, self.in_cluster)


@dataclass(frozen=True)
class SourceConfig(_Mode):
    """Where objects come from (`SourceOptions.apply_to`): kube mode watches kube-apiserver (with
    `kubeconfig`, or the pod's account), local mode reads `apiservices_dir`."""

    kubeconfig: str | None = None
    apiservices_dir: str | None = None
    in_cluster: bool = False

    def kube_client(self) -> KubeClient | None:
        """The gateway's client: `--kubeconfig` if given, else the pod's service account in kube mode.

        A local-mode gateway gets one only with `--kubeconfig` (then used for reviews alone).
        """
        if self.kubeconfig:
            return KubeClient.from_kubeconfig(self.kubeconfig)
        if self.kube_mode:
            return KubeClient.in_cluster()
        return None


class SourceTarget(Protocol):
    source: SourceConfig
