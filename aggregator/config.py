"""The options of `aggregator serve`: one group per feature, as kube-apiserver's options are
(`k8s.io/apiserver/pkg/server/options`), the checks that span groups, and the `Config` the groups
complete.

Each feature owns its group (`XxxOptions` with `add_flags`, `validate` returning every problem,
and `apply_to(config)` writing the feature's own part of `Config`): where objects come from
(`sources/options.py`), secure serving (`tls/options.py`), the request limits, timeouts and
shutdown and the logging flags (`web/options.py`), API Priority and Fairness
(`flowcontrol/options.py`), the worker count (`workers/options.py`),
authentication and authorization (`auth/options.py`), the backends (`backends/options.py`),
delegation to kube-apiserver (`proxy/options.py`), status writes (`availability/options.py`) and
their leader election (`leaderelection.py`), auditing (`audit/options.py`) and tracing
(`tracing/options.py`). This module only puts the groups together (each flag's destination names
its group and field: `util/flags.py`), applies them in order (`complete`) and checks what no one
group can: flags that mean nothing in local mode, and the front-proxy certificate kube mode
requires.

Flag names follow kube-apiserver's so operators can carry their knowledge over.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from aggregator.audit.options import AuditOptions
from aggregator.auth.options import AuthenticationOptions, AuthorizationConfig, AuthorizationOptions
from aggregator.availability.options import AvailabilityOptions
from aggregator.backends.options import BackendConfig, BackendOptions
from aggregator.flowcontrol.options import FlowControlConfig, FlowControlOptions, concurrency_problems
from aggregator.kube.client import missing_kube_client
from aggregator.leaderelection import LeaderElectionConfig, LeaderElectionOptions
from aggregator.proxy.delegate import FRONT_PROXY
from aggregator.proxy.options import DelegationOptions
from aggregator.sources.options import SourceConfig, SourceOptions
from aggregator.tls.options import SECTION as SERVING_SECTION
from aggregator.tls.options import SecureServingOptions, ServingConfig
from aggregator.tracing.config import TracingConfiguration
from aggregator.tracing.options import TracingOptions
from aggregator.util.flags import ConfigError, InvalidOptions, assign
from aggregator.web.options import (
    LoggingConfig,
    LoggingOptions,
    RequestLimits,
    ServerRunOptions,
    ShutdownConfig,
)
from aggregator.workers.options import WorkersOptions

# Where each group's flags land: its field in `Options`, the prefix of its flags' destinations.
SOURCE = "source."
SERVING = "serving."
SERVER = "server."
FLOWCONTROL = "flowcontrol."
WORKERS = "workers."
AUTHENTICATION = "authentication."
AUTHORIZATION = "authorization."
BACKENDS = "backends."
DELEGATION = "delegation."
AVAILABILITY = "availability."
LEADER_ELECTION = "leader_election."
AUDIT = "audit."
LOGGING = "logging."
TRACING = "tracing."

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
    tracing: TracingOptions = field(default_factory=TracingOptions)
    # The KUBE_MODE_FLAGS given on the command line (their defaults cannot tell).
    explicit_flags: frozenset[str] = frozenset()


@dataclass
class Config:
    """What a gateway is built and run from (kube-apiserver's `server.Config`): each options group's
    `apply_to` writes its part, resolved and parsed once (the mode's defaults, the in-cluster
    account, the CPU count, the Lease's namespace, the TLS and access-log policies, the tracing
    file), and each component is handed its own part. The control process sends it to its workers
    as it is, so every process of a group runs from the same resolution."""

    source: SourceConfig = field(default_factory=SourceConfig)
    serving: ServingConfig = field(default_factory=ServingConfig)
    requests: RequestLimits = field(default_factory=RequestLimits)
    # API Priority and Fairness; None with --enable-priority-and-fairness=false (max-in-flight).
    flowcontrol: FlowControlConfig | None = None
    shutdown: ShutdownConfig = field(default_factory=ShutdownConfig)
    workers: int = 1
    authentication: AuthenticationOptions = field(default_factory=AuthenticationOptions)
    authorization: AuthorizationConfig = field(default_factory=lambda: AuthorizationConfig(modes=()))
    backends: BackendConfig = field(default_factory=BackendConfig)
    delegate_auth: str = FRONT_PROXY
    write_apiservice_status: bool = False
    leader_election: LeaderElectionConfig | None = None
    audit: AuditOptions = field(default_factory=AuditOptions)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    tracing: TracingConfiguration | None = None


def complete(opts: Options) -> Config:
    """Every group applied to a new `Config` (validated options: `validate` first), in order: the
    source before the groups whose defaults depend on the mode, availability before leader
    election (only status writes elect)."""
    config = Config()
    opts.source.apply_to(config)
    opts.serving.apply_to(config)
    opts.server.apply_to(config)
    opts.flowcontrol.apply_to(config)  # after the server's limits: it shares them out
    opts.workers.apply_to(config)
    opts.authentication.apply_to(config)
    opts.authorization.apply_to(config)
    opts.backends.apply_to(config)
    opts.delegation.apply_to(config)
    opts.availability.apply_to(config)
    opts.leader_election.apply_to(config)
    opts.audit.apply_to(config)
    opts.logging.apply_to(config)
    opts.tracing.apply_to(config)
    return config


def add_source_flags(parser: argparse.ArgumentParser, *, command: str = "serve") -> None:
    """Where APIService, Service and EndpointSlice objects come from (shared by serve and check,
    each with its own words for what the flags do)."""
    SourceOptions.add_flags(parser, SOURCE, command=command)


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
    TracingOptions.add_flags(parser, TRACING)
    LoggingOptions.add_flags(parser, LOGGING)


def options_from_args(args: argparse.Namespace) -> Options:
    """The parsed flags, each in its group."""
    opts = Options()
    values = vars(args)
    assign(opts, values)
    opts.explicit_flags = frozenset(dest for dest in KUBE_MODE_FLAGS if dest in values)
    return opts


def problems(opts: Options) -> list[ConfigError]:
    """Every problem of the flags: each group's own (`validate`), then what spans groups."""
    found = [
        *opts.serving.validate(),
        *opts.workers.validate(),
        *opts.logging.validate(),
        *opts.backends.validate(),
        *opts.authentication.validate(),
        *opts.source.validate(),
        *opts.server.validate(),
        *opts.flowcontrol.validate(),
        *opts.leader_election.validate(),
        *opts.authorization.validate(),
        *opts.delegation.validate(),
        *opts.availability.validate(),
        *opts.audit.validate(),
        *opts.tracing.validate(),
    ]
    found += concurrency_problems(opts.flowcontrol, opts.server)
    if opts.source.local_mode:
        found += [
            ConfigError(flag, "only applies in kube mode; it means nothing with --apiservices-dir")
            for flag in sorted(KUBE_MODE_FLAGS[dest] for dest in opts.explicit_flags)
        ]
    kube_source = opts.source.kubeconfig or opts.source.in_cluster  # kube mode with somewhere to watch
    if opts.delegation.delegate_auth == FRONT_PROXY and opts.source.kube_mode and kube_source and not (
        opts.backends.proxy_client_cert_file
    ):
        # Without a front-proxy certificate kube-apiserver cannot trust the caller's identity headers.
        found.append(
            ConfigError(
                "--proxy-client-cert-file",
                "is required in kube mode with --delegate-auth=front-proxy (kube-apiserver trusts X-Remote-* "
                "only from a front-proxy certificate)",
            )
        )
    modes = opts.authorization.modes_problem(
        local_mode=opts.source.local_mode,
        has_kubeconfig=bool(opts.source.kubeconfig or opts.authorization.kubeconfig or opts.source.kube_mode),
    )
    if modes is not None:
        found.append(modes)
    needs_client = _kube_client_needed_by(opts)
    missing = missing_kube_client() if needs_client else None
    if needs_client and missing:
        found.append(ConfigError(needs_client, missing))
    return found


def validate(opts: Options) -> None:
    """Raise InvalidOptions naming every wrong flag or combination (one line each), as
    kube-apiserver reports them all at once."""
    found = problems(opts)
    if found:
        raise InvalidOptions(found)


def _kube_client_needed_by(opts: Options) -> str | None:
    """What makes the gateway talk to kube-apiserver (so it needs the `kube` extra), as named in
    the one line that says it is missing."""
    if opts.source.kube_mode:
        return "kube mode"
    if opts.source.kubeconfig:
        return "--kubeconfig"
    if opts.authorization.kubeconfig:
        return "--authorization-kubeconfig"
    return None
