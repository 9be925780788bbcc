"""Benchmark: `/apis` from a local-mode gateway holding 100 APIServices, measured with wrk over TLS.

Run from the repository root:  .venv/bin/python benchmarks/discovery.py [--seconds 10] [--connections 32]

Prints requests/s and p50/p99 for the legacy APIGroupList, the aggregated APIGroupDiscoveryList
(when served), a 304 revalidation, and the gateway's `/livez` as the baseline measured in the same
run, with each figure's ratio to the baseline. The gateway runs as its own process with
`--anonymous-auth` (wrk cannot present a client certificate).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import yaml
from wrkbench import WrkResult, fetch, gateway_process, run_wrk

AGGREGATED = "Accept: application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"


def manifests(count: int) -> list[dict[str, object]]:
    """`count` APIServices over count/2 groups, two versions each, remote and local mixed."""
    docs: list[dict[str, object]] = []
    for i in range(count):
        group = f"group{i // 2:03d}.bench.example.com"
        version = "v1" if i % 2 == 0 else "v1beta1"
        spec: dict[str, object] = {
            "group": group,
            "version": version,
            "groupPriorityMinimum": 1000 + (i * 37) % 500,
            "versionPriority": 15 if version == "v1" else 9,
        }
        if i % 4 != 3:
            spec["service"] = {"namespace": "bench", "name": f"backend{i // 2}", "port": 443}
            spec["insecureSkipTLSVerify"] = True
        docs.append({
            "apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
            "metadata": {"name": f"{version}.{group}"}, "spec": spec,
        })  # fmt: skip
    return docs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--apiservices", type=int, default=100)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    opts = {"seconds": args.seconds, "connections": args.connections, "threads": args.threads}

    with tempfile.TemporaryDirectory(prefix="bench-discovery-") as tmp:
        work = Path(tmp)
        folder = work / "apiservices"
        folder.mkdir()
        (folder / "apiservices.yaml").write_text(yaml.safe_dump_all(manifests(args.apiservices)))
        with gateway_process(folder, work) as gateway:
            url = gateway.url
            status, headers, body = fetch(url + "/apis")
            print(f"/apis: {status}, {len(body)} bytes, {len(yaml.safe_load(body)['groups'])} groups")
            results: list[WrkResult] = [run_wrk("baseline /livez", url + "/livez", **opts)]
            results.append(run_wrk("legacy /apis", url + "/apis", **opts))
            results.append(
                run_wrk(
                    "legacy /apis (304)", url + "/apis", headers=[f"If-None-Match: {headers['ETag']}"], **opts
                )
            )
            try:
                status, agg_headers, agg_body = fetch(url + "/apis", {"Accept": AGGREGATED.split(": ", 1)[1]})
            except OSError:  # a build without aggregated discovery answers 406
                agg_headers, agg_body = {}, b""
            if "apidiscovery.k8s.io" in agg_headers.get("Content-Type", ""):
                print(f"aggregated /apis: {status}, {len(agg_body)} bytes")
                results.append(run_wrk("aggregated /apis", url + "/apis", headers=[AGGREGATED], **opts))
            else:
                print("aggregated /apis: not served by this build, skipped")
    baseline = results[0].requests_per_second
    print(
        f"\n{args.connections} connections, {args.threads} wrk threads, {args.seconds}s each, {args.apiservices} APIServices"
    )
    for result in results:
        print(f"{result.line()}   {result.requests_per_second / baseline:>5.2f}x baseline")
    return 0 if all(r.errors == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
