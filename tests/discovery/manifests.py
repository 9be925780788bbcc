"""APIService manifests for discovery tests."""

from __future__ import annotations

from pathlib import Path

import yaml


def apiservice(
    name: str,
    gpm: int,
    vp: int,
    *,
    service: tuple[str, str] | None = ("default", "backend"),
    port: int | None = None,
    ca_bundle: str | None = None,
    insecure: bool = False,
) -> dict[str, object]:
    version, _, group = name.partition(".")
    spec: dict[str, object] = {
        "group": group,
        "version": version,
        "groupPriorityMinimum": gpm,
        "versionPriority": vp,
    }
    if service is not None:
        ref: dict[str, object] = {"namespace": service[0], "name": service[1]}
        if port is not None:
            ref["port"] = port
        spec["service"] = ref
        if insecure:
            spec["insecureSkipTLSVerify"] = True
        if ca_bundle is not None:
            spec["caBundle"] = ca_bundle
    return {
        "apiVersion": "apiregistration.k8s.io/v1",
        "kind": "APIService",
        "metadata": {"name": name},
        "spec": spec,
    }


def write_manifests(folder: Path, docs: list[dict[str, object]], name: str = "apiservices.yaml") -> None:
    (folder / name).write_text(yaml.safe_dump_all(docs))
