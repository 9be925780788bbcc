"""Kube mode's fallback: everything the gateway does not serve itself goes to kube-apiserver.

`/api/...`, `/version`, local APIServices' group-versions (built-in and CRD groups) and unknown
paths are forwarded, streamed and tunnelled (exec on pods is an upgrade) by the same forwarding
core as aggregated APIs, to the server named by the kubeconfig (or the in-cluster service).

The caller's identity reaches kube-apiserver in one of two ways (`--delegate-auth`):
- `front-proxy` (default): the gateway presents `--proxy-client-cert-file` and the caller's
  `X-Remote-*` headers, which kube-apiserver trusts from a certificate signed by its
  `--requestheader-client-ca-file` (exactly as extension servers trust kube-apiserver's
  aggregator). `Impersonate-*` headers pass through: kube-apiserver authorizes and applies them
  after authenticating the caller, as it does upstream.
- `impersonate`: the gateway's own kubeconfig credentials with `Impersonate-User/-Uid/-Group/
  -Extra-*` naming the caller; the gateway's account needs the `impersonate` verb on users, uids,
  groups and userextras. A caller's own `Impersonate-*` headers cannot be nested and get a 403.

kube-apiserver authorizes what it serves, so the route is of kind DELEGATE (the authorization gate
leaves it alone). Its redirects are passed on: it is trusted, and its service and pod proxy paths
redirect legitimately.

Where requests go (kube-apiserver's address, the TLS context with the CA and our client
certificate or credentials) is built once when the delegate starts, and again when kube-apiserver's
TLS settings or the front-proxy client certificate change: a request reads it.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from yarl import URL

from aggregator.backends.backend import Backend
from aggregator.backends.client_cert import ProxyClientCertificate
from aggregator.backends.headers import LiveIdentityPolicy
from aggregator.backends.tls import harden
from aggregator.kube.client import KubeClient
from aggregator.model.userinfo import AUTHENTICATED_GROUP, UserInfo
from aggregator.proxy.destination import Destination
from aggregator.proxy.forward import Forwarder, has_impersonation
from aggregator.tls.pem import load_pair_into
from aggregator.util.logs import fields
from aggregator.web.context import RequestContext
from aggregator.web.routing import Route, RouteKind
from aggregator.web.serverrequest import Answer

log = logging.getLogger(__name__)

NAME = "delegate"
FRONT_PROXY = "front-proxy"
IMPERSONATE = "impersonate"


class DelegateUnusable(Exception):
    """The delegate cannot be reached as configured (the message says why)."""


class Delegate:
    def __init__(
        self,
        kube: KubeClient,
        *,
        mode: str,
        forwarder: Forwarder,
        client_certificate: ProxyClientCertificate,
        identity: LiveIdentityPolicy,
        hop: str,
    ) -> None:
        """`identity` must strip the header names kube-apiserver trusts from our certificate (the
        flags' and the cluster ConfigMap's), and keep `Impersonate-*` in front-proxy mode only.
        `hop` marks every delegated request: a loop through kube-apiserver's own aggregator back
        to a gateway stops there (`backends/hops.py`)."""
        self.kube = kube
        self.mode = mode
        self.forwarder = forwarder
        self.client_certificate = client_certificate
        self.identity = identity
        self.hop = hop
        self.route = Route(self.serve, RouteKind.DELEGATE, NAME, upgradable=True)
        self._backend: Backend | None = None
        # Where requests go now, or why they cannot go anywhere.
        self._destination: Destination | DelegateUnusable = DelegateUnusable("not started")
        client_certificate.add_listener(self.rebuild)
        kube.add_listener(self.rebuild)

    async def start(self) -> None:
        await self.kube.load()
        self.rebuild()

    async def stop(self) -> None:
        if self._backend is not None:
            await self._backend.close()
            self._backend = None

    async def serve(self, ctx: RequestContext) -> Answer:
        forwarder = self.forwarder
        user = ctx.user
        if user is None:
            return forwarder.answer(ctx, NAME, 500, "missing user")
        dest = self._destination
        if isinstance(dest, DelegateUnusable):
            forwarder.log_limited(NAME, str(dest), "cannot forward to kube-apiserver", reason=str(dest))
            return forwarder.answer(ctx, NAME, 503, "service unavailable")
        if dest.impersonate:
            header = has_impersonation(ctx)
            if header is not None:
                return forwarder.answer(
                    ctx,
                    NAME,
                    403,
                    f"impersonation ({header}) cannot be nested: this gateway reaches kube-apiserver "
                    "by impersonating the caller (--delegate-auth=impersonate)",
                )
            dest = replace(dest, credentials=await self.kube.auth_headers())
            user = _for_impersonation(user)
        return await forwarder.send(ctx, dest, user)

    def rebuild(self) -> None:
        """Build the kube-apiserver destination for kube-apiserver's address and CA and our
        credentials as they are now (at start, and whenever one of them changes)."""
        try:
            self._destination = self._build()
        except DelegateUnusable as err:
            self._destination = err
            log.warning("cannot forward to kube-apiserver", extra=fields(reason=str(err)))

    def _build(self) -> Destination:
        trust = self.kube.trust
        pair = self.client_certificate.pair
        url = URL(trust.base_url)
        if url.scheme != "https" or not url.host:
            raise DelegateUnusable(
                f"kube-apiserver URL {trust.base_url} is not https; the delegate needs TLS"
            )
        if self.mode == FRONT_PROXY:
            if pair is None:
                raise DelegateUnusable("--delegate-auth=front-proxy needs --proxy-client-cert-file")
            context = trust.new_context()
            load_pair_into(context, pair)
        else:
            context = self.kube.ssl_context
        harden(context)
        if self.kube.connect_kwargs().get("proxy"):
            # The proxy's lean client dials kube-apiserver directly; list/watch and reviews still
            # go through the kubeconfig's proxy.
            log.warning(
                "the kubeconfig's proxy-url is not used for delegated requests",
                extra=fields(server=trust.base_url),
            )
        backend = Backend(NAME, context=context, client_pair=pair if self.mode == FRONT_PROXY else None)
        if self._backend is not None:
            self._backend.retire()
        self._backend = backend
        log.info(
            "delegating unserved paths to kube-apiserver",
            extra=fields(server=trust.base_url, identity=self.mode),
        )
        return Destination(
            NAME,
            backend,
            url.host,
            url.port or 443,
            trust.server_name,
            self.identity,
            base_path=url.raw_path.rstrip("/"),
            impersonate=self.mode == IMPERSONATE,
            pass_redirects=True,
            hop=self.hop,
        )


def _for_impersonation(user: UserInfo) -> UserInfo:
    """kube-apiserver adds system:authenticated to an impersonated user itself; asking for it
    explicitly would need an extra impersonate permission on that group."""
    if AUTHENTICATED_GROUP not in user.groups:
        return user
    return UserInfo(
        user.name, user.uid, tuple(g for g in user.groups if g != AUTHENTICATED_GROUP), user.extra
    )
