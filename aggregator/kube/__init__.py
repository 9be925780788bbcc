"""Talking to kube-apiserver: the declared calls (`calls.py`) and the one client that makes them."""

from aggregator.kube.calls import ApiCall
from aggregator.kube.client import (
    KubeAPIError,
    KubeClient,
    KubeError,
    KubeResponse,
    KubeUnreachable,
    ServerTrust,
)

__all__ = [
    "ApiCall",
    "KubeAPIError",
    "KubeClient",
    "KubeError",
    "KubeResponse",
    "KubeUnreachable",
    "ServerTrust",
]
