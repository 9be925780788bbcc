"""Options of `aggregator serve`, and the checks that reject a wrong combination before anything starts.

Flag names follow kube-apiserver's so operators can carry their knowledge over.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aggregator.audit.policy import PolicyError as AuditPolicyError
from aggregator.audit.policy import load_policy_file
from aggregator.auth.modes import ModeError, check_modes
from aggregator.tls.policy import DEFAULT_MIN_VERSION, VERSIONS, PolicyError, TLSPolicy
from aggregator.util.durations import parse_go_duration
from aggregator.web.accesslog import AccessLogError, AccessLogPolicy

IN_CLUSTER_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
DEFAULT_CERT_DIR = "apiserver.local.config/certificates"
# --backend-deny-cidrs when unset. Both modes: link-local, where cloud metadata services live.
DEFAULT_DENY_CIDRS = ("169.254.0.0/16", "fe80::/10")
# Kube mode adds loopback: no real Service or endpoint points there (kube-apiserver's
# ValidateEndpointIP refuses it in EndpointSlices), so a backend on 127.0.0.1 can only be a request
# forgery towards the gateway's own pod. Local mode keeps it: its demo backends listen on loopback.
KUBE_DEFAULT_DENY_CIDRS = (*DEFAULT_DENY_CIDRS, "127.0.0.0/8", "::1/128")
DEFAULT_ALWAYS_ALLOW_PATHS = ("/healthz", "/readyz", "/livez")
# client-go leaderelection.go `JitterFactor`: acquire retries wait RetryPeriod * [1, 2.2).
JITTER_FACTOR = 1.2
# The only lock type client-go still has (resourcelock/interface.go).
LEASES_LOCK = "leases"
_REMOVED_LOCKS = {
    "endpoints": "endpoints lock is removed, migrate to leases",
    "configmaps": "configmaps lock is removed, migrate to leases",
    "endpointsleases": "endpointsleases lock is removed, migrate to leases",
    "configmapsleases": "configmapsleases lock is removed, migrated to leases",
}
# kube-apiserver's audit log defaults since 1.36 (k8s.io/apiserver pkg/server/options/audit.go).
DEFAULT_AUDIT_LOG_MAXAGE = 366
DEFAULT_AUDIT_LOG_MAXBACKUP = 100
DEFAULT_AUDIT_LOG_MAXSIZE = 100
DEFAULT_AUDIT_LOG_BUFFER_SIZE = 10000
# kube-apiserver's request limits and timeouts (k8s.io/apiserver pkg/server/config.go NewConfig).
DEFAULT_MAX_REQUESTS_INFLIGHT = 400
DEFAULT_MAX_MUTATING_REQUESTS_INFLIGHT = 200
DEFAULT_REQUEST_TIMEOUT = 60.0
DEFAULT_MIN_REQUEST_TIMEOUT = 1800


# Flags that only mean something in kube mode: given explicitly with --apiservices-dir, refused
# (Options field -> flag).
KUBE_MODE_FLAGS = {
    "delegate_auth": "--delegate-auth",
    "write_apiservice_status": "--write-apiservice-status",
    "leader_elect": "--leader-elect",
}


class ConfigError(Exception):
    """A flag combination that cannot work. `str()` is the one line shown before exiting with code 2."""

    def __init__(self, flag: str, problem: str) -> None:
        super().__init__(f"{flag}: {problem}")
        self.flag = flag
        self.problem = problem


@dataclass
class Options:
    bind_address: str = "0.0.0.0"
    secure_port: int = 8443
    tls_cert_file: str | None = None
    tls_private_key_file: str | None = None
    cert_dir: str = DEFAULT_CERT_DIR
    tls_min_version: str = DEFAULT_MIN_VERSION
    tls_cipher_suites: list[str] = field(default_factory=list)
    # HTTP/2 (web/http2/): k8s.io/apiserver's SecureServingOptions.DisableHTTP2Serving and
    # --http2-max-streams-per-connection (0: kube-apiserver's 100).
    disable_http2_serving: bool = False
    http2_max_streams_per_connection: int = 0
    client_ca_file: str | None = None
    requestheader_client_ca_file: str | None = None
    requestheader_allowed_names: list[str] = field(default_factory=list)
    requestheader_username_headers: list[str] = field(default_factory=lambda: ["X-Remote-User"])
    requestheader_uid_headers: list[str] = field(default_factory=list)
    requestheader_group_headers: list[str] = field(default_factory=lambda: ["X-Remote-Group"])
    requestheader_extra_headers_prefix: list[str] = field(default_factory=lambda: ["X-Remote-Extra-"])
    proxy_client_cert_file: str | None = None
    proxy_client_key_file: str | None = None
    kubeconfig: str | None = None
    apiservices_dir: str | None = None
    log_format: str = "text"
    verbosity: int = 0
    access_log: str | None = None  # None: errors, or all from -v 3 (web/accesslog.py)
    # proxy
    enable_aggregator_routing: bool = False
    allow_external_name_services: bool = False
    # None: the mode's default (`deny_cidrs`)
    backend_deny_cidrs: list[str] | None = None
    delegate_auth: str = "front-proxy"
    # authentication / authorization
    anonymous_auth: bool = False
    token_auth_file: str | None = None
    authentication_token_webhook_cache_ttl: float = 10.0
    # Empty (no --service-account-issuer to default from, as kube-apiserver does): reviews carry no
    # audiences and kube-apiserver checks tokens against its own.
    api_audiences: list[str] = field(default_factory=list)
    authentication_skip_lookup: bool = False
    authorization_kubeconfig: str | None = None
    # None: the default for where the gateway runs (`auth/modes.py default_modes`)
    authorization_mode: list[str] | None = None
    authorization_always_allow_paths: list[str] = field(
        default_factory=lambda: list(DEFAULT_ALWAYS_ALLOW_PATHS)
    )
    authorization_always_allow_groups: list[str] = field(default_factory=lambda: ["system:masters"])
    authorization_webhook_cache_authorized_ttl: float = 10.0
    authorization_webhook_cache_unauthorized_ttl: float = 10.0
    # availability
    write_apiservice_status: bool = False
    # leader election for the status writes (kube-controller-manager's flags and defaults)
    leader_elect: bool = True
    leader_elect_lease_duration: float = 15.0
    leader_elect_renew_deadline: float = 10.0
    leader_elect_retry_period: float = 2.0
    leader_elect_resource_lock: str = "leases"
    leader_elect_resource_name: str = "aggregator"
    # "" = this pod's namespace (aggregator.leaderelection.lease_namespace)
    leader_elect_resource_namespace: str = ""
    # lifecycle
    shutdown_delay_duration: float = 0.0
    shutdown_watch_termination_grace_period: float = 0.0
    # limits and timeouts
    max_requests_inflight: int = DEFAULT_MAX_REQUESTS_INFLIGHT
    max_mutating_requests_inflight: int = DEFAULT_MAX_MUTATING_REQUESTS_INFLIGHT
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT
    # Seconds; an int on the command line, as upstream's flag (tests may use fractions).
    min_request_timeout: float = DEFAULT_MIN_REQUEST_TIMEOUT
    # processes serving the port (None: the CPUs this process may use, `workers/cpus.py`)
    workers: int | None = None
    # audit
    audit_log_path: str | None = None
    audit_log_maxage: int = DEFAULT_AUDIT_LOG_MAXAGE
    audit_log_maxbackup: int = DEFAULT_AUDIT_LOG_MAXBACKUP
    audit_log_maxsize: int = DEFAULT_AUDIT_LOG_MAXSIZE
    audit_log_batch_buffer_size: int = DEFAULT_AUDIT_LOG_BUFFER_SIZE
    audit_policy_file: str | None = None
    # The KUBE_MODE_FLAGS given on the command line (their defaults cannot tell).
    explicit_flags: frozenset[str] = frozenset()

    @property
    def in_cluster(self) -> bool:
        """True when no kubeconfig is given but a pod service account is mounted."""
        return (
            self.kubeconfig is None
            and bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
            and IN_CLUSTER_TOKEN.exists()
        )

    @property
    def local_mode(self) -> bool:
        """Objects come from a folder; the kubeconfig (if any) is only used for reviews."""
        return self.apiservices_dir is not None

    @property
    def kube_mode(self) -> bool:
        return not self.local_mode

    @property
    def deny_cidrs(self) -> list[str]:
        """`--backend-deny-cidrs`, or the mode's default when it is not given."""
        if self.backend_deny_cidrs is not None:
            return self.backend_deny_cidrs
        return list(KUBE_DEFAULT_DENY_CIDRS if self.kube_mode else DEFAULT_DENY_CIDRS)


def _csv(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


class GoDuration(argparse.Action):
    """A duration flag read as pflag reads one: Go's `time.ParseDuration`, so a number needs a unit
    (`5s`, `1m30s`; only `0` may go without), and a refusal worded as pflag words it:
    `invalid argument "5" for "--request-timeout" flag: time: missing unit in duration "5"`."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        text = str(values)
        try:
            seconds = parse_go_duration(text)
        except ValueError as err:
            flag = option_string or "/".join(self.option_strings)
            raise argparse.ArgumentError(None, f'invalid argument "{text}" for "{flag}" flag: {err}') from None
        setattr(namespace, self.dest, seconds)


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "t", "true", "yes", "y", "on"):
        return True
    if lowered in ("0", "f", "false", "no", "n", "off"):
        return False
    raise argparse.ArgumentTypeError(f"invalid boolean {text!r}")


def add_source_flags(parser: argparse.ArgumentParser) -> None:
    """Where APIService, Service and EndpointSlice objects come from (shared by serve and check)."""
    group = parser.add_argument_group("object source")
    group.add_argument(
        "--kubeconfig",
        help="kubeconfig of the kube-apiserver to watch APIServices, Services and EndpointSlices in and to "
        "delegate unknown paths to. Without it (and without --apiservices-dir) the in-cluster service "
        "account is used.",
    )
    group.add_argument(
        "--apiservices-dir",
        help="local mode: read APIService, Service and EndpointSlice manifests (*.yaml, *.yml, *.json) "
        "from this folder and reload them on change; no cluster is needed.",
    )


def add_backend_flags(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """How extension API servers are reached (shared by serve and check); returns the group."""
    proxy = parser.add_argument_group("proxy")
    proxy.add_argument(
        "--proxy-client-cert-file",
        help="client certificate presented to extension API servers (and to kube-apiserver as the "
        "front proxy); must be signed by their requestheader CA. Re-read on change.",
    )
    proxy.add_argument("--proxy-client-key-file", help="private key for --proxy-client-cert-file.")
    proxy.add_argument(
        "--enable-aggregator-routing",
        action="store_true",
        help="route to a ready EndpointSlice endpoint instead of the Service's cluster IP.",
    )
    proxy.add_argument(
        "--allow-external-name-services",
        action="store_true",
        help="allow APIServices backed by ExternalName Services (off: they are a server-side request "
        "forgery risk).",
    )
    proxy.add_argument(
        "--backend-deny-cidrs",
        type=_csv,
        default=None,
        help="backend addresses never dialed (default 169.254.0.0/16,fe80::/10: cloud metadata; kube "
        "mode adds 127.0.0.0/8,::1/128); an empty value allows all but the unspecified addresses "
        "(0.0.0.0/8, ::), which are never dialed.",
    )
    return proxy


def add_serve_flags(parser: argparse.ArgumentParser) -> None:
    """Every flag of `aggregator serve`, each with help text."""
    add_source_flags(parser)
    serving = parser.add_argument_group("secure serving")
    serving.add_argument(
        "--bind-address", default="0.0.0.0", help="IP address to listen on (default 0.0.0.0)."
    )
    serving.add_argument(
        "--secure-port",
        type=int,
        default=8443,
        help="HTTPS port to serve on (default 8443; 0 picks a free port).",
    )
    serving.add_argument(
        "--tls-cert-file",
        help="PEM serving certificate (followed by any intermediates). Re-read when the file changes.",
    )
    serving.add_argument("--tls-private-key-file", help="PEM private key matching --tls-cert-file.")
    serving.add_argument(
        "--cert-dir",
        default=DEFAULT_CERT_DIR,
        help="where a self-signed serving pair (apiserver.crt, apiserver.key) is generated when "
        f"--tls-cert-file is not given (default {DEFAULT_CERT_DIR}).",
    )
    serving.add_argument(
        "--tls-min-version",
        default=DEFAULT_MIN_VERSION,
        help=f"minimum TLS version served: {', '.join(VERSIONS)} (default {DEFAULT_MIN_VERSION}).",
    )
    serving.add_argument(
        "--tls-cipher-suites",
        type=_csv,
        default=[],
        help="comma-separated TLS 1.0-1.2 cipher suites, by Go's names (e.g. "
        "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256); insecure ones are logged, ones this OpenSSL cannot "
        "serve are reported and left out. TLS 1.3 suites are not configurable. Default: the library's.",
    )
    serving.add_argument(
        "--disable-http2-serving",
        type=_bool,
        nargs="?",
        const=True,
        default=False,
        help="serve HTTP/1.1 only: offer no h2 in TLS ALPN (default false: clients that offer h2, as "
        "kubectl and client-go do, get HTTP/2).",
    )
    serving.add_argument(
        "--http2-max-streams-per-connection",
        type=int,
        default=0,
        help="the limit the gateway gives clients for concurrent streams on one HTTP/2 connection "
        "(default 0: kube-apiserver's 100).",
    )
    serving.add_argument(
        "--shutdown-delay-duration",
        action=GoDuration,
        default=0.0,
        help="on SIGTERM, fail /readyz and keep serving this long before closing (default 0s).",
    )
    serving.add_argument(
        "--shutdown-watch-termination-grace-period",
        action=GoDuration,
        default=0.0,
        help="once the listener has closed, the longest watches and exec/attach/port-forward tunnels "
        "are given to end; they are ended at 200 per second or faster, so all within this period "
        "(default 0s: all at once).",
    )
    serving.add_argument(
        "--workers",
        type=int,
        default=None,
        help="processes serving the port (SO_REUSEPORT), fed by one control process that alone "
        "watches, probes and fetches; 1 is a single process with no supervisor (default: the CPUs "
        "this process may use, from its CPU affinity and cgroup CPU quota).",
    )

    add_limit_flags(parser)

    authn = parser.add_argument_group("authentication")
    authn.add_argument(
        "--client-ca-file",
        help="CA bundle that signs client certificates; a verified certificate authenticates as CN (user) "
        "and O (groups).",
    )
    authn.add_argument(
        "--requestheader-client-ca-file",
        help="CA bundle that signs front-proxy client certificates; only callers presenting such a "
        "certificate may assert identity with the request headers below.",
    )
    authn.add_argument(
        "--requestheader-allowed-names",
        type=_csv,
        default=[],
        help="comma-separated common names allowed for front-proxy certificates; empty allows any name "
        "signed by --requestheader-client-ca-file.",
    )
    authn.add_argument(
        "--requestheader-username-headers",
        type=_csv,
        default=["X-Remote-User"],
        help="request headers to read the user name from, first non-empty wins (default X-Remote-User).",
    )
    authn.add_argument(
        "--requestheader-uid-headers",
        type=_csv,
        default=[],
        help="request headers to read the user UID from (default none).",
    )
    authn.add_argument(
        "--requestheader-group-headers",
        type=_csv,
        default=["X-Remote-Group"],
        help="request headers to read groups from (default X-Remote-Group).",
    )
    authn.add_argument(
        "--requestheader-extra-headers-prefix",
        type=_csv,
        default=["X-Remote-Extra-"],
        help="request header prefixes for user extra fields (default X-Remote-Extra-).",
    )
    authn.add_argument(
        "--anonymous-auth",
        type=_bool,
        nargs="?",
        const=True,
        default=False,
        help="serve requests without credentials as system:anonymous (default false: they get a 401, "
        "except on the always-allowed health paths).",
    )
    authn.add_argument(
        "--token-auth-file",
        help='static bearer tokens in kube-apiserver\'s CSV format (token,user,uid,"group1,group2"); '
        "re-read on change.",
    )
    authn.add_argument(
        "--authentication-token-webhook-cache-ttl",
        action=GoDuration,
        default=10.0,
        help="how long TokenReview answers are cached (default 10s).",
    )
    authn.add_argument(
        "--api-audiences",
        type=_csv,
        default=[],
        help="audiences a bearer token must be valid for, sent in every TokenReview and checked in its "
        "answer (default none: kube-apiserver checks the token against its own API audiences).",
    )
    authn.add_argument(
        "--authentication-skip-lookup",
        action="store_true",
        help="do not read kube-system/extension-apiserver-authentication for missing CA settings.",
    )

    authz = parser.add_argument_group("authorization")
    authz.add_argument(
        "--authorization-mode",
        type=_csv,
        default=None,
        help="ordered list of AlwaysAllow, RBAC (manifests in --apiservices-dir), Webhook "
        "(SubjectAccessReview) (default: Webhook in kube mode; RBAC, then Webhook with a kubeconfig, in local mode).",
    )
    authz.add_argument(
        "--authorization-kubeconfig",
        help="kubeconfig for SubjectAccessReviews (default: the main kubeconfig or in-cluster account).",
    )
    authz.add_argument(
        "--authorization-always-allow-paths",
        type=_csv,
        default=list(DEFAULT_ALWAYS_ALLOW_PATHS),
        help="non-resource paths allowed without a review; exact, or a prefix with a trailing '*' "
        "(default /healthz,/readyz,/livez).",
    )
    authz.add_argument(
        "--authorization-always-allow-groups",
        type=_csv,
        default=["system:masters"],
        help="groups allowed everything without a review (default system:masters).",
    )
    authz.add_argument(
        "--authorization-webhook-cache-authorized-ttl",
        action=GoDuration,
        default=10.0,
        help="how long an allowed SubjectAccessReview answer is cached (default 10s).",
    )
    authz.add_argument(
        "--authorization-webhook-cache-unauthorized-ttl",
        action=GoDuration,
        default=10.0,
        help="how long a denied SubjectAccessReview answer is cached (default 10s).",
    )

    proxy = add_backend_flags(parser)
    proxy.add_argument(
        "--delegate-auth",
        choices=["front-proxy", "impersonate"],
        default=argparse.SUPPRESS,  # front-proxy (Options); absent unless given: KUBE_MODE_FLAGS
        help="how the caller's identity reaches kube-apiserver: front-proxy headers with "
        "--proxy-client-cert-file (default), or impersonation with the gateway's own credentials.",
    )

    status = parser.add_argument_group("availability")
    status.add_argument(
        "--write-apiservice-status",
        action="store_true",
        default=argparse.SUPPRESS,  # false (Options); absent unless given: KUBE_MODE_FLAGS
        help="kube mode: write each APIService's Available condition to its status (off by default: "
        "kube-apiserver's own aggregator writes it too). Only when the status or reason differs from "
        "the stored one, and with --leader-elect only from the replica holding the lease.",
    )
    add_leader_election_flags(parser)

    add_audit_flags(parser)

    logs = parser.add_argument_group("logging")
    logs.add_argument("--log-format", choices=["text", "json"], default="text", help="log line format.")
    logs.add_argument(
        "-v",
        "--v",
        dest="verbosity",
        type=int,
        default=0,
        help="log verbosity; 3 and above logs every request (unless --access-log says otherwise), 4 and "
        "above logs debug lines.",
    )
    logs.add_argument(
        "--access-log",
        default=None,
        help="which requests get an access-log line: off, errors (5xx and clients that went away), "
        "sampled[:N] (one in N, default 100, plus errors) or all (default: errors, all with -v 3).",
    )


def add_limit_flags(parser: argparse.ArgumentParser) -> None:
    """kube-apiserver's max-in-flight and timeout flags (`ServerRunOptions.AddUniversalFlags`)."""
    group = parser.add_argument_group("limits and timeouts")
    group.add_argument(
        "--max-requests-inflight",
        type=int,
        default=DEFAULT_MAX_REQUESTS_INFLIGHT,
        help="the most non-mutating requests (get, list) executing at once; more get 429 with "
        "Retry-After: 1. Watches and other long-running requests, and system:masters, are never "
        f"limited. 0 disables the limit (default {DEFAULT_MAX_REQUESTS_INFLIGHT}).",
    )
    group.add_argument(
        "--max-mutating-requests-inflight",
        type=int,
        default=DEFAULT_MAX_MUTATING_REQUESTS_INFLIGHT,
        help="the most mutating requests (create, update, patch, delete...) executing at once; 0 "
        f"disables the limit (default {DEFAULT_MAX_MUTATING_REQUESTS_INFLIGHT}).",
    )
    group.add_argument(
        "--request-timeout",
        action=GoDuration,
        default=DEFAULT_REQUEST_TIMEOUT,
        help="how long a non-long-running request may take before it is answered 504 (a shorter "
        "?timeout= in the request applies instead); 0 disables it (default 1m0s).",
    )
    group.add_argument(
        "--min-request-timeout",
        type=int,
        default=DEFAULT_MIN_REQUEST_TIMEOUT,
        help="a watch without timeoutSeconds is ended after a random time between this many seconds "
        "and twice as many, so clients re-watch spread out; 0: never (default "
        f"{DEFAULT_MIN_REQUEST_TIMEOUT}).",
    )


def add_leader_election_flags(parser: argparse.ArgumentParser) -> None:
    """component-base `BindLeaderElectionFlags`, with kube-controller-manager's defaults."""
    group = parser.add_argument_group("leader election")
    group.add_argument(
        "--leader-elect",
        type=_bool,
        nargs="?",
        const=True,
        default=argparse.SUPPRESS,  # true (Options); absent unless given: KUBE_MODE_FLAGS
        help="with --write-apiservice-status, elect one replica through a coordination.k8s.io Lease and "
        "write status only from it, so every replica can run with the flag (default true). With "
        "--leader-elect=false every replica that has the flag writes.",
    )
    group.add_argument(
        "--leader-elect-lease-duration",
        action=GoDuration,
        default=15.0,
        help="the duration that non-leader candidates will wait after observing a leadership renewal "
        "until attempting to acquire leadership of a led but unrenewed leader slot: effectively the "
        "longest a stopped leader goes unreplaced (default 15s).",
    )
    group.add_argument(
        "--leader-elect-renew-deadline",
        action=GoDuration,
        default=10.0,
        help="the interval between attempts by the acting leader to renew a leadership slot before it "
        "stops leading; must be less than the lease duration (default 10s).",
    )
    group.add_argument(
        "--leader-elect-retry-period",
        action=GoDuration,
        default=2.0,
        help="the duration the clients should wait between attempting acquisition and renewal of a "
        "leadership (default 2s).",
    )
    group.add_argument(
        "--leader-elect-resource-lock",
        default="leases",
        help="the type of resource object that is used for locking during leader election. Supported "
        "options are 'leases' (default).",
    )
    group.add_argument(
        "--leader-elect-resource-name",
        default="aggregator",
        help="the name of the Lease used for locking during leader election (default aggregator).",
    )
    group.add_argument(
        "--leader-elect-resource-namespace",
        default="",
        help="the namespace of the Lease (default: the pod's own namespace, from POD_NAMESPACE or the "
        "service account, else default).",
    )


def add_audit_flags(parser: argparse.ArgumentParser) -> None:
    """kube-apiserver's audit log flags (the log backend in batch mode; see docs/audit.md)."""
    audit = parser.add_argument_group("auditing")
    audit.add_argument(
        "--audit-log-path",
        help="write audit events (audit.k8s.io/v1 Event JSON lines) to this file; '-' means standard "
        "out. Nothing is audited without --audit-policy-file.",
    )
    audit.add_argument(
        "--audit-policy-file",
        help="audit.k8s.io/v1 Policy deciding which requests are audited at which level; nothing is "
        "audited without --audit-log-path.",
    )
    audit.add_argument(
        "--audit-log-maxage",
        type=int,
        default=DEFAULT_AUDIT_LOG_MAXAGE,
        help="days to keep rotated audit log files, by the time in their name; 0 keeps them regardless "
        f"of age (default {DEFAULT_AUDIT_LOG_MAXAGE}).",
    )
    audit.add_argument(
        "--audit-log-maxbackup",
        type=int,
        default=DEFAULT_AUDIT_LOG_MAXBACKUP,
        help=f"rotated audit log files to keep; 0 keeps all (default {DEFAULT_AUDIT_LOG_MAXBACKUP}).",
    )
    audit.add_argument(
        "--audit-log-maxsize",
        type=int,
        default=DEFAULT_AUDIT_LOG_MAXSIZE,
        help="megabytes an audit log file may reach before it is rotated; 0 disables rotation "
        f"(default {DEFAULT_AUDIT_LOG_MAXSIZE}).",
    )
    audit.add_argument(
        "--audit-log-batch-buffer-size",
        type=int,
        default=DEFAULT_AUDIT_LOG_BUFFER_SIZE,
        help="audit events queued for the writer; when it is full, new events are dropped and counted "
        f'in apiserver_audit_error_total{{plugin="buffered"}} (default {DEFAULT_AUDIT_LOG_BUFFER_SIZE}).',
    )


def options_from_args(args: argparse.Namespace) -> Options:
    """Copy the parsed flags that Options knows into an Options."""
    opts = Options()
    for name in vars(opts):
        if hasattr(args, name):
            setattr(opts, name, getattr(args, name))
    opts.explicit_flags = frozenset(name for name in KUBE_MODE_FLAGS if hasattr(args, name))
    return opts


def _check_readable(flag: str, path: str | None) -> None:
    if path is None:
        return
    try:
        with open(path, "rb") as handle:
            handle.read(1)
    except OSError as err:
        raise ConfigError(flag, f"cannot read {path}: {err.strerror or err}") from err


def _check_pair(cert_flag: str, cert: str | None, key_flag: str, key: str | None) -> None:
    if cert and not key:
        raise ConfigError(key_flag, f"is required when {cert_flag} is set")
    if key and not cert:
        raise ConfigError(cert_flag, f"is required when {key_flag} is set")


def _same_file_content(a: str, b: str) -> bool:
    try:
        return Path(a).read_bytes().strip() == Path(b).read_bytes().strip()
    except OSError:
        return False


def tls_policy(opts: Options) -> TLSPolicy:
    """The serving TLS policy the flags ask for; ConfigError for a value kube-apiserver would refuse."""
    try:
        return TLSPolicy.from_flags(opts.tls_min_version, opts.tls_cipher_suites)
    except PolicyError as err:
        raise ConfigError(err.flag, err.problem) from err


def validate(opts: Options) -> None:
    """Raise ConfigError for the first wrong combination, naming the flag."""
    if not 0 <= opts.secure_port <= 65535:
        raise ConfigError("--secure-port", f"{opts.secure_port} is not a valid port (0-65535)")
    try:
        ipaddress.ip_address(opts.bind_address)
    except ValueError as err:
        raise ConfigError("--bind-address", f"{opts.bind_address!r} is not an IP address") from err
    if opts.workers is not None and opts.workers < 1:
        raise ConfigError("--workers", f"{opts.workers} is not a valid worker count (1 or more)")
    tls_policy(opts)
    try:
        AccessLogPolicy.parse(opts.access_log, verbosity=opts.verbosity)
    except AccessLogError as err:
        raise ConfigError("--access-log", str(err)) from err
    _check_pair("--tls-cert-file", opts.tls_cert_file, "--tls-private-key-file", opts.tls_private_key_file)
    _check_pair(
        "--proxy-client-cert-file",
        opts.proxy_client_cert_file,
        "--proxy-client-key-file",
        opts.proxy_client_key_file,
    )
    for flag, path in (
        ("--tls-cert-file", opts.tls_cert_file),
        ("--tls-private-key-file", opts.tls_private_key_file),
        ("--client-ca-file", opts.client_ca_file),
        ("--requestheader-client-ca-file", opts.requestheader_client_ca_file),
        ("--proxy-client-cert-file", opts.proxy_client_cert_file),
        ("--proxy-client-key-file", opts.proxy_client_key_file),
        ("--kubeconfig", opts.kubeconfig),
        ("--authorization-kubeconfig", opts.authorization_kubeconfig),
        ("--token-auth-file", opts.token_auth_file),
    ):
        _check_readable(flag, path)
    if opts.apiservices_dir is not None and not Path(opts.apiservices_dir).is_dir():
        raise ConfigError("--apiservices-dir", f"{opts.apiservices_dir} is not a readable directory")
    if opts.apiservices_dir is None and opts.kubeconfig is None and not opts.in_cluster:
        raise ConfigError(
            "--apiservices-dir",
            "neither --apiservices-dir nor --kubeconfig is set and no in-cluster service account was found",
        )
    kube_only = sorted(opts.explicit_flags & KUBE_MODE_FLAGS.keys()) if opts.local_mode else []
    if kube_only:
        raise ConfigError(
            KUBE_MODE_FLAGS[kube_only[0]],
            "only applies in kube mode; it means nothing with --apiservices-dir",
        )
    for cidr in opts.deny_cidrs:
        try:
            ipaddress.ip_network(cidr, strict=False)
        except ValueError as err:
            raise ConfigError("--backend-deny-cidrs", f"{cidr!r} is not a CIDR") from err
    if (
        opts.client_ca_file
        and opts.requestheader_client_ca_file
        and not opts.requestheader_allowed_names
        and _same_file_content(opts.client_ca_file, opts.requestheader_client_ca_file)
    ):
        raise ConfigError(
            "--requestheader-client-ca-file",
            "is the same CA as --client-ca-file and --requestheader-allowed-names is empty, so any client "
            "certificate could assert any identity; use a separate front-proxy CA or set allowed names",
        )
    if opts.delegate_auth == "front-proxy" and opts.kube_mode and not opts.proxy_client_cert_file:
        # Without a front-proxy certificate kube-apiserver cannot trust the caller's identity headers.
        raise ConfigError(
            "--proxy-client-cert-file",
            "is required in kube mode with --delegate-auth=front-proxy (kube-apiserver trusts X-Remote-* "
            "only from a front-proxy certificate)",
        )
    if opts.shutdown_delay_duration < 0:
        raise ConfigError("--shutdown-delay-duration", "can not be negative value")
    if opts.shutdown_watch_termination_grace_period < 0:
        raise ConfigError("--shutdown-watch-termination-grace-period", "can not be a negative value")
    for flag, ttl in (
        ("--authentication-token-webhook-cache-ttl", opts.authentication_token_webhook_cache_ttl),
        ("--authorization-webhook-cache-authorized-ttl", opts.authorization_webhook_cache_authorized_ttl),
        ("--authorization-webhook-cache-unauthorized-ttl", opts.authorization_webhook_cache_unauthorized_ttl),
    ):
        if ttl < 0:
            raise ConfigError(flag, "must not be negative")
    if opts.leader_elect:
        _validate_leader_election(opts)
    for entry in opts.authorization_always_allow_paths:
        if "*" in entry[:-1]:
            raise ConfigError(
                "--authorization-always-allow-paths", f"{entry!r}: '*' is only allowed at the end"
            )
    if opts.authorization_mode is not None:
        try:
            check_modes(
                opts.authorization_mode,
                local_mode=opts.local_mode,
                has_kubeconfig=bool(opts.kubeconfig or opts.authorization_kubeconfig or opts.kube_mode),
            )
        except ModeError as err:
            raise ConfigError("--authorization-mode", str(err)) from err
    _check_audit(opts)
    _check_limits(opts)


def _check_limits(opts: Options) -> None:
    """`ServerRunOptions.Validate`'s wording."""
    for flag, value in (
        ("--max-requests-inflight", opts.max_requests_inflight),
        ("--max-mutating-requests-inflight", opts.max_mutating_requests_inflight),
        ("--request-timeout", opts.request_timeout),
        ("--min-request-timeout", opts.min_request_timeout),
    ):
        if value < 0:
            raise ConfigError(flag, "can not be negative value")


def _validate_leader_election(opts: Options) -> None:
    """Upstream's refusals, in the order kube-controller-manager meets them: the configuration
    (component-base), the lock type (client-go `resourcelock.New`), the durations (`NewLeaderElector`)."""
    problem = timing_problem(
        opts.leader_elect_lease_duration, opts.leader_elect_renew_deadline, opts.leader_elect_retry_period
    )
    if problem is not None and problem[1] == "must be greater than zero":
        raise ConfigError(f"--leader-elect-{problem[0]}", problem[1])
    if not opts.leader_elect_resource_name:
        raise ConfigError("--leader-elect-resource-name", "Required value")
    lock = lock_problem(opts.leader_elect_resource_lock)
    if lock is not None:
        raise ConfigError("--leader-elect-resource-lock", lock)
    if problem is not None:
        raise ConfigError(f"--leader-elect-{problem[0]}", problem[1])


def _ns(seconds: float) -> int:
    return round(seconds * 1e9)


def timing_problem(
    lease_duration: float, renew_deadline: float, retry_period: float
) -> tuple[str, str] | None:
    """(which duration, why) for the first reason upstream refuses these durations, else None.

    Zero or negative first (component-base `ValidateLeaderElectionConfiguration`), then
    client-go's `NewLeaderElector`, compared in nanoseconds as Go's time.Duration is.
    """
    for which, value in (
        ("lease-duration", lease_duration),
        ("renew-deadline", renew_deadline),
        ("retry-period", retry_period),
    ):
        if _ns(value) <= 0:
            return which, "must be greater than zero"
    if _ns(lease_duration) <= _ns(renew_deadline):
        return "lease-duration", "leaseDuration must be greater than renewDeadline"
    if _ns(renew_deadline) <= int(JITTER_FACTOR * _ns(retry_period)):
        return "renew-deadline", "renewDeadline must be greater than retryPeriod*JitterFactor"
    return None


def lock_problem(lock_type: str) -> str | None:
    """client-go resourcelock `new`'s error for a lock type other than `leases`, else None."""
    if lock_type == LEASES_LOCK:
        return None
    return _REMOVED_LOCKS.get(lock_type, f"Invalid lock-type {lock_type}; possible values: {LEASES_LOCK}")


def _check_audit(opts: Options) -> None:
    for flag, value in (
        ("--audit-log-maxage", opts.audit_log_maxage),
        ("--audit-log-maxbackup", opts.audit_log_maxbackup),
        ("--audit-log-maxsize", opts.audit_log_maxsize),
    ):
        if value < 0:
            raise ConfigError(flag, f"{value} can't be a negative number")
    if opts.audit_log_batch_buffer_size <= 0:
        raise ConfigError("--audit-log-batch-buffer-size", "must be a positive number")
    if opts.audit_policy_file is not None:
        try:
            load_policy_file(opts.audit_policy_file)
        except AuditPolicyError as err:
            raise ConfigError("--audit-policy-file", str(err)) from err
