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
"""

from __future__ import annotations

import logging
from dataclasses import replace

from aiohttp import web
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
from aggregator.web.context import context_of
from aggregator.web.routing import Route, RouteKind

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
        self._key: tuple[object, ...] | None = None
        self._destination: Destination | None = None

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        if self._backend is not None:
            await self._backend.close()
            self._backend = None

    async def serve(self, request: web.Request) -> web.StreamResponse:
        forwarder = self.forwarder
        ctx = context_of(request)
        assert ctx is not None, "the pipeline builds every request's context"
        user = ctx.user
        if user is None:
            return forwarder.answer(ctx, NAME, 500, "missing user")
        try:
            dest = await self.destination()
        except DelegateUnusable as err:
            forwarder.log_limited(NAME, str(err), "cannot forward to kube-apiserver", reason=str(err))
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

    async def destination(self) -> Destination:
        """The kube-apiserver destination, rebuilt when its address, CA or our credentials change."""
        await self.kube.load()
        trust = self.kube.trust
        pair = self.client_certificate.pair
        if self.mode == FRONT_PROXY:
            key: tuple[object, ...] = (
                FRONT_PROXY,
                self.kube.trust_generation,
                self.client_certificate.generation,
            )
        else:
            key = (IMPERSONATE, self.kube.trust_generation, id(self.kube.ssl_context))
        policy = self.identity.current()
        if key == self._key and self._destination is not None:
            if self._destination.policy is not policy:  # the front-proxy header names changed
                self._destination = replace(self._destination, policy=policy)
            return self._destination
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
        self._key = key
        self._destination = Destination(
            NAME,
            backend,
            url.host,
            url.port or 443,
            trust.server_name,
            policy,
            base_path=url.raw_path.rstrip("/"),
            impersonate=self.mode == IMPERSONATE,
            pass_redirects=True,
            hop=self.hop,
        )
        log.info(
            "delegating unserved paths to kube-apiserver",
            extra=fields(server=trust.base_url, identity=self.mode),
        )
        return self._destination


def _for_impersonation(user: UserInfo) -> UserInfo:
    """kube-apiserver adds system:authenticated to an impersonated user itself; asking for it
    explicitly would need an extra impersonate permission on that group."""
    if AUTHENTICATED_GROUP not in user.groups:
        return user
    return UserInfo(
        user.name, user.uid, tuple(g for g in user.groups if g != AUTHENTICATED_GROUP), user.extra
    )
