"""The authentication and authorization flags: k8s.io/apiserver's `RequestHeaderAuthenticationOptions`,
`ClientCertAuthenticationOptions`, the delegating authentication options and `AuthorizationOptions`,
with kube-apiserver's names, defaults and refusals."""

from __future__ import annotations

import argparse
import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from aggregator.auth.modes import ModeError, check_modes, default_modes
from aggregator.auth.requestheader import RequestHeaderConfig
from aggregator.sources.options import SourceConfig
from aggregator.tls.verify import CAPool
from aggregator.util.flags import ConfigError, FlagSet, GoBool, GoDuration, Problems, check_readable, csv_list

DEFAULT_ALWAYS_ALLOW_PATHS = ("/healthz", "/readyz", "/livez")


@dataclass
class RequestHeaderOptions:
    """`--requestheader-*`: who may assert identity in headers, and in which headers. Also the
    header names the proxy strips from what it forwards (`backends/headers.py`)."""

    client_ca_file: str | None = None
    allowed_names: list[str] = field(default_factory=list)
    username_headers: list[str] = field(default_factory=lambda: ["X-Remote-User"])
    uid_headers: list[str] = field(default_factory=list)
    group_headers: list[str] = field(default_factory=lambda: ["X-Remote-Group"])
    extra_prefixes: list[str] = field(default_factory=lambda: ["X-Remote-Extra-"])

    @classmethod
    def add_flags(cls, flags: FlagSet) -> None:
        flags.add(
            "--requestheader-client-ca-file",
            field="client_ca_file",
            help="CA bundle that signs front-proxy client certificates; only callers presenting such a "
            "certificate may assert identity with the request headers below.",
        )
        flags.add(
            "--requestheader-allowed-names",
            field="allowed_names",
            type=csv_list,
            default=[],
            help="comma-separated common names allowed for front-proxy certificates; empty allows any name "
            "signed by --requestheader-client-ca-file.",
        )
        flags.add(
            "--requestheader-username-headers",
            field="username_headers",
            type=csv_list,
            default=["X-Remote-User"],
            help="request headers to read the user name from, first non-empty wins (default X-Remote-User).",
        )
        flags.add(
            "--requestheader-uid-headers",
            field="uid_headers",
            type=csv_list,
            default=[],
            help="request headers to read the user UID from (default none).",
        )
        flags.add(
            "--requestheader-group-headers",
            field="group_headers",
            type=csv_list,
            default=["X-Remote-Group"],
            help="request headers to read groups from (default X-Remote-Group).",
        )
        flags.add(
            "--requestheader-extra-headers-prefix",
            field="extra_prefixes",
            type=csv_list,
            default=["X-Remote-Extra-"],
            help="request header prefixes for user extra fields (default X-Remote-Extra-).",
        )

    def config(self, pool: CAPool) -> RequestHeaderConfig:
        """The front-proxy settings with the CA file's current pool (`ToAuthenticationRequestHeaderConfig`)."""
        return RequestHeaderConfig(
            pool=pool,
            allowed_names=frozenset(self.allowed_names),
            username_headers=tuple(self.username_headers),
            uid_headers=tuple(self.uid_headers),
            group_headers=tuple(self.group_headers),
            extra_prefixes=tuple(self.extra_prefixes),
        )


@dataclass
class AuthenticationOptions:
    client_ca_file: str | None = None
    requestheader: RequestHeaderOptions = field(default_factory=RequestHeaderOptions)
    anonymous: bool = False
    token_auth_file: str | None = None
    token_webhook_cache_ttl: float = 10.0
    # Empty (no --service-account-issuer to default from, as kube-apiserver does): reviews carry no
    # audiences and kube-apiserver checks tokens against its own.
    api_audiences: list[str] = field(default_factory=list)
    skip_lookup: bool = False

    @classmethod
    def add_flags(cls, parser: argparse.ArgumentParser, prefix: str) -> None:
        flags = FlagSet(parser, "authentication", prefix)
        flags.add(
            "--client-ca-file",
            field="client_ca_file",
            help="CA bundle that signs client certificates; a verified certificate authenticates as CN (user) "
            "and O (groups).",
        )
        RequestHeaderOptions.add_flags(FlagSet(parser, "authentication", prefix + "requestheader."))
        flags.add(
            "--anonymous-auth",
            field="anonymous",
            action=GoBool,
            default=False,
            help="serve requests without credentials as system:anonymous (default false: they get a 401, "
            "except on the always-allowed health paths).",
        )
        flags.add(
            "--token-auth-file",
            field="token_auth_file",
            help='static bearer tokens in kube-apiserver\'s CSV format (token,user,uid,"group1,group2"); '
            "re-read on change.",
        )
        flags.add(
            "--authentication-token-webhook-cache-ttl",
            field="token_webhook_cache_ttl",
            action=GoDuration,
            default=10.0,
            help="how long TokenReview answers are cached (default 10s).",
        )
        flags.add(
            "--api-audiences",
            field="api_audiences",
            type=csv_list,
            default=[],
            help="audiences a bearer token must be valid for, sent in every TokenReview and checked in its "
            "answer (default none: kube-apiserver checks the token against its own API audiences).",
        )
        flags.add(
            "--authentication-skip-lookup",
            field="skip_lookup",
            action=GoBool,
            help="do not read kube-system/extension-apiserver-authentication for missing CA settings.",
        )

    def validate(self) -> list[ConfigError]:
        problems = Problems()
        problems.check(check_readable, "--client-ca-file", self.client_ca_file)
        problems.check(check_readable, "--requestheader-client-ca-file", self.requestheader.client_ca_file)
        problems.check(check_readable, "--token-auth-file", self.token_auth_file)
        if (
            self.client_ca_file
            and self.requestheader.client_ca_file
            and not self.requestheader.allowed_names
            and _same_file_content(self.client_ca_file, self.requestheader.client_ca_file)
        ):
            problems.add(
                "--requestheader-client-ca-file",
                "is the same CA as --client-ca-file and --requestheader-allowed-names is empty, so any client "
                "certificate could assert any identity; use a separate front-proxy CA or set allowed names",
            )
        if self.token_webhook_cache_ttl < 0:
            problems.add("--authentication-token-webhook-cache-ttl", "must not be negative")
        return problems.errors

    def apply_to(self, config: AuthenticationTarget) -> None:
        """Authentication reads its flags as they are (`build.build_authentication`): a copy, so
        nothing done to the options later reaches a running gateway."""
        config.authentication = copy.deepcopy(self)

    def client_ca_files(self) -> list[str]:
        """The CAs whose clients the serving TLS asks for a certificate."""
        return [f for f in (self.client_ca_file, self.requestheader.client_ca_file) if f]


class AuthenticationTarget(Protocol):
    authentication: AuthenticationOptions


def _same_file_content(a: str, b: str) -> bool:
    try:
        return Path(a).read_bytes().strip() == Path(b).read_bytes().strip()
    except OSError:
        return False


@dataclass
class AuthorizationOptions:
    # None: the default for where the gateway runs (`modes_for`)
    modes: list[str] | None = None
    kubeconfig: str | None = None
    always_allow_paths: list[str] = field(default_factory=lambda: list(DEFAULT_ALWAYS_ALLOW_PATHS))
    always_allow_groups: list[str] = field(default_factory=lambda: ["system:masters"])
    webhook_cache_authorized_ttl: float = 10.0
    webhook_cache_unauthorized_ttl: float = 10.0

    @classmethod
    def add_flags(cls, parser: argparse.ArgumentParser, prefix: str) -> None:
        flags = FlagSet(parser, "authorization", prefix)
        flags.add(
            "--authorization-mode",
            field="modes",
            type=csv_list,
            default=None,
            help="ordered list of AlwaysAllow, RBAC (manifests in --apiservices-dir), Webhook "
            "(SubjectAccessReview) (default: Webhook in kube mode; RBAC, then Webhook with a kubeconfig, in local mode).",
        )
        flags.add(
            "--authorization-kubeconfig",
            field="kubeconfig",
            help="kubeconfig for SubjectAccessReviews (default: the main kubeconfig or in-cluster account).",
        )
        flags.add(
            "--authorization-always-allow-paths",
            field="always_allow_paths",
            type=csv_list,
            default=list(DEFAULT_ALWAYS_ALLOW_PATHS),
            help="non-resource paths allowed without a review; exact, or a prefix with a trailing '*' "
            "(default /healthz,/readyz,/livez).",
        )
        flags.add(
            "--authorization-always-allow-groups",
            field="always_allow_groups",
            type=csv_list,
            default=["system:masters"],
            help="groups allowed everything without a review (default system:masters).",
        )
        flags.add(
            "--authorization-webhook-cache-authorized-ttl",
            field="webhook_cache_authorized_ttl",
            action=GoDuration,
            default=10.0,
            help="how long an allowed SubjectAccessReview answer is cached (default 10s).",
        )
        flags.add(
            "--authorization-webhook-cache-unauthorized-ttl",
            field="webhook_cache_unauthorized_ttl",
            action=GoDuration,
            default=10.0,
            help="how long a denied SubjectAccessReview answer is cached (default 10s).",
        )

    def modes_for(self, *, local_mode: bool, has_kubeconfig: bool) -> list[str]:
        """`--authorization-mode`, or the default for where the gateway runs."""
        if self.modes is not None:
            return list(self.modes)
        return default_modes(local_mode=local_mode, has_kubeconfig=has_kubeconfig)

    def validate(self) -> list[ConfigError]:
        """The group's own refusals; whether its modes fit where the gateway runs is checked across
        groups (`modes_problem`)."""
        problems = Problems()
        problems.check(check_readable, "--authorization-kubeconfig", self.kubeconfig)
        for flag, ttl in (
            ("--authorization-webhook-cache-authorized-ttl", self.webhook_cache_authorized_ttl),
            ("--authorization-webhook-cache-unauthorized-ttl", self.webhook_cache_unauthorized_ttl),
        ):
            if ttl < 0:
                problems.add(flag, "must not be negative")
        for entry in self.always_allow_paths:
            if "*" in entry[:-1]:
                problems.add("--authorization-always-allow-paths", f"{entry!r}: '*' is only allowed at the end")
        return problems.errors

    def apply_to(self, config: AuthorizationTarget) -> None:
        """After the source's: the default modes depend on the mode and on a kubeconfig."""
        source = config.source
        has_kubeconfig = bool(source.kubeconfig or self.kubeconfig)
        config.authorization = AuthorizationConfig(
            modes=tuple(self.modes_for(local_mode=source.local_mode, has_kubeconfig=has_kubeconfig)),
            defaulted=self.modes is None,
            kubeconfig=self.kubeconfig,
            always_allow_paths=tuple(self.always_allow_paths),
            always_allow_groups=tuple(self.always_allow_groups),
            webhook_cache_authorized_ttl=self.webhook_cache_authorized_ttl,
            webhook_cache_unauthorized_ttl=self.webhook_cache_unauthorized_ttl,
        )

    def modes_problem(self, *, local_mode: bool, has_kubeconfig: bool) -> ConfigError | None:
        """`--authorization-mode` against where the gateway runs (`has_kubeconfig`: reviews can be
        sent: a kubeconfig, or kube mode's account)."""
        if self.modes is None:
            return None
        try:
            check_modes(self.modes, local_mode=local_mode, has_kubeconfig=has_kubeconfig)
        except ModeError as err:
            return ConfigError("--authorization-mode", str(err))
        return None


@dataclass(frozen=True)
class AuthorizationConfig:
    """The authorizers to build (`build.build_authorization`), the modes resolved for the mode."""

    modes: tuple[str, ...]
    # `--authorization-mode` not given: RBAC without manifests then defers or allows (`modes.py`)
    defaulted: bool = True
    kubeconfig: str | None = None
    always_allow_paths: tuple[str, ...] = DEFAULT_ALWAYS_ALLOW_PATHS
    always_allow_groups: tuple[str, ...] = ("system:masters",)
    webhook_cache_authorized_ttl: float = 10.0
    webhook_cache_unauthorized_ttl: float = 10.0


class AuthorizationTarget(Protocol):
    @property
    def source(self) -> SourceConfig: ...

    authorization: AuthorizationConfig
