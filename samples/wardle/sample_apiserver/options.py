"""Options of the sample server; flags named like an aggregated API server's (kube-apiserver's)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

DEFAULT_CERT_DIR = "apiserver.local.config/certificates"


@dataclass
class SampleOptions:
    bind_address: str = "0.0.0.0"
    secure_port: int = 8444
    tls_cert_file: str | None = None
    tls_private_key_file: str | None = None
    cert_dir: str = DEFAULT_CERT_DIR
    requestheader_client_ca_file: str | None = None
    requestheader_allowed_names: list[str] = field(default_factory=list)
    requestheader_username_headers: list[str] = field(default_factory=lambda: ["X-Remote-User"])
    requestheader_group_headers: list[str] = field(default_factory=lambda: ["X-Remote-Group"])
    requestheader_extra_headers_prefix: list[str] = field(default_factory=lambda: ["X-Remote-Extra-"])
    authorization_allow_users: list[str] = field(default_factory=list)
    authorization_allow_groups: list[str] = field(default_factory=lambda: ["system:masters"])
    # Watches without timeoutSeconds last between this and twice this (kube-apiserver's rule).
    min_request_timeout: float = 1800.0
    # Events kept for watches that resume from a resourceVersion; older ones get 410 Expired.
    watch_history: int = 1000
    watch_bookmark_interval: float = 60.0
    log_format: str = "text"
    verbosity: int = 0


class OptionsError(ValueError):
    """A flag combination that cannot work; the message names the flag."""


def validate(options: SampleOptions) -> None:
    if not options.requestheader_client_ca_file:
        raise OptionsError(
            "--requestheader-client-ca-file: required: the sample server trusts only requests from a front "
            "proxy whose client certificate this CA signed"
        )
    if bool(options.tls_cert_file) != bool(options.tls_private_key_file):
        raise OptionsError("--tls-cert-file and --tls-private-key-file must be given together")
    if not 0 <= options.secure_port <= 65535:
        raise OptionsError(f"--secure-port: {options.secure_port} is not a valid port")
    if options.watch_history < 1:
        raise OptionsError("--default-watch-cache-size: must be at least 1")


def _csv(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m sample_apiserver",
        description="The wardle.example.com sample extension API server (flunders and fischers), "
        "to run behind the aggregator or kube-apiserver's aggregation layer.",
    )
    d = SampleOptions()
    parser.add_argument(
        "--bind-address", default=d.bind_address, help="address to listen on (default %(default)s)"
    )
    parser.add_argument(
        "--secure-port", type=int, default=d.secure_port, help="HTTPS port (default %(default)s)"
    )
    parser.add_argument("--tls-cert-file", help="serving certificate (PEM); re-read when it changes")
    parser.add_argument("--tls-private-key-file", help="serving key (PEM)")
    parser.add_argument(
        "--cert-dir",
        default=d.cert_dir,
        help="where a self-signed serving pair is generated when none is given",
    )
    parser.add_argument(
        "--requestheader-client-ca-file",
        help="CA that signs the front proxy's client certificate; only requests presenting such a "
        "certificate are served (required)",
    )
    parser.add_argument(
        "--requestheader-allowed-names",
        type=_csv,
        default=[],
        help="comma-separated common names allowed for the front proxy's certificate; empty allows any",
    )
    parser.add_argument(
        "--requestheader-username-headers", type=_csv, default=d.requestheader_username_headers
    )
    parser.add_argument("--requestheader-group-headers", type=_csv, default=d.requestheader_group_headers)
    parser.add_argument(
        "--requestheader-extra-headers-prefix", type=_csv, default=d.requestheader_extra_headers_prefix
    )
    parser.add_argument(
        "--authorization-allow-users",
        type=_csv,
        default=[],
        help="comma-separated users allowed every verb on every resource",
    )
    parser.add_argument(
        "--authorization-allow-groups",
        type=_csv,
        default=d.authorization_allow_groups,
        help="comma-separated groups allowed every verb on every resource (default system:masters); other "
        "authenticated users may only read discovery, OpenAPI and /version",
    )
    parser.add_argument("--min-request-timeout", type=float, default=d.min_request_timeout)
    parser.add_argument(
        "--default-watch-cache-size",
        dest="watch_history",
        type=int,
        default=d.watch_history,
        help="events kept for watches resuming from an old resourceVersion (default %(default)s)",
    )
    parser.add_argument(
        "--watch-bookmark-interval",
        type=float,
        default=d.watch_bookmark_interval,
        help="seconds between BOOKMARK events on watches that allow them (default %(default)s)",
    )
    parser.add_argument("--log-format", choices=("text", "json"), default="text")
    parser.add_argument("-v", "--v", dest="verbosity", type=int, default=0)
    return parser


def options_from_args(args: argparse.Namespace) -> SampleOptions:
    return SampleOptions(**{k: v for k, v in vars(args).items() if k in SampleOptions.__dataclass_fields__})
