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
from aggregator.availability.status import KubeStatusWriter, MemoryStatus, StatusSink, StoreStatus

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
        sink = KubeStatusWriter(gateway.kube, gateway.store)
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
