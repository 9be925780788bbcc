"""The per-endpoint metrics of proxied requests, and the log lines of ejections.

Labels are the APIService and the endpoint (`ip:port`): as many series per APIService as its
Service has ready endpoints (one, the cluster IP, without --enable-aggregator-routing). An endpoint
that leaves the Service loses its series (`forget`), so a Deployment rolling its pods does not
leave a trail of dead ones behind.
"""

from __future__ import annotations

import logging

from aggregator.backends.h1 import DialTimes
from aggregator.proxy.endpoints import Endpoint
from aggregator.util.logs import fields
from aggregator.web.metrics import Children, Metrics

log = logging.getLogger(__name__)

UNSENT = "unsent"
IDEMPOTENT = "idempotent"


class EndpointMetrics:
    def __init__(self, metrics: Metrics) -> None:
        self.counts = metrics.endpoint_counts
        self.errors = Children(metrics.endpoint_errors)
        self.retries = Children(metrics.endpoint_retries)
        self.ejections = Children(metrics.endpoint_ejections)
        self.ejected = Children(metrics.endpoint_ejected)
        self.dial = Children(metrics.endpoint_dial)
        self.tls = Children(metrics.endpoint_tls)

    def dialed(self, name: str, endpoint: str, times: DialTimes) -> None:
        if times.tcp is not None:
            self.dial(name, endpoint).observe(times.tcp)
        if times.tls is not None:
            self.tls(name, endpoint).observe(times.tls)

    def ejection(self, name: str, endpoint: Endpoint, reason: str) -> None:
        """`Endpoints`' listener: an endpoint ejected (`reason`), or back (`reason` empty)."""
        authority = endpoint.authority
        if reason:
            kind = "answers" if reason.endswith(" answers") else "unreachable"
            self.ejections(name, authority, kind).inc()
            self.ejected(name, authority).set(1)
            log.warning(
                "endpoint ejected",
                extra=fields(
                    apiservice=name, endpoint=authority, reason=reason, ejections=endpoint.ejections
                ),
            )
        else:
            self.ejected(name, authority).set(0)
            log.info(
                "endpoint back after a successful probe", extra=fields(apiservice=name, endpoint=authority)
            )

    def forget(self, name: str, endpoint: str) -> None:
        """The endpoint left the Service (or the APIService is gone): its series go."""
        self.ejected.remove(name, endpoint)
        self.dial.remove(name, endpoint)
        self.tls.remove(name, endpoint)
        for kind in ("connect", "tls", "timeout", "reset", "answer"):
            self.errors.remove(name, endpoint, kind)
        for kind in (UNSENT, IDEMPOTENT):
            self.retries.remove(name, endpoint, kind)
        for kind in ("answers", "unreachable"):
            self.ejections.remove(name, endpoint, kind)
