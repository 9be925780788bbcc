"""Benchmark: what authorization adds to a request when the SubjectAccessReview cache is warm.

Run from the repository root:  .venv/bin/python benchmarks/auth.py [--seconds 10] [--connections 32]

One in-process gateway (uvloop, real TLS) in local mode with a token file (wrk cannot present a
client certificate) and a kubeconfig pointing at an in-process fake kube-apiserver, so requests
are authorized by SubjectAccessReview (allowed answers cached for an hour, so the cache stays warm
for the whole run). wrk calls `GET /version` with a bearer token:
- "authn only": the same gateway with its authorization gate taken out of the pipeline;
- "authn + authz (warm)": the full pipeline; the one review was made before measuring.
Rounds alternate (baseline, authorized, ...) so drift hits both alike; medians are compared. Then the
gate alone is timed in-process on a cache hit, and the number of reviews made is printed (1).
Last, local mode's RBAC (`--authorization-mode=RBAC`) is timed the same way on a policy of
`--bindings` ClusterRoleBindings, the caller's own last (the worst case: every binding visited).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))


from wrkbench import WrkResult, parse_wrk

from aggregator.auth.authz import Authorizer
from aggregator.auth.modes import PolicyHolder, RBACMode
from aggregator.auth.rbacobjects import compile_policy, decode
from aggregator.auth.verdict import Decision
from aggregator.config import complete
from aggregator.model.userinfo import UserInfo
from aggregator.runners.server import GatewayServer
from aggregator.web.context import RequestContext
from aggregator.web.requestinfo import RequestInfo
from tests.support.contexts import RecordedRequest
from tests.support.fakekube import running_fake_kube
from tests.support.fakereviews import FakeReviews
from tests.support.options import flag_options
from tests.support.pki import make_pki

TOKEN = "bench-token-0123456789abcdef"


async def wrk(label: str, url: str, *, seconds: int, connections: int, threads: int) -> WrkResult:
    proc = await asyncio.create_subprocess_exec(
        "wrk", f"-t{threads}", f"-c{connections}", f"-d{seconds}s", "--latency",
        "-H", f"Authorization: Bearer {TOKEN}", url,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"wrk failed: {err.decode()}")
    return parse_wrk(label, out.decode())


def rbac_cost(bindings: int, rounds: int = 20000) -> float:
    """Microseconds per RBAC decision for a resource request allowed by the last of `bindings`."""
    docs: list[dict[str, object]] = [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "reader"},
            "rules": [{"verbs": ["get", "list"], "apiGroups": ["wardle.example.com"], "resources": ["flunders"]}],
        }
    ]
    for i in range(bindings):
        docs.append(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": f"zz-{i:05d}"},  # after the built-in bindings
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "reader"},
                "subjects": [{"kind": "User", "name": "bench-user" if i == bindings - 1 else f"user-{i}"}],
            }
        )
    policy = compile_policy([decode(d) for d in docs], present=True)
    authorizer = Authorizer(
        always_allow_groups=["system:masters"], always_allow_paths=[], modes=[RBACMode(PolicyHolder(policy))]
    )
    user = UserInfo("bench-user", groups=("bench", "system:authenticated"))
    info = RequestInfo(
        is_resource_request=True,
        path="/apis/wardle.example.com/v1beta1/namespaces/default/flunders",
        verb="list",
        api_group="wardle.example.com",
        api_version="v1beta1",
        namespace="default",
        resource="flunders",
    )
    samples = []
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(rounds):
            verdict = authorizer.decide_now(user, info)
            assert verdict is not None and verdict.decision is Decision.ALLOW
        samples.append((time.perf_counter() - started) / rounds * 1e6)
    return statistics.median(samples)


def gate_cost(authorizer: Authorizer, server: GatewayServer, rounds: int = 20000) -> float:
    """Microseconds per authorization gate call on a cache hit (no event loop involved), with the
    request's context built each time as the pipeline builds it (RequestInfo included)."""
    request = RecordedRequest("GET", "/version")
    user = server.gateway.authenticator.tokens[0].authenticate_token(TOKEN)
    assert isinstance(user, UserInfo)  # a static token: answered without awaiting
    user = user.with_authenticated_group()
    samples = []
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(rounds):
            # A context per request, as the pipeline builds one (RequestInfo included).
            ctx = RequestContext(request, server.gateway.router.match, 0.0)
            ctx.user = user
            if authorizer.gate(ctx) is not None:
                raise AssertionError("a warm-cache authorization did not answer at once")
        samples.append((time.perf_counter() - started) / rounds * 1e6)
    return statistics.median(samples)


async def run(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="bench-auth-") as tmp:
        work = Path(tmp)
        pki = make_pki(work / "pki")
        folder = work / "apiservices"
        folder.mkdir()
        tokens = work / "tokens.csv"
        tokens.write_text(f'{TOKEN},bench-user,uid-1,"bench"\n')
        async with running_fake_kube(work / "fake-kube") as fake:
            reviews = FakeReviews(fake)
            options = flag_options(
                bind_address="127.0.0.1",
                secure_port=0,
                tls_cert_file=pki.path("serving.crt"),
                tls_private_key_file=pki.path("serving.key"),
                apiservices_dir=str(folder),
                token_auth_file=str(tokens),
                kubeconfig=str(fake.kubeconfig),
                # "warm cache": the one review stays valid for the whole run (default TTL is 10 s)
                authorization_webhook_cache_authorized_ttl=3600.0,
            )
            server = GatewayServer(complete(options))
            await server.start()
            try:
                gates = list(server.gateway.pipeline.gates)
                authorizer = next(
                    owner
                    for owner in (getattr(g, "__self__", None) for g in gates)
                    if isinstance(owner, Authorizer)
                )
                authn_only = [g for g in gates if getattr(g, "__self__", None) is not authorizer]
                url = server.url + "/version"
                opts = {"seconds": args.seconds, "connections": args.connections, "threads": args.threads}
                await wrk("warm-up", url, **{**opts, "seconds": 1})
                print(f"reviews before measuring: {len(reviews.access_reviews)} SubjectAccessReview(s)")
                baseline: list[WrkResult] = []
                authorized: list[WrkResult] = []
                for _ in range(args.rounds):
                    server.gateway.pipeline.gates = tuple(authn_only)
                    baseline.append(await wrk("authn only", url, **opts))
                    server.gateway.pipeline.gates = tuple(gates)
                    authorized.append(await wrk("authn + authz (warm)", url, **opts))
                reviewed = len(reviews.access_reviews)
                per_call = gate_cost(authorizer, server)
            finally:
                await server.stop()

    print(
        f"\nGET /version, {args.connections} connections, {args.threads} wrk threads, {args.seconds}s x {args.rounds} rounds each"
    )
    for result in [r for pair in zip(baseline, authorized, strict=True) for r in pair]:
        print(result.line())
    base_rps = statistics.median(r.requests_per_second for r in baseline)
    auth_rps = statistics.median(r.requests_per_second for r in authorized)
    base_p50 = statistics.median(r.p50_ms for r in baseline)
    auth_p50 = statistics.median(r.p50_ms for r in authorized)
    print(f"\nmedian throughput: authn only {base_rps:.0f} req/s, with authorization {auth_rps:.0f} req/s "
          f"-> {auth_rps / base_rps:.3f}x")  # fmt: skip
    print(
        f"median p50 latency: {base_p50:.3f} ms vs {auth_p50:.3f} ms -> +{(auth_p50 - base_p50) * 1000:.0f} us"
    )
    print(f"added CPU per request from throughput: {(1 / auth_rps - 1 / base_rps) * 1e6:.1f} us")
    print(f"authorization gate alone on a cache hit: {per_call:.2f} us per request (no await, no I/O)")
    print(f"SubjectAccessReviews made during the whole run: {reviewed}")
    for bindings in (10, args.bindings):
        rbac = rbac_cost(bindings)
        print(
            f"RBAC decision, allowed by the last of {bindings} ClusterRoleBindings: {rbac:.2f} us "
            f"({rbac / per_call:.1f}x the webhook gate's cache hit)"
        )
    errors = sum(r.errors for r in baseline + authorized)
    return 0 if errors == 0 and reviewed == 1 else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--bindings", type=int, default=1000)
    args = parser.parse_args()
    try:
        import uvloop

        loop_factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    except ImportError:
        loop_factory = asyncio.new_event_loop
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
