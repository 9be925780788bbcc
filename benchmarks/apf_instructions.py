"""Benchmark: the instructions API Priority and Fairness costs a request, against max-in-flight, counted exactly.

Run from the repository root:
    .venv/bin/python benchmarks/apf_instructions.py [--iterations 50000] [--request 537000]

Issue 35's budget: the fast path with APF on costs at most 5% more instructions per request than
with it off. `proxy_instructions.py --compare-apf` measures the whole request both ways, but its
rounds move by more than 5% on a busy machine. The two request paths differ only in the gate each
puts after impersonation: max-in-flight's gate and finisher, or APF's gate, its head listener (the
`X-Kubernetes-PF-*` headers) and its finisher. This runs exactly those, on a real `RequestContext`
for the benchmark's GET, as a user APF does not exempt (`global-default`, a queuing level, a seat
free: the common case), with the default limits: each under callgrind for N and 2N iterations, so
the difference of the totals over N is one request's cost, the same on every run whatever else the
machine does (the objects made before the loop are frozen out of the garbage collector's passes, so
a collection of them does not land in one of the two runs only). `--request` is a whole proxied
GET's instructions (`proxy_instructions.py`; with APF off, 537k on 2026-11-28 in docs/performance.md) to read the difference
against.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchrequest import context
from callgrind import per_mode
from multidict import CIMultiDict

from aggregator.assembly import build_flowcontrol
from aggregator.flowcontrol.metrics import FlowControlMetrics
from aggregator.flowcontrol.options import FlowControlConfig
from aggregator.flowcontrol.sources import StaticConfig
from aggregator.gatewaymetrics import GatewayMetrics
from aggregator.model.userinfo import AUTHENTICATED_GROUP, UserInfo
from aggregator.web.inflight import MaxInFlight
from aggregator.web.options import RequestLimits

USER = UserInfo("bench-user", groups=(AUTHENTICATED_GROUP,))


def run(mode: str, iterations: int) -> None:
    limits = RequestLimits()
    metrics = GatewayMetrics.declare()
    ctx = context()
    ctx.user = USER
    if mode == "max-in-flight":
        gate = MaxInFlight(
            metrics.apiserver,
            read_only=limits.max_requests_inflight,
            mutating=limits.max_mutating_requests_inflight,
        )
        gc.collect()
        gc.freeze()
        for _ in range(iterations):
            if gate.gate(ctx) is not None:
                raise AssertionError("max-in-flight refused the request")
            gate.finished(ctx, None, None)
        return
    asyncio.set_event_loop(asyncio.new_event_loop())  # the queueset's timers would need one
    config = FlowControlConfig(
        limits.max_requests_inflight + limits.max_mutating_requests_inflight, limits.request_timeout
    )
    apf = build_flowcontrol(
        config, StaticConfig(), FlowControlMetrics(metrics.registry), apiserver=metrics.apiserver
    ).filter
    headers: CIMultiDict[str] = CIMultiDict()
    gc.collect()
    gc.freeze()
    for _ in range(iterations):
        ctx.priority = None
        if apf.gate(ctx) is not None:
            raise AssertionError("APF did not dispatch the request at once")
        apf.head_going_out(ctx, 200, headers)
        apf.finished(ctx, None, None)
        headers.clear()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=50_000)
    parser.add_argument("--request", type=float, default=537_000, help="a whole proxied GET's instructions")
    parser.add_argument("--child", choices=["max-in-flight", "apf"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        run(args.child, args.iterations)
        return 0
    per = per_mode(__file__, ("max-in-flight", "apf"), args.iterations)
    extra = per["apf"] - per["max-in-flight"]
    print(
        f"APF costs {extra:.0f} instructions per request more than max-in-flight: "
        f"{100 * extra / args.request:.2f}% of a {args.request / 1000:.0f}k-instruction proxied GET (budget 5%)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
