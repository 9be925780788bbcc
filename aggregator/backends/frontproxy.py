"""One warning when APIServices will be proxied without a front-proxy client certificate.

Without `--proxy-client-cert-file` the gateway still sends the caller's identity in `X-Remote-*`
headers, but an extension API server trusts those only from a client certificate signed by its
`--requestheader-client-ca-file` (k8s.io/apiserver `RequestHeaderAuthRequestHandler`): every
proxied request reaches it with no identity it accepts. kube-apiserver refuses to start its
aggregator that way; local mode allows it (backends without authentication), so it is said once,
when the first remote APIService is known, not for every request.
"""

from __future__ import annotations

import logging

from aggregator.model.apiservice import APIService
from aggregator.sources.store import Event, Kind, Store
from aggregator.util.logs import fields
from aggregator.util.tasks import TaskSet

log = logging.getLogger(__name__)

MESSAGE = (
    "NO FRONT-PROXY CLIENT CERTIFICATE: --proxy-client-cert-file is not set, so extension API servers "
    "see no front-proxy identity: they cannot trust the X-Remote-User and X-Remote-Group headers and "
    "treat proxied requests as anonymous, or refuse them"
)


class MissingClientCertificateWarning:
    """A component: logs `MESSAGE` once, when the synced store holds a remote APIService."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._warned = False
        self._tasks = TaskSet("front-proxy-warning")

    async def start(self) -> None:
        self._tasks.spawn(self._at_sync(), name="wait-synced")

    async def stop(self) -> None:
        await self._tasks.close()

    async def _at_sync(self) -> None:
        await self._store.wait_synced()
        self._check()
        if not self._warned:
            self._store.add_listener(self._on_event)

    def _on_event(self, event: Event) -> None:
        if event.kind is Kind.APISERVICE and not self._warned:
            self._check()

    def _check(self) -> None:
        remote = [svc for svc in self._store.apiservices() if _remote(svc)]
        if remote and not self._warned:
            self._warned = True
            log.warning(MESSAGE, extra=fields(apiservices=len(remote), first=remote[0].name))


def _remote(svc: APIService) -> bool:
    return not svc.local
