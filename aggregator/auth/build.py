"""Authentication and authorization as the options ask for them, for the composition root.

Authentication: client CA and front-proxy settings from the CA flags, or (kube mode, a flag left
unset, no `--authentication-skip-lookup`) from `kube-system/extension-apiserver-authentication`;
bearer tokens from `--token-auth-file` and, whenever a kubeconfig or in-cluster account exists,
TokenReview. Authorization: always-allow groups and paths, then the `--authorization-mode`
authorizers (`modes.py`): SubjectAccessReview through `--authorization-kubeconfig` or the
gateway's kube client, RBAC from the folder, or AlwaysAllow (only when named, with a warning).

Each builder returns what it made, the components with a lifetime among them, and the human
summary lines the start-up log shows.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from aggregator.auth.authconfigmap import SOURCE as CLUSTER_SOURCE
from aggregator.auth.authconfigmap import AuthConfigMap, ClusterAuthentication
from aggregator.auth.authn import Authenticator, TokenAuthenticator
from aggregator.auth.authz import Authorizer, Mode, SubjectAccessReviewer, WebhookMode
from aggregator.auth.cafiles import CAFiles
from aggregator.auth.metrics import AuthMetrics
from aggregator.auth.modes import (
    ALWAYS_ALLOW,
    RBAC,
    AlwaysAllowMode,
    PolicySource,
    RBACMode,
    WithoutManifests,
)
from aggregator.auth.options import AuthenticationOptions, AuthorizationConfig
from aggregator.auth.rbac import RBACPolicy
from aggregator.auth.rbacfolder import RBACFolder
from aggregator.auth.requestheader import RequestHeaderConfig
from aggregator.auth.tokenfile import TokenFile
from aggregator.auth.tokenreview import TokenReviewAuthenticator
from aggregator.auth.webhook import WebhookClient
from aggregator.contracts import Component
from aggregator.kube import calls
from aggregator.kube.client import KubeClient
from aggregator.sources.options import SourceConfig
from aggregator.tls.verify import CAPool
from aggregator.util.latest import Latest
from aggregator.util.logs import fields

log = logging.getLogger(__name__)


@dataclass
class Authentication:
    authenticator: Authenticator
    components: list[tuple[str, Component]] = field(default_factory=list)
    summary: list[str] = field(default_factory=list)
    # kube mode: the cluster's authentication ConfigMap, when the flags leave a CA to it
    cluster: AuthConfigMap | None = None


@dataclass
class Authorization:
    authorizer: Authorizer
    components: list[tuple[str, Component]] = field(default_factory=list)
    summary: list[str] = field(default_factory=list)
    # local mode: the folder's RBAC manifests being watched (worker processes get copies)
    rbac: RBACFolder | None = None


def build_authentication(
    options: AuthenticationOptions,
    source: SourceConfig,
    *,
    kube: KubeClient | None,
    metrics: AuthMetrics,
    cluster_copies: Latest[ClusterAuthentication] | None = None,
) -> Authentication:
    """With `cluster_copies` (a worker process) the cluster's ConfigMap is not watched here: it
    follows the control process's copies (`AuthConfigMap.use`)."""
    files = CAFiles(options)
    components: list[tuple[str, Component]] = [("ca-files", files)]
    client_ca: Callable[[], CAPool | None] = files.client_ca_pool
    requestheader: Callable[[], RequestHeaderConfig | None] = files.requestheader_config
    cluster = _cluster_configmap(options, source, kube, files)
    if cluster is not None:
        if cluster_copies is None:
            components.append(("authentication-configmap", cluster))
        else:
            cluster_copies.follow(cluster.use)
        if cluster.want_client_ca:
            client_ca = cluster.client_ca_pool
        if cluster.want_requestheader:
            requestheader = cluster.requestheader_config
    tokens: list[TokenAuthenticator] = []
    if options.token_auth_file:
        token_file = TokenFile(options.token_auth_file)
        components.append(("token-file", token_file))
        tokens.append(token_file)
    if kube is not None:
        webhook = WebhookClient(kube, calls.CREATE_TOKENREVIEWS, kind="tokenreview", metrics=metrics)
        tokens.append(
            TokenReviewAuthenticator(
                webhook,
                ttl=options.token_webhook_cache_ttl,
                metrics=metrics,
                audiences=tuple(options.api_audiences),
            )
        )
    authenticator = Authenticator(
        anonymous=options.anonymous, client_ca=client_ca, requestheader=requestheader, tokens=tokens
    )

    summary: list[str] = []
    if files.requestheader_ca is not None:
        names = ",".join(options.requestheader.allowed_names) or "any name"
        summary.append(f"front-proxy headers (CA {options.requestheader.client_ca_file}, CN {names})")
    elif cluster is not None and cluster.want_requestheader:
        summary.append(f"front-proxy headers (from {CLUSTER_SOURCE})")
    if files.client_ca is not None:
        summary.append(f"client certificates (CA {options.client_ca_file})")
    elif cluster is not None and cluster.want_client_ca:
        summary.append(f"client certificates (CA from {CLUSTER_SOURCE})")
    if options.token_auth_file:
        summary.append(f"bearer tokens (file {options.token_auth_file})")
    if kube is not None:
        ttl = options.token_webhook_cache_ttl
        audiences = f", audiences {','.join(options.api_audiences)}" if options.api_audiences else ""
        summary.append(f"bearer tokens (TokenReview, cached {ttl:g}s{audiences})")
    if not summary:
        _warn_no_authenticator(options)
    summary.append("anonymous" if options.anonymous else "anonymous only on health paths")
    return Authentication(authenticator, components, summary, cluster)


def _warn_no_authenticator(options: AuthenticationOptions) -> None:
    """Nothing can identify a caller: say what that means for every request, once, at start."""
    outcome = (
        "every caller is system:anonymous (--anonymous-auth)"
        if options.anonymous
        else "every request is refused with 401 Unauthorized, except the health paths"
    )
    log.warning(
        f"NO AUTHENTICATION CONFIGURED: no --client-ca-file, --requestheader-client-ca-file, "
        f"--token-auth-file or kubeconfig, so {outcome}",
        extra=fields(anonymous_auth=options.anonymous),
    )


def _cluster_configmap(
    options: AuthenticationOptions, source: SourceConfig, kube: KubeClient | None, files: CAFiles
) -> AuthConfigMap | None:
    """Kube mode reads the CA settings the flags left unset from the cluster, as upstream does."""
    if not source.kube_mode or options.skip_lookup or kube is None:
        return None
    want_client_ca = files.client_ca is None
    want_requestheader = files.requestheader_ca is None
    if not (want_client_ca or want_requestheader):
        return None
    return AuthConfigMap(kube, want_client_ca=want_client_ca, want_requestheader=want_requestheader)


def build_authorization(
    options: AuthorizationConfig,
    source: SourceConfig,
    *,
    anonymous: bool,
    kube: KubeClient | None,
    metrics: AuthMetrics,
    rbac_source: PolicySource | None = None,
) -> Authorization:
    """The `--authorization-mode` authorizers (`modes.py`). `rbac_source`: where RBAC reads its
    policy (a worker process: the control's copy); None: the folder, watched here."""
    client = kube
    components: list[tuple[str, Component]] = []
    if options.kubeconfig:
        client = KubeClient.from_kubeconfig(options.kubeconfig)
        components.append(("authorization-client", client))
    names = options.modes
    without = WithoutManifests.EVALUATE
    if options.defaulted:
        without = WithoutManifests.ALLOW_AUTHENTICATED if names == (RBAC,) else WithoutManifests.DEFER
    folder: RBACFolder | None = None
    modes: list[Mode] = []
    summary: list[str] = []
    for name in names:
        if name == ALWAYS_ALLOW:
            modes.append(AlwaysAllowMode())
            summary.append("AlwaysAllow (every request, impersonation included)")
            _warn_always_allow(anonymous)
        elif name == RBAC:
            if rbac_source is None:
                assert source.apiservices_dir is not None, "check_modes refuses RBAC without a folder"
                folder = rbac_source = RBACFolder(source.apiservices_dir)
                components.append(("rbac-manifests", folder))
                if without is WithoutManifests.ALLOW_AUTHENTICATED:
                    folder.add_listener(_announce_fallback)
            modes.append(RBACMode(rbac_source, without=without))
            summary.append(f"RBAC from {source.apiservices_dir}{_WITHOUT[without]}")
        else:
            assert client is not None, "check_modes refuses Webhook without a kubeconfig"
            reviewer = SubjectAccessReviewer(
                WebhookClient(
                    client, calls.CREATE_SUBJECTACCESSREVIEWS, kind="subjectaccessreview", metrics=metrics
                ),
                allowed_ttl=options.webhook_cache_authorized_ttl,
                denied_ttl=options.webhook_cache_unauthorized_ttl,
                metrics=metrics,
            )
            modes.append(WebhookMode(reviewer))
            via = options.kubeconfig or source.kubeconfig or "in-cluster account"
            allowed = options.webhook_cache_authorized_ttl
            denied = options.webhook_cache_unauthorized_ttl
            summary.append(
                f"SubjectAccessReview via {via} (cached {allowed:g}s allowed, {denied:g}s denied)"
            )
    authorizer = Authorizer(
        always_allow_groups=options.always_allow_groups,
        always_allow_paths=options.always_allow_paths,
        modes=modes,
    )
    return Authorization(authorizer, components, [f"authorization: {', then '.join(summary)}"], folder)


_WITHOUT = {
    WithoutManifests.EVALUATE: "",
    WithoutManifests.DEFER: " (while it holds RBAC manifests)",
    WithoutManifests.ALLOW_AUTHENTICATED: "; without RBAC manifests: every authenticated caller, never impersonation",
}


def _warn_always_allow(anonymous: bool) -> None:
    who = "every caller, anonymous ones included," if anonymous else "every authenticated caller"
    log.warning(
        f"AUTHORIZATION IS OFF (--authorization-mode=AlwaysAllow): {who} may do anything the gateway "
        "serves and impersonate any user, group, uid or extra (Impersonate-*, kubectl --as); backends "
        "are told the impersonated identity",
        extra=fields(anonymous_auth=anonymous),
    )


def _announce_fallback(policy: RBACPolicy, previous: RBACPolicy) -> None:
    """Local mode's default: say loudly when the folder's RBAC manifests stop (or start) deciding."""
    if policy.present and not previous.present:
        log.info("RBAC manifests found in --apiservices-dir: callers are authorized by them")
    elif not policy.present:
        log.warning(
            "NO RBAC MANIFESTS in --apiservices-dir: every authenticated caller may do anything the gateway "
            "serves; impersonation (Impersonate-*, kubectl --as) is refused. Add Role, ClusterRole, "
            "RoleBinding and ClusterRoleBinding manifests to authorize callers"
        )
