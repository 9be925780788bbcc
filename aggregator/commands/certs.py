"""The PKI a gateway needs, built on cryptography.

Three separate CAs, because each answers a different question:
- the serving CA: "is this really the gateway?" (clients verify our serving certificate);
- the client CA: "which user is calling?" (CN = user, O = groups);
- the front-proxy CA: "may this caller assert someone else's identity in X-Remote-* headers?".
The front-proxy CA must differ from the client CA, or every user certificate could impersonate anyone.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Sequence
from pathlib import Path

import yaml

from aggregator.tls.issue import (
    DEFAULT_HOSTS,
    KeyPair,
    issue_client_cert,
    issue_serving_cert,
    load_pair,
    new_ca,
    write_pair,
)


def kubeconfig(
    server: str, ca_pem: bytes, client: KeyPair, *, user: str = "admin", cluster: str = "aggregator"
) -> dict[str, object]:
    """A kubeconfig with everything embedded, so it works from any directory."""

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": cluster, "cluster": {"server": server, "certificate-authority-data": b64(ca_pem)}}
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate-data": b64(client.cert_pem),
                    "client-key-data": b64(client.key_pem),
                },
            }
        ],
        "contexts": [{"name": f"{user}@{cluster}", "context": {"cluster": cluster, "user": user}}],
        "current-context": f"{user}@{cluster}",
    }


def write_kubeconfig(path: Path, config: dict[str, object]) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        yaml.safe_dump(config, handle, sort_keys=False)


# Files `aggregator certs init` writes, in order.
PKI_FILES = (
    "ca.crt",
    "ca.key",
    "serving.crt",
    "serving.key",
    "client-ca.crt",
    "client-ca.key",
    "admin.crt",
    "admin.key",
    "front-proxy-ca.crt",
    "front-proxy-ca.key",
    "front-proxy-client.crt",
    "front-proxy-client.key",
    "admin.kubeconfig",
)

FRONT_PROXY_CLIENT_CN = "front-proxy-client"


def init_pki(
    directory: Path,
    *,
    hosts: Sequence[str] = (),
    user: str = "admin",
    groups: Sequence[str] = ("system:masters",),
    server: str = "https://127.0.0.1:8443",
    force: bool = False,
) -> list[Path]:
    """Write the full demo/dev PKI into `directory`. Existing files are kept unless `force`.

    Returns the files written. A CA that is kept is reused to sign any missing leaf, so adding
    `--hosts` later only needs `--force` for the serving pair.
    """
    directory.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    def missing(*names: str) -> bool:
        return force or not all((directory / n).exists() for n in names)

    def ca(stem: str, common_name: str) -> KeyPair:
        if missing(f"{stem}.crt", f"{stem}.key"):
            pair = new_ca(common_name)
            written.extend(write_pair(directory, stem, pair))
            return pair
        return load_pair(directory, stem)

    serving_ca = ca("ca", "aggregator-serving-ca")
    if missing("serving.crt", "serving.key") or "ca.crt" in {p.name for p in written}:
        serving = issue_serving_cert(serving_ca, [*DEFAULT_HOSTS, *hosts], common_name="aggregator")
        written.extend(write_pair(directory, "serving", serving))

    client_ca = ca("client-ca", "aggregator-client-ca")
    admin_written = False
    if missing("admin.crt", "admin.key") or "client-ca.crt" in {p.name for p in written}:
        admin = issue_client_cert(client_ca, user, groups)
        written.extend(write_pair(directory, "admin", admin))
        admin_written = True
    else:
        admin = load_pair(directory, "admin")

    front_proxy_ca = ca("front-proxy-ca", "aggregator-front-proxy-ca")
    if missing("front-proxy-client.crt", "front-proxy-client.key") or "front-proxy-ca.crt" in {
        p.name for p in written
    }:
        written.extend(
            write_pair(
                directory, "front-proxy-client", issue_client_cert(front_proxy_ca, FRONT_PROXY_CLIENT_CN)
            )
        )

    if missing("admin.kubeconfig") or admin_written or "ca.crt" in {p.name for p in written}:
        path = directory / "admin.kubeconfig"
        write_kubeconfig(path, kubeconfig(server, serving_ca.cert_pem, admin, user=user))
        written.append(path)
    return written
