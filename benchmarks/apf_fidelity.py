"""Check: the gateway classifies a request as a real kube-apiserver does (issue 35's fidelity target).

Run from the repository root, with a realk8s folder whose processes are up (its README: `./up.sh`):
    .venv/bin/python benchmarks/apf_fidelity.py /work/realk8s [--workers N]

The gateway runs in kube mode against the folder's kube-apiserver (`realk8s.py`'s `gateway`), so it
follows the cluster's own FlowSchemas and PriorityLevelConfigurations. For users kube-apiserver's
bootstrap configuration tells apart (client certificates issued by the folder's CA: a
system:masters member, a node, the controller manager, the scheduler, a kube-system service
account, any other service account, a plain user; and anonymous), each request is sent to
kube-apiserver directly and through the gateway, over HTTP/1.1 and HTTP/2: an aggregated resource
(proxied by both to sample-apiserver), built-in resources (served by kube-apiserver; the gateway
delegates them), a lease in kube-system (the leader-election schema), `/version`, `/healthz` and
`/metrics`. The `X-Kubernetes-PF-FlowSchema-UID` and `X-Kubernetes-PF-PriorityLevel-UID` the
gateway answers with first must be kube-apiserver's; the FlowSchema's name is printed beside each.
It exits 1 on any difference. A request kube-apiserver refuses with 401 before classifying it
while the gateway serves it (anonymous `/healthz`: the folder's kube-apiserver runs with
`--anonymous-auth=false`, and the gateway always serves its health paths, docs/differences.md)
is not comparable and shows as `n/a`. It never changes the folder or its processes.
"""

from __future__ import annotations

import argparse
import asyncio
import ssl
import subprocess
import sys
import tempfile
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from realk8s import gateway as kube_mode_gateway

from tests.support.h2client import H2Client

KUBE = "https://127.0.0.1:6443"
FS_UID, PL_UID = "x-kubernetes-pf-flowschema-uid", "x-kubernetes-pf-prioritylevel-uid"
# (name, user, groups); None: anonymous
USERS: list[tuple[str, str, tuple[str, ...]] | None] = [
    ("masters", "admin-2", ("system:masters",)),
    ("node", "system:node:n1", ("system:nodes",)),
    ("controller-manager", "system:kube-controller-manager", ()),
    ("scheduler", "system:kube-scheduler", ()),
    ("kube-system-sa", "system:serviceaccount:kube-system:foo", ("system:serviceaccounts", "system:serviceaccounts:kube-system")),
    ("other-sa", "system:serviceaccount:default:bench", ("system:serviceaccounts", "system:serviceaccounts:default")),
    ("plain", "alice", ("devs",)),
    ("monitoring", "prometheus", ("system:monitoring",)),
    None,
]
PATHS = [
    "/apis/wardle.example.com/v1alpha1/namespaces/default/flunders",
    "/api/v1/namespaces/default/pods",
    "/api/v1/nodes/n1",
    "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/kube-controller-manager",
    "/version",
    "/healthz",
    "/metrics",
]


def issue(folder: Path, work: Path, name: str, user: str, groups: tuple[str, ...]) -> None:
    """A client certificate from the folder's CA (RSA, as its pki.sh makes them): CN user, O groups."""
    subject = "/CN=" + user + "".join(f"/O={group}" for group in groups)
    key, csr, crt = (work / f"{name}.{ext}" for ext in ("key", "csr", "crt"))
    subprocess.run(
        ["openssl", "req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-subj", subject, "-out", str(csr)],
        check=True,
        capture_output=True,
    )
    subprocess.run(
        ["openssl", "x509", "-req", "-in", str(csr), "-CA", str(folder / "pki" / "ca.crt"),
        "-CAkey", str(folder / "pki" / "ca.key"), "-CAcreateserial", "-CAserial", str(work / "ca.srl"),
        "-days", "1", "-out", str(crt)],
        check=True,
        capture_output=True,
    )  # fmt: skip


def context(folder: Path, work: Path, who: tuple[str, str, tuple[str, ...]] | None, h2: bool) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(folder / "pki" / "ca.crt"))
    if who is not None:
        name = who[0]
        ctx.load_cert_chain(str(work / f"{name}.crt"), str(work / f"{name}.key"))
    ctx.set_alpn_protocols(["h2"] if h2 else ["http/1.1"])
    return ctx


async def classified(base: str, ctx: ssl.SSLContext, path: str, h2: bool) -> tuple[int, list[str], list[str]]:
    """(status, FlowSchema UIDs, priority level UIDs) of one GET, in the order the answer has them."""
    port = int(base.rsplit(":", 1)[1])
    if h2:
        async with H2Client.connect(port, ctx) as client:
            response = await client.response(client.request("GET", path), timeout=30)
            headers = [(k.lower(), v) for k, v in response.headers]
            status = response.status
    else:
        async with (
            aiohttp.ClientSession() as session,
            session.get(base + path, ssl=ctx, timeout=aiohttp.ClientTimeout(total=30)) as resp,
        ):
            await resp.read()
            headers = [(k.decode().lower(), v.decode()) for k, v in resp.raw_headers]
            status = resp.status
    return status, [v for k, v in headers if k == FS_UID], [v for k, v in headers if k == PL_UID]


async def flow_schema_names(folder: Path) -> dict[str, str]:
    """uid -> name of the cluster's FlowSchemas and priority levels."""
    ctx = ssl.create_default_context(cafile=str(folder / "pki" / "ca.crt"))
    ctx.load_cert_chain(str(folder / "pki" / "admin.crt"), str(folder / "pki" / "admin.key"))
    names: dict[str, str] = {}
    async with aiohttp.ClientSession() as session:
        for kind in ("flowschemas", "prioritylevelconfigurations"):
            async with session.get(f"{KUBE}/apis/flowcontrol.apiserver.k8s.io/v1/{kind}", ssl=ctx) as resp:
                for item in (await resp.json())["items"]:
                    names[item["metadata"]["uid"]] = item["metadata"]["name"]
    return names


async def compare(folder: Path, work: Path, gateway: str) -> int:
    names = await flow_schema_names(folder)
    differences = 0
    for who in USERS:
        label = who[0] if who is not None else "anonymous"
        for h2 in (False, True):
            ctx = context(folder, work, who, h2)
            for path in PATHS:
                kube_status, kube_fs, kube_pl = await classified(KUBE, ctx, path, h2)
                status, fs, pl = await classified(gateway, ctx, path, h2)
                same = fs[:1] == kube_fs[:1] and pl[:1] == kube_pl[:1]
                comparable = not (kube_status == 401 and status != 401)
                differences += comparable and not same
                verdict = "n/a " if not comparable else "ok  " if same else "DIFF"

                def shown(uids: list[str]) -> str:
                    return names.get(uids[0], uids[0]) if uids else "-"

                print(
                    f"{verdict} {label:<18} {'h2' if h2 else 'h1'} {path:<80} "
                    f"kube-apiserver {kube_status} {shown(kube_fs)}/{shown(kube_pl)}   "
                    f"gateway {status} {shown(fs)}/{shown(pl)}",
                    flush=True,
                )
    return differences


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--workers", type=int, default=None)
    args = parser.parse_args()
    folder = args.folder.resolve()
    with tempfile.TemporaryDirectory(prefix="apf-fidelity-") as tmp:
        work = Path(tmp)
        for who in USERS:
            if who is not None:
                issue(folder, work, *who)
        with kube_mode_gateway(folder, work, args.workers) as (gateway, _pid):
            differences = asyncio.run(compare(folder, work, gateway))
    print(f"{differences} differences")
    return 1 if differences else 0


if __name__ == "__main__":
    sys.exit(main())
