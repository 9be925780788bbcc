"""Client CA and front-proxy settings from `kube-system/extension-apiserver-authentication`.

kube-apiserver publishes there the CA that signs client certificates (`client-ca-file`) and its
front-proxy settings (`requestheader-client-ca-file`, `requestheader-allowed-names`,
`requestheader-{username,uid,group}-headers`, `requestheader-extra-headers-prefix`; list values
are JSON string arrays). Extension API servers without explicit CA flags read it and follow its
changes (apiserver's `DynamicCAFromConfigMapController` and `RequestHeaderAuthRequestController`);
the gateway does the same in kube mode with the shared reflector (sources/reflector.py): a LIST
selected by `metadata.name`, then a watch with the same selector from the list's resourceVersion,
resumed from the last one seen, a fresh LIST after 410 Gone or another in-band error, backoff on
errors. A changed CA is used for the next
request without a restart; an unparsable new version is logged and the previous one stays.

Readiness (`/readyz` check `authentication-configmap-synced`) waits until a version (or the
ConfigMap's absence) is held: until then every client certificate and front-proxy request it
would allow is refused, so a replica (or a worker process, which holds the control process's copy)
must not be taken into its Service before.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aggregator.auth.requestheader import RequestHeaderConfig
from aggregator.kube import calls
from aggregator.kube.client import KubeClient
from aggregator.sources.reflector import ListWatch, Reflector, paged_list
from aggregator.tls.pem import PEMError
from aggregator.tls.verify import CAPool
from aggregator.util.logs import fields
from aggregator.util.tasks import TaskSet

log = logging.getLogger(__name__)

NAMESPACE = "kube-system"
NAME = "extension-apiserver-authentication"
SOURCE = f"configmap {NAMESPACE}/{NAME}"
CHECK_NAME = "authentication-configmap-synced"
# The one object listed and watched (upstream's ConfigMap informers select it the same way).
SELECTOR = f"metadata.name={NAME}"
# How long `start` waits for the first read; after it the gateway serves, refusing what the
# ConfigMap would allow and failing readiness, until the read comes.
INITIAL_TIMEOUT = 10.0


class ConfigMapError(ValueError):
    """A key of the ConfigMap that cannot be used."""


@dataclass(frozen=True)
class ClusterAuthentication:
    """What the ConfigMap says; None where it says nothing."""

    client_ca_pem: bytes | None
    requestheader_ca_pem: bytes | None
    allowed_names: tuple[str, ...] = ()
    username_headers: tuple[str, ...] = ()
    uid_headers: tuple[str, ...] = ()
    group_headers: tuple[str, ...] = ()
    extra_prefixes: tuple[str, ...] = ()


def _strings(data: Mapping[str, Any], key: str) -> tuple[str, ...]:
    """A JSON string array value (`deserializeStrings`): empty or absent is no values."""
    raw = data.get(key, "")
    if not raw:
        return ()
    try:
        values = json.loads(raw)
    except ValueError as err:
        raise ConfigMapError(f"{key}: not a JSON array: {err}") from err
    if values is None:
        return ()
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise ConfigMapError(f"{key}: not a JSON array of strings")
    return tuple(values)


def parse_configmap(obj: Mapping[str, Any]) -> ClusterAuthentication:
    data = obj.get("data") or {}
    if not isinstance(data, Mapping):
        raise ConfigMapError("data is not an object")
    client_ca = data.get("client-ca-file") or None
    requestheader_ca = data.get("requestheader-client-ca-file") or None
    return ClusterAuthentication(
        client_ca_pem=client_ca.encode() if isinstance(client_ca, str) else None,
        requestheader_ca_pem=requestheader_ca.encode() if isinstance(requestheader_ca, str) else None,
        allowed_names=_strings(data, "requestheader-allowed-names"),
        username_headers=_strings(data, "requestheader-username-headers"),
        uid_headers=_strings(data, "requestheader-uid-headers"),
        group_headers=_strings(data, "requestheader-group-headers"),
        extra_prefixes=_strings(data, "requestheader-extra-headers-prefix"),
    )


class AuthConfigMap:
    """Keeps the client CA and/or front-proxy settings equal to the ConfigMap; a Gateway component.

    `want_client_ca` / `want_requestheader` say which of the two the flags left unset.
    """

    def __init__(self, client: KubeClient, *, want_client_ca: bool, want_requestheader: bool) -> None:
        self.client = client
        self.want_client_ca = want_client_ca
        self.want_requestheader = want_requestheader
        self.resource_version = ""
        self.current: ClusterAuthentication | None = None
        self._client_ca: CAPool | None = None
        self._requestheader: RequestHeaderConfig | None = None
        self._tasks = TaskSet(f"configmap {SOURCE}")
        self.synced = asyncio.Event()
        self.reflector = Reflector(
            client,
            ListWatch(
                f"configmaps {NAMESPACE}/{NAME}",
                paged_list(calls.LIST_CONFIGMAPS, SOURCE, namespace=NAMESPACE, field_selector=SELECTOR),
                calls.WATCH_CONFIGMAPS,
                namespace=NAMESPACE,
                field_selector=SELECTOR,
            ),
            _Follower(self),
        )

    # --- what the authenticator calls (no I/O) -------------------------------------------------------

    def client_ca_pool(self) -> CAPool | None:
        return self._client_ca

    def requestheader_config(self) -> RequestHeaderConfig | None:
        return self._requestheader

    def ready_check(self) -> str | None:
        """readyz `authentication-configmap-synced`: None once the cluster's settings are held."""
        if self.current is None:
            return f"the cluster's authentication settings ({NAMESPACE}/{NAME}) are not read yet"
        return None

    # --- lifecycle -----------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start following the ConfigMap; wait (bounded) for the first read's answer."""
        self._tasks.spawn(self.reflector.run(), name="watch")
        try:
            async with asyncio.timeout(INITIAL_TIMEOUT):
                await self.reflector.answered.wait()
        except TimeoutError:
            pass
        if not self.reflector.synced.is_set():
            log.warning(
                "cannot read the cluster's authentication configmap yet; client certificates and "
                "front-proxy headers it would allow are refused, and readiness fails, until it is read",
                extra=fields(
                    configmap=f"{NAMESPACE}/{NAME}",
                    reason=self.reflector.last_error or f"no answer within {INITIAL_TIMEOUT}s",
                ),
            )

    async def stop(self) -> None:
        await self._tasks.close()

    # --- applying a version --------------------------------------------------------------------------

    def apply(self, obj: Mapping[str, Any] | None) -> None:
        """Use this version of the ConfigMap (None: it does not exist)."""
        if obj is None:
            self.resource_version = ""
            config = ClusterAuthentication(None, None)
        else:
            metadata = obj.get("metadata")
            if isinstance(metadata, Mapping):
                self.resource_version = str(metadata.get("resourceVersion") or "")
            try:
                config = parse_configmap(obj)
            except ConfigMapError as err:
                log.error(
                    "ignoring an unusable version of the authentication configmap",
                    extra=fields(reason=str(err)),
                )
                return
        self.use(config)

    def use(self, config: ClusterAuthentication) -> None:
        """Use this parsed version (also how a worker process takes the control process's copy)."""
        try:
            client_ca = self._pool(config.client_ca_pem, "client-ca-file", self._client_ca)
            requestheader_ca = self._pool(
                config.requestheader_ca_pem,
                "requestheader-client-ca-file",
                self._requestheader.pool if self._requestheader is not None else None,
            )
        except PEMError as err:
            log.error(
                "ignoring an unusable version of the authentication configmap", extra=fields(reason=str(err))
            )
            return
        if config == self.current:
            self.synced.set()
            return
        if self.want_client_ca:
            self._client_ca = client_ca
        if self.want_requestheader:
            self._requestheader = (
                RequestHeaderConfig(
                    pool=requestheader_ca,
                    allowed_names=frozenset(config.allowed_names),
                    username_headers=config.username_headers,
                    uid_headers=config.uid_headers,
                    group_headers=config.group_headers,
                    extra_prefixes=config.extra_prefixes,
                )
                if requestheader_ca is not None
                else None
            )
        self.current = config
        self.synced.set()
        log.info(
            "authentication configmap applied",
            extra=fields(
                configmap=f"{NAMESPACE}/{NAME}",
                resourceVersion=self.resource_version,
                client_ca=_count(client_ca) if self.want_client_ca else "from --client-ca-file",
                requestheader_ca=_count(requestheader_ca)
                if self.want_requestheader
                else "from --requestheader-client-ca-file",
                allowed_names=",".join(config.allowed_names) or "any",
            ),
        )
        if (
            self.want_client_ca
            and self.want_requestheader
            and client_ca is not None
            and requestheader_ca is not None
            and client_ca.pem.strip() == requestheader_ca.pem.strip()
            and not config.allowed_names
        ):
            log.warning(
                "the cluster's client CA and front-proxy CA are the same and no allowed names are set: "
                "any client certificate may assert any identity in request headers"
            )

    @staticmethod
    def _pool(pem: bytes | None, key: str, previous: CAPool | None) -> CAPool | None:
        if pem is None:
            return None
        if previous is not None and previous.pem == pem:
            return previous  # keeps its verification cache
        return CAPool(pem, source=f"{SOURCE} {key}")


class _Follower:
    """The reflector's target: the ConfigMap (or its absence) goes to `AuthConfigMap.apply`."""

    def __init__(self, owner: AuthConfigMap) -> None:
        self.owner = owner

    def replace(self, items: list[Any]) -> None:
        self.owner.apply(next((item for item in items if _is_it(item)), None))

    def apply(self, event_type: str, obj: dict[str, Any]) -> None:
        if not _is_it(obj):
            return
        if event_type == "DELETED":
            log.warning(
                "the authentication configmap was deleted", extra=fields(configmap=f"{NAMESPACE}/{NAME}")
            )
            self.owner.apply(None)
        else:
            self.owner.apply(obj)


def _is_it(obj: Any) -> bool:
    metadata = obj.get("metadata") if isinstance(obj, dict) else None
    return (
        isinstance(metadata, dict)
        and metadata.get("name") == NAME
        and metadata.get("namespace", NAMESPACE) == NAMESPACE
    )


def _count(pool: CAPool | None) -> str:
    return f"{len(pool.anchors)} certificate(s)" if pool is not None else "none"
