"""The options of `aggregator serve`: one group per feature, as kube-apiserver's options are
(`k8s.io/apiserver/pkg/server/options`), and the checks that span groups.

Each feature owns its group (`XxxOptions` with `add_flags`, `validate`, and what the feature builds
from it): where objects come from (`sources/options.py`), secure serving (`tls/options.py`), the
request limits, timeouts and shutdown and the logging flags (`web/options.py`), API Priority and
Fairness (`flowcontrol/options.py`), the worker count
(`workers/options.py`), authentication and authorization (`auth/options.py`), the backends
(`backends/options.py`), delegation to kube-apiserver (`proxy/options.py`), status writes
(`availability/options.py`) and their leader election (`leaderelection.py`), and auditing
(`audit/options.py`). This module only puts the groups together (each flag's destination names its
group and field: `util/flags.py`) and checks what no one group can: flags that mean nothing in
local mode, and the front-proxy certificate kube mode requires.

Flag names follow kube-apiserver's so operators can carry their knowledge over.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from aggregator.audit.options import AuditOptions
from aggregator.auth.options import AuthenticationOptions, AuthorizationOptions
from aggregator.availability.options import AvailabilityOptions
from aggregator.backends.options import BackendOptions
from aggregator.flowcontrol.options import FlowControlOptions
from aggregator.leaderelection import LeaderElectionOptions
from aggregator.proxy.delegate import FRONT_PROXY
from aggregator.proxy.options import DelegationOptions
from aggregator.sources.options import SourceOptions
from aggregator.tls.options import SECTION as SERVING_SECTION
from aggregator.tls.options import SecureServingOptions
from aggregator.util.flags import ConfigError, assign
from aggregator.web.options import LoggingOptions, ServerRunOptions
from aggregator.workers.options import WorkersOptions

# Where each group's flags land: its field in `Options`, the prefix of its flags' destinations.
SOURCE = "source."
SERVING = "serving."
SERVER = "server."
WORKERS = "workers."
AUTHENTICATION = "authentication."
AUTHORIZATION = "authorization."
BACKENDS = "backends."
DELEGATION = "delegation."
AVAILABILITY = "availability."
LEADER_ELECTION = "leader_election."
AUDIT = "audit."
FLOWCONTROL = "flowcontrol."
LOGGING = "logging."

# Flags that only mean something in kube mode: given explicitly with --apiservices-dir, refused
# (destination -> flag). Their defaults are not registered, so a parsed namespace has them only
# when given.
KUBE_MODE_FLAGS = {
    DELEGATION + "delegate_auth": "--delegate-auth",
    AVAILABILITY + "write_apiservice_status": "--write-apiservice-status",
    LEADER_ELECTION + "leader_elect": "--leader-elect",
}


@dataclass
class Options:
    source: SourceOptions = field(default_factory=SourceOptions)
    serving: SecureServingOptions = field(default_factory=SecureServingOptions)
    server: ServerRunOptions = field(default_factory=ServerRunOptions)
    flowcontrol: FlowControlOptions = field(default_factory=FlowControlOptions)
    workers: WorkersOptions = field(default_factory=WorkersOptions)
    authentication: AuthenticationOptions = field(default_factory=AuthenticationOptions)
    authorization: AuthorizationOptions = field(default_factory=AuthorizationOptions)
    backends: BackendOptions = field(default_factory=BackendOptions)
    delegation: DelegationOptions = field(default_factory=DelegationOptions)
    availability: AvailabilityOptions = field(default_factory=AvailabilityOptions)
    leader_election: LeaderElectionOptions = field(default_factory=LeaderElectionOptions)
    audit: AuditOptions = field(default_factory=AuditOptions)
    logging: LoggingOptions = field(default_factory=LoggingOptions)
    # The KUBE_MODE_FLAGS given on the command line (their defaults cannot tell).
    explicit_flags: frozenset[str] = frozenset()

    @property
    def local_mode(self) -> bool:
        return self.source.local_mode

    @property
    def kube_mode(self) -> bool:
        return self.source.kube_mode

    @property
    def deny_cidrs(self) -> list[str]:
        """`--backend-deny-cidrs`, or this mode's default."""
        return self.backends.deny_cidrs(kube_mode=self.kube_mode)


def add_source_flags(parser: argparse.ArgumentParser) -> None:
    """Where APIService, Service and EndpointSlice objects come from (shared by serve and check)."""
    SourceOptions.add_flags(parser, SOURCE)


def add_backend_flags(parser: argparse.ArgumentParser) -> None:
    """How extension API servers are reached (shared by serve and check)."""
    BackendOptions.add_flags(parser, BACKENDS)


def add_serve_flags(parser: argparse.ArgumentParser) -> None:
    """Every flag of `aggregator serve`, each with help text, in --help's order of sections."""
    add_source_flags(parser)
    SecureServingOptions.add_flags(parser, SERVING)
    ServerRunOptions.add_shutdown_flags(parser, SERVER, section=SERVING_SECTION)
    WorkersOptions.add_flags(parser, WORKERS)
    ServerRunOptions.add_limit_flags(parser, SERVER)
    FlowControlOptions.add_flags(parser, FLOWCONTROL)
    AuthenticationOptions.add_flags(parser, AUTHENTICATION)
    AuthorizationOptions.add_flags(parser, AUTHORIZATION)
    add_backend_flags(parser)
    DelegationOptions.add_flags(parser, DELEGATION)
    AvailabilityOptions.add_flags(parser, AVAILABILITY)
    LeaderElectionOptions.add_flags(parser, LEADER_ELECTION)
    AuditOptions.add_flags(parser, AUDIT)
    LoggingOptions.add_flags(parser, LOGGING)


def options_from_args(args: argparse.Namespace) -> Options:
    """The parsed flags, each in its group."""
    opts = Options()
    values = vars(args)
    assign(opts, values)
    opts.explicit_flags = frozenset(dest for dest in KUBE_MODE_FLAGS if dest in values)
    return opts


def validate(opts: Options) -> None:
    """Raise ConfigError for the first wrong flag or combination, naming the flag."""
    opts.serving.validate()
    opts.workers.validate()
    opts.logging.validate()
    opts.backends.validate(kube_mode=opts.kube_mode)
    opts.authentication.validate()
    opts.source.validate()
    kube_only = sorted(KUBE_MODE_FLAGS[dest] for dest in opts.explicit_flags) if opts.local_mode else []
    if kube_only:
        raise ConfigError(
            kube_only[0],
            "only applies in kube mode; it means nothing with --apiservices-dir",
        )
    if opts.delegation.delegate_auth == FRONT_PROXY and opts.kube_mode and not opts.backends.proxy_client_cert_file:
        # Without a front-proxy certificate kube-apiserver cannot trust the caller's identity headers.
        raise ConfigError(
            "--proxy-client-cert-file",
            "is required in kube mode with --delegate-auth=front-proxy (kube-apiserver trusts X-Remote-* "
            "only from a front-proxy certificate)",
        )
    opts.server.validate()
    for error in opts.flowcontrol.validate(
        max_requests_inflight=opts.server.max_requests_inflight,
        max_mutating_requests_inflight=opts.server.max_mutating_requests_inflight,
    ):
        raise error
    opts.leader_election.validate()
    opts.authorization.validate(
        local_mode=opts.local_mode,
        has_kubeconfig=bool(opts.source.kubeconfig or opts.authorization.kubeconfig or opts.kube_mode),
    )
    opts.audit.validate()
