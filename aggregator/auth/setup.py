"""Wire authentication and authorization into a Gateway from its options.

Authentication: client CA and front-proxy settings from the CA flags, or (kube mode, a flag left
unset, no `--authentication-skip-lookup`) from `kube-system/extension-apiserver-authentication`;
bearer tokens from `--token-auth-file` and, whenever a kubeconfig or in-cluster account exists,
TokenReview. Authorization: always-allow groups and paths, then SubjectAccessReview through
`--authorization-kubeconfig` or the gateway's kube client; with neither (local mode without a
kubeconfig) every authenticated caller is allowed, with a warning at start.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from aggregator.auth.authconfigmap import SOURCE as CLUSTER_SOURCE
from aggregator.auth.authconfigmap import AuthConfigMap
from aggregator.auth.authn import Authenticator, TokenAuthenticator
from aggregator.auth.authz import Authorizer, SubjectAccessReviewer
from aggregator.auth.requestheader import RequestHeaderConfig
from aggregator.auth.tokenfile import TokenFile
from aggregator.auth.tokenreview import TokenReviewAuthenticator
from aggregator.auth.webhook import WebhookClient
from aggregator.config import Options
from aggregator.kube import calls
from aggregator.kube.client import KubeClient
from aggregator.tls.verify import CAFile, CAPool
from aggregator.util.logs import fields

if TYPE_CHECKING:
    from aggregator.server import Gateway

log = logging.getLogger(__name__)


class CAFiles:
    """The CA files named by flags, re-read on change; a Gateway component."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self.client_ca = CAFile(options.client_ca_file) if options.client_ca_file else None
        self.requestheader_ca = (
            CAFile(options.requestheader_client_ca_file) if options.requestheader_client_ca_file else None
        )
        self._requestheader: RequestHeaderConfig | None = None

    def client_ca_pool(self) -> CAPool | None:
        return self.client_ca.pool if self.client_ca is not None else None

    def requestheader_config(self) -> RequestHeaderConfig | None:
        """The front-proxy settings, rebuilt only when the CA file was re-read."""
        if self.requestheader_ca is None:
            return None
        pool = self.requestheader_ca.pool
        if self._requestheader is None or self._requestheader.pool is not pool:
            opts = self.options
            self._requestheader = RequestHeaderConfig(
                pool=pool,
                allowed_names=frozenset(opts.requestheader_allowed_names),
                username_headers=tuple(opts.requestheader_username_headers),
                uid_headers=tuple(opts.requestheader_uid_headers),
                group_headers=tuple(opts.requestheader_group_headers),
                extra_prefixes=tuple(opts.requestheader_extra_headers_prefix),
            )
        return self._requestheader

    async def start(self) -> None:
        for ca in (self.client_ca, self.requestheader_ca):
            if ca is not None:
                ca.start()

    async def stop(self) -> None:
        for ca in (self.client_ca, self.requestheader_ca):
            if ca is not None:
                await ca.stop()


def install_authentication(gateway: Gateway) -> Authenticator:
    options = gateway.options
    files = CAFiles(options)
    gateway.add_component(files)
    client_ca: Callable[[], CAPool | None] = files.client_ca_pool
    requestheader: Callable[[], RequestHeaderConfig | None] = files.requestheader_config
    cluster = _cluster_configmap(gateway, files)
    if cluster is not None:
        gateway.add_component(cluster)
        if cluster.want_client_ca:
            client_ca = cluster.client_ca_pool
        if cluster.want_requestheader:
            requestheader = cluster.requestheader_config
    tokens: list[TokenAuthenticator] = []
    if options.token_auth_file:
        token_file = TokenFile(options.token_auth_file)
        gateway.add_component(token_file)
        tokens.append(token_file)
    if gateway.kube is not None:
        webhook = WebhookClient(
            gateway.kube, calls.CREATE_TOKENREVIEWS, kind="tokenreview", metrics=gateway.metrics
        )
        tokens.append(
            TokenReviewAuthenticator(
                webhook, ttl=options.authentication_token_webhook_cache_ttl, metrics=gateway.metrics
            )
        )
    authenticator = Authenticator(
        anonymous=options.anonymous_auth, client_ca=client_ca, requestheader=requestheader, tokens=tokens
    )
    gateway.authenticator = authenticator
    gateway.gates.append(authenticator.gate)

    summary = gateway.auth_summary
    if files.requestheader_ca is not None:
        names = ",".join(options.requestheader_allowed_names) or "any name"
        summary.append(f"front-proxy headers (CA {options.requestheader_client_ca_file}, CN {names})")
    elif cluster is not None and cluster.want_requestheader:
        summary.append(f"front-proxy headers (from {CLUSTER_SOURCE})")
    if files.client_ca is not None:
        summary.append(f"client certificates (CA {options.client_ca_file})")
    elif cluster is not None and cluster.want_client_ca:
        summary.append(f"client certificates (CA from {CLUSTER_SOURCE})")
    if options.token_auth_file:
        summary.append(f"bearer tokens (file {options.token_auth_file})")
    if gateway.kube is not None:
        ttl = options.authentication_token_webhook_cache_ttl
        summary.append(f"bearer tokens (TokenReview, cached {ttl:g}s)")
    summary.append("anonymous" if options.anonymous_auth else "anonymous only on health paths")
    return authenticator


def _cluster_configmap(gateway: Gateway, files: CAFiles) -> AuthConfigMap | None:
    """Kube mode reads the CA settings the flags left unset from the cluster, as upstream does."""
    options = gateway.options
    if not options.kube_mode or options.authentication_skip_lookup or gateway.kube is None:
        return None
    want_client_ca = files.client_ca is None
    want_requestheader = files.requestheader_ca is None
    if not (want_client_ca or want_requestheader):
        return None
    return AuthConfigMap(gateway.kube, want_client_ca=want_client_ca, want_requestheader=want_requestheader)


def install_authorization(gateway: Gateway) -> Authorizer:
    """The authorization gate, after the authentication gate."""
    options = gateway.options
    client = gateway.kube
    if options.authorization_kubeconfig:
        client = KubeClient.from_kubeconfig(options.authorization_kubeconfig)
        gateway.add_component(client)
    reviewer = None
    if client is not None:
        reviewer = SubjectAccessReviewer(
            WebhookClient(
                client, calls.CREATE_SUBJECTACCESSREVIEWS, kind="subjectaccessreview", metrics=gateway.metrics
            ),
            allowed_ttl=options.authorization_webhook_cache_authorized_ttl,
            denied_ttl=options.authorization_webhook_cache_unauthorized_ttl,
            metrics=gateway.metrics,
        )
    authorizer = Authorizer(
        always_allow_groups=options.authorization_always_allow_groups,
        always_allow_paths=options.authorization_always_allow_paths,
        reviewer=reviewer,
        allow_all=reviewer is None,
    )
    gateway.gates.append(authorizer.gate)
    if reviewer is None:
        log.warning(
            "AUTHORIZATION IS OFF: no kubeconfig for SubjectAccessReviews, so every authenticated caller "
            "may do anything the gateway serves; pass --kubeconfig or --authorization-kubeconfig to "
            "authorize callers",
            extra=fields(anonymous_auth=options.anonymous_auth),
        )
        gateway.auth_summary.append("authorization: ALLOW ALL authenticated callers (no kubeconfig)")
    else:
        source = options.authorization_kubeconfig or options.kubeconfig or "in-cluster account"
        allowed = options.authorization_webhook_cache_authorized_ttl
        denied = options.authorization_webhook_cache_unauthorized_ttl
        summary = f"authorization: SubjectAccessReview via {source} (cached {allowed:g}s allowed, {denied:g}s denied)"
        gateway.auth_summary.append(summary)
    return authorizer
