"""`aggregator serve`'s options: one group per feature, each flag bound to one field of its group.

The flags' behaviour (values, refusals, help) is tested feature by feature and in
tests/commands/test_cli.py; here, that the groups and the parser agree: defaults declared once,
every flag landing in an existing field, and the `--requestheader-*` flags read through one group
by both the authenticator and the proxy's identity-header stripping.
"""

from __future__ import annotations

import argparse
import pickle
import subprocess
import sys
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

import pytest

from aggregator.backends.headers import LiveIdentityPolicy
from aggregator.backends.options import DEFAULT_DENY_CIDRS, KUBE_DEFAULT_DENY_CIDRS
from aggregator.commands.cli import build_parser
from aggregator.config import KUBE_MODE_FLAGS, Options, add_serve_flags, complete, options_from_args, problems
from aggregator.flowcontrol.options import FlowControlConfig
from aggregator.tls.verify import CAPool
from aggregator.util.flags import ConfigError
from aggregator.web.accesslog import AccessLogPolicy
from aggregator.web.options import LoggingConfig, ShutdownConfig
from aggregator.workers.cpus import usable_cpus
from tests.support.pki import PKI


def serve_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_serve_flags(parser)
    return parser


def parse(*argv: str) -> Options:
    return options_from_args(build_parser().parse_args(["serve", *argv]))


def test_the_parsed_defaults_are_the_groups_defaults() -> None:
    assert parse() == Options()


def test_every_flag_sets_a_field_of_its_group() -> None:
    options = Options()
    seen: set[str] = set()
    for action in serve_parser()._actions:
        if not action.option_strings or action.dest == "help":
            continue
        *path, name = action.dest.split(".")
        assert path, f"{action.option_strings}: its destination names no options group"
        owner: Any = options
        for part in path:
            owner = getattr(owner, part)
        assert is_dataclass(owner) and name in {f.name for f in fields(owner)}, action.dest
        assert action.dest not in seen, f"two flags set {action.dest}"
        seen.add(action.dest)
    assert set(KUBE_MODE_FLAGS) <= seen


def test_only_flags_given_on_the_command_line_count_as_given() -> None:
    assert parse().explicit_flags == frozenset()
    given = parse("--delegate-auth=impersonate", "--leader-elect=false")
    assert given.explicit_flags == {"delegation.delegate_auth", "leader_election.leader_elect"}
    assert (given.delegation.delegate_auth, given.leader_election.leader_elect) == ("impersonate", False)


@pytest.mark.parametrize(
    ("argv", "path", "value"),
    [
        (["--secure-port", "9443"], ("serving", "port"), 9443),
        (["--tls-min-version", "VersionTLS13"], ("serving", "min_tls_version"), "VersionTLS13"),
        (["--request-timeout", "1m30s"], ("server", "request_timeout"), 90.0),
        (["--shutdown-delay-duration", "5s"], ("server", "shutdown_delay_duration"), 5.0),
        (["--workers", "3"], ("workers", "count"), 3),
        (["--anonymous-auth"], ("authentication", "anonymous"), True),
        (["--api-audiences", "a,b"], ("authentication", "api_audiences"), ["a", "b"]),
        (["--authorization-mode", "RBAC,Webhook"], ("authorization", "modes"), ["RBAC", "Webhook"]),
        (["--backend-deny-cidrs", ""], ("backends", "backend_deny_cidrs"), []),
        (["--write-apiservice-status"], ("availability", "write_apiservice_status"), True),
        (["--leader-elect-retry-period", "3s"], ("leader_election", "retry_period"), 3.0),
        (["--audit-log-maxsize", "0"], ("audit", "log_maxsize"), 0),
        (["-v", "4"], ("logging", "verbosity"), 4),
    ],
)
def test_a_flag_lands_in_its_features_group(argv: list[str], path: tuple[str, str], value: object) -> None:
    group, name = path
    assert getattr(getattr(parse(*argv), group), name) == value


def test_the_requestheader_flags_are_read_once_by_authentication_and_the_proxy(pki: PKI) -> None:
    options = parse(
        "--requestheader-allowed-names=front-proxy-client",
        "--requestheader-username-headers=X-User",
        "--requestheader-uid-headers=X-Uid",
        "--requestheader-group-headers=X-Groups",
        "--requestheader-extra-headers-prefix=X-Extra-",
    )
    flags = options.authentication.requestheader
    pool = CAPool(Path(pki.path("front-proxy-ca.crt")).read_bytes(), source="test")
    config = flags.config(pool)
    assert config.pool is pool
    assert (config.allowed_names, config.username_headers, config.uid_headers) == (
        frozenset({"front-proxy-client"}),
        ("X-User",),
        ("X-Uid",),
    )
    assert (config.group_headers, config.extra_prefixes) == (("X-Groups",), ("X-Extra-",))
    stripped = LiveIdentityPolicy(flags).current()
    for name in ("x-user", "X-UID", "X-Groups", "x-extra-scope", "X-Remote-User", "Impersonate-User"):
        assert stripped.is_identity(name), name
    assert not stripped.is_identity("X-Forwarded-For")


def test_every_problem_of_the_flags_is_reported_at_once(tmp_path: Path) -> None:
    """k8s.io/apiserver's `RecommendedOptions.Validate` gathers every group's errors: so does
    `aggregator serve`, one line each, instead of stopping at the first."""
    folder = tmp_path / "apiservices"
    folder.mkdir()
    done = subprocess.run(
        [
            sys.executable, "-m", "aggregator", "serve",
            "--apiservices-dir", str(folder),
            "--secure-port", "70000",
            "--workers", "0",
            "--shutdown-delay-duration=-1s",
            "--backend-deny-cidrs", "not-a-cidr",
            "--write-apiservice-status",
            "--max-requests-inflight", "0",
            "--max-mutating-requests-inflight", "0",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert lines == [
        "aggregator serve: --secure-port: 70000 is not a valid port (0-65535)",
        "aggregator serve: --workers: 0 is not a valid worker count (1 or more)",
        "aggregator serve: --backend-deny-cidrs: 'not-a-cidr' is not a CIDR",
        "aggregator serve: --shutdown-delay-duration: can not be negative value",
        "aggregator serve: --enable-priority-and-fairness: invalid configuration: MaxRequestsInFlight=0 and "
        "MaxMutatingRequestsInFlight=0; they must add up to something positive",
        "aggregator serve: --write-apiservice-status: only applies in kube mode; it means nothing with "
        "--apiservices-dir",
    ], done.stderr


@pytest.mark.parametrize(
    "group",
    [
        "source", "serving", "server", "workers", "authentication", "authorization", "backends",
        "delegation", "availability", "leader_election", "audit", "logging", "tracing", "flowcontrol",
    ],
)
def test_every_options_group_validates_itself_the_same_way(group: str) -> None:
    """One signature for every group: `validate()` returns its problems, all of them."""
    options = Options()
    options.source.apiservices_dir = "."
    found = getattr(options, group).validate()
    assert isinstance(found, list) and all(isinstance(e, ConfigError) for e in found)


def test_every_options_group_applies_itself_to_the_configuration() -> None:
    """`complete` gives each group its turn (`apply_to`); nothing is left at Config's defaults
    that the flags set: every group's flags reach the part its component receives."""
    options = parse(
        "--apiservices-dir", ".",
        "--secure-port", "9443",
        "--max-requests-inflight", "7",
        "--shutdown-delay-duration", "3s",
        "--workers", "3",
        "--token-auth-file", "tokens.csv",
        "--authorization-mode", "AlwaysAllow",
        "--enable-aggregator-routing=true",
        "--audit-log-maxage", "5",
        "--log-format", "json",
        "--access-log", "all",
    )  # fmt: skip
    config = complete(options)
    assert (config.source.apiservices_dir, config.source.local_mode) == (".", True)
    assert config.serving.port == 9443 and config.serving.tls_policy == options.serving.tls_policy()
    assert config.requests.max_requests_inflight == 7
    assert config.shutdown == ShutdownConfig(delay=3.0, watch_grace=0.0, request_grace=60.0)
    assert config.workers == 3
    assert config.authentication.token_auth_file == "tokens.csv"
    assert config.authentication is not options.authentication  # a copy: later edits do not leak
    assert (config.authorization.modes, config.authorization.defaulted) == (("AlwaysAllow",), False)
    assert config.backends.enable_aggregator_routing
    assert config.audit.log_maxage == 5
    assert config.logging == LoggingConfig("json", 0, AccessLogPolicy("all"))
    assert config.tracing is None
    # API Priority and Fairness (on by default) shares both limits' seats
    assert config.flowcontrol == FlowControlConfig(server_concurrency_limit=7 + 200, request_timeout=60.0)


def test_without_priority_and_fairness_the_limits_are_max_in_flights_own() -> None:
    """`--enable-priority-and-fairness=false`: no APF configuration (max-in-flight), and limits that
    add up to nothing are no problem (each kind's 0 lifts its limit)."""
    options = parse(
        "--apiservices-dir", ".", "--enable-priority-and-fairness=false",
        "--max-requests-inflight", "0", "--max-mutating-requests-inflight", "0",
    )  # fmt: skip
    assert problems(options) == []
    assert complete(options).flowcontrol is None


def test_what_depends_on_the_mode_is_resolved_once(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("{}")
    local = complete(parse("--apiservices-dir", str(tmp_path)))
    assert local.backends.deny_cidrs == DEFAULT_DENY_CIDRS
    assert local.authorization.modes == ("RBAC",) and local.authorization.defaulted
    assert local.leader_election is None  # no status writes in local mode
    kube = complete(parse("--kubeconfig", str(kubeconfig)))
    assert kube.backends.deny_cidrs == KUBE_DEFAULT_DENY_CIDRS
    assert kube.authorization.modes == ("Webhook",)
    assert kube.leader_election is None  # elects only a writer of APIService status
    elect = ["--write-apiservice-status=true", "--leader-elect-resource-namespace", "ops"]
    writing = complete(parse("--kubeconfig", str(kubeconfig), *elect))
    assert writing.leader_election is not None and writing.leader_election.namespace == "ops"
    assert complete(parse("--apiservices-dir", ".")).workers == usable_cpus()


def test_the_configuration_reaches_a_worker_unchanged(tmp_path: Path) -> None:
    """The control sends its `Config` to each worker over the channel (pickled)."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("{}")
    flags = ["--write-apiservice-status=true", "--access-log", "sampled:5"]
    config = complete(parse("--kubeconfig", str(kubeconfig), *flags))
    assert pickle.loads(pickle.dumps(config)) == config
