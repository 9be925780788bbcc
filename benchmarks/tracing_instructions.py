"""Benchmark: the instructions tracing adds to a request that is not sampled, counted exactly.

Run from the repository root:
    .venv/bin/python benchmarks/tracing_instructions.py [--iterations 200000]

`proxy_instructions.py --tracing-rate 0` measures the whole fast path with tracing configured, but
on a busy machine its rounds move by more than the 2% budget. A request that is not sampled meets
tracing only at its hooks: `begin` (the pipeline gives it no span), the authentication and
authorization gates' wrappers, and the `finished` finisher (the forwarder's hooks are `is None`
tests on a local). This runs exactly those, on a real `RequestContext` for the benchmark's GET
without `traceparent`, with tracing at `samplingRatePerMillion: 0`, against the same gates called
bare: each under callgrind for N and 2N iterations, so the difference of the totals over N is
the cost of one request's hooks, the same on every run whatever else the machine does. Compare it
with `proxy_instructions.py`'s instructions per request.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchrequest import context
from callgrind import per_mode

from aggregator.tracing.config import TracingConfiguration
from aggregator.tracing.gates import AUTHENTICATION, AUTHORIZATION, traced_gate
from aggregator.tracing.otel import OtelTracing
from aggregator.web.context import RequestContext


def gate(_ctx: RequestContext) -> None:
    """A gate that lets the request through without an await (a verified certificate, a cached
    decision): the wrapper's cost is all that differs."""


def run(mode: str, iterations: int) -> None:
    ctx = context()
    if mode == "bare":
        for _ in range(iterations):
            gate(ctx)
            gate(ctx)
        return
    tracer = OtelTracing(TracingConfiguration("127.0.0.1:9", 0))
    authenticate, authorize = traced_gate(AUTHENTICATION, gate), traced_gate(AUTHORIZATION, gate)
    for _ in range(iterations):
        ctx.span = tracer.begin(ctx)
        authenticate(ctx)
        authorize(ctx)
        tracer.finished(ctx, None, None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=200_000)
    parser.add_argument("--child", choices=["bare", "traced"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        run(args.child, args.iterations)
        return 0
    per = per_mode(__file__, ("bare", "traced"), args.iterations)
    print(f"tracing at rate 0 adds {per['traced'] - per['bare']:.0f} instructions to a request that is not sampled")
    return 0


if __name__ == "__main__":
    sys.exit(main())
