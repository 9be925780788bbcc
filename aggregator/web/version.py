"""`/version` in kube-apiserver's shape (local mode; in kube mode kube-apiserver answers it).

What a client reads here is a Kubernetes version: kubectl parses `gitVersion` as semver and warns
when its minor differs from the client's by more than one (kubectl `pkg/cmd/version/skew_warning.go
getVersionSkewWarning`), and an unparseable one makes `kubectl version` fail. So the gateway reports
the Kubernetes release whose API behaviour it implements (kube-aggregator and k8s.io/apiserver
v0.33: aggregated discovery v2, the apiregistration.k8s.io/v1 it serves), and carries its own
version as semver build metadata, the way distributions do (`v1.33.0+k3s1`):
`v1.33.0+aggregator.0.1.0`. The same pair is exported as `aggregator_build_info`.
"""

from __future__ import annotations

import platform
import re

from aggregator import __version__
from aggregator.web.context import RequestContext
from aggregator.web.responses import json_response
from aggregator.web.serverrequest import Response

# The Kubernetes release the gateway's API surface follows (major, minor, patch).
KUBERNETES_VERSION = (1, 33, 0)

_NOT_IDENTIFIER = re.compile(r"[^0-9A-Za-z-]")


def build_metadata(version: str = __version__) -> str:
    """`aggregator.<version>` as semver build identifiers (`[0-9A-Za-z-]`, dot-separated, non-empty)."""
    parts = [_NOT_IDENTIFIER.sub("-", part) for part in version.split(".") if part]
    return ".".join(["aggregator", *parts])


def kubernetes_version() -> str:
    major, minor, patch = KUBERNETES_VERSION
    return f"v{major}.{minor}.{patch}"


def git_version() -> str:
    return f"{kubernetes_version()}+{build_metadata()}"


def version_info() -> dict[str, str]:
    """`version.Info`'s fields: the Kubernetes level, the gateway in the build metadata."""
    major, minor, _ = KUBERNETES_VERSION
    return {
        "major": str(major),
        "minor": str(minor),
        "gitVersion": git_version(),
        "gitCommit": "",
        "gitTreeState": "",
        "buildDate": "",
        "goVersion": f"python{platform.python_version()}",
        "compiler": platform.python_implementation().lower(),
        "platform": f"{platform.system().lower()}/{platform.machine()}",
    }


async def serve_version(ctx: RequestContext) -> Response:
    return json_response(ctx, version_info())
