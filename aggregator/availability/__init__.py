"""Availability of every APIService: hop-by-hop checks, the `Available` condition, metrics.

`probe` walks the hops (Service, port, EndpointSlices, the discovery GET), `conditions` words the
verdict as upstream does (plus the detail upstream lacks), `checker` re-checks and answers the
proxy, `status` records conditions (store, memory, or kube-apiserver's status subresource).
`install_availability(gateway)` wires it all into a gateway.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aggregator.availability.checker import FIRST_ROUND_CHECK, AvailabilityChecker
from aggregator.availability.probe import DiscoveryProbe
from aggregator.availability.status import (
    ALWAYS_LEADS,
    KubeStatusWriter,
    Leadership,
    MemoryStatus,
    StatusSink,
    StoreStatus,
)
from aggregator.leaderelection import CHECK_NAME, elector_for_options

if TYPE_CHECKING:
    from aggregator.server import Gateway

__all__ = ["AvailabilityChecker", "DiscoveryProbe", "install_availability"]


def install_availability(gateway: Gateway, **checker_options: Any) -> AvailabilityChecker:
    """Replace `gateway.availability` with the checker (the proxy's 503s follow its verdicts)."""
    options = gateway.options
    sink: StatusSink
    if options.local_mode:
        sink = StoreStatus(gateway.store)
    elif options.write_apiservice_status and gateway.kube is not None:
        sink = KubeStatusWriter(gateway.kube, gateway.store, _leadership(gateway))
    else:
        sink = MemoryStatus()
    checker = AvailabilityChecker(
        gateway.store, DiscoveryProbe(gateway.backends), gateway.metrics, sink, **checker_options
    )
    gateway.availability = checker
    gateway.add_component(checker)
    # Ready once the first verdicts are in (a dead backend delays this by one probe timeout at
    # most; it never makes the gateway unready), and the unavailable ones listed in the notes.
    gateway.health.add(FIRST_ROUND_CHECK, checker.first_round_check, livez=False)
    gateway.health.add_notes("readyz", checker.notes)

    return checker


def _leadership(gateway: Gateway) -> Leadership:
    """With `--leader-elect` (the default), a Lease elects the one replica that writes status.

    The elector is added before the checker, so it stops after it: the Lease is released only
    once no status write can still be under way.
    """
    if not gateway.options.leader_elect or gateway.kube is None:
        return ALWAYS_LEADS
    elector = elector_for_options(gateway.options, gateway.kube, gateway.metrics)
    gateway.add_component(elector)
    # Never fails for a follower: leading or not shows in `/readyz?verbose`, not in readiness.
    gateway.health.add(CHECK_NAME, elector.check)
    gateway.health.add_notes("readyz", elector.notes)
    return elector
