"""`aggregator serve | certs init | demo | check`: flags named like kube-apiserver's."""

from __future__ import annotations

import argparse
import itertools
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from aggregator import __version__
from aggregator.config import add_serve_flags, complete, options_from_args, validate
from aggregator.util.flags import ConfigError, FlagParser, GoBool, csv_list, nearest_flag
from aggregator.util.logs import configure_logging

EXIT_USAGE = 2


class OneLineErrors(FlagParser):
    """A usage error is one line and a hint, not the whole usage (30 lines for `serve`); flags are
    read as pflag reads them (`util/flags.FlagParser`)."""

    def error(self, message: str) -> NoReturn:
        usage_error(self.prog, message)


def usage_error(prog: str, message: str) -> NoReturn:
    sys.stderr.write(f"{prog}: error: {message}\nSee '{prog} --help'.\n")
    sys.exit(EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrors(
        prog="aggregator",
        description="A Kubernetes API aggregation gateway: merged discovery and a verified, streaming "
        "proxy to extension API servers.",
    )
    parser.add_argument("--version", action="version", version=f"aggregator {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    serve = commands.add_parser(
        "serve",
        # kube-apiserver's `Usage:` line; every flag follows, by section.
        usage="%(prog)s [flags]",
        help="run the gateway",
        description="Serve merged discovery and proxy aggregated API groups, from a folder of manifests "
        "(--apiservices-dir, local mode) or from kube-apiserver (--kubeconfig or in-cluster).",
    )
    add_serve_flags(serve)

    certs = commands.add_parser("certs", help="certificate tools", description="Certificate tools.")
    certs_commands = certs.add_subparsers(dest="certs_command", metavar="COMMAND", required=True)
    init = certs_commands.add_parser(
        "init",
        help="write a serving CA and certificate, a client CA and admin certificate, a front-proxy CA and "
        "client certificate, and an admin kubeconfig",
        description="Write the PKI a local gateway needs. Existing files are kept unless --force.",
    )
    init.add_argument("--dir", default="certs", help="output folder (default certs/).")
    init.add_argument(
        "--hosts",
        type=csv_list,
        default=[],
        help="extra DNS names or IPs for the serving certificate (comma-separated).",
    )
    init.add_argument("--user", default="admin", help="user name (CN) of the admin client certificate.")
    init.add_argument(
        "--groups",
        type=csv_list,
        default=["system:masters"],
        help="groups (one O each) of the admin client certificate (default system:masters).",
    )
    init.add_argument(
        "--server", default="https://127.0.0.1:8443", help="server URL written into admin.kubeconfig."
    )
    init.add_argument("--force", action=GoBool, help="overwrite existing files.")

    demo = commands.add_parser(
        "demo",
        help="run the gateway in local mode in front of the sample extension API server",
        description="Create certificates (once), start the sample wardle.example.com server and the "
        "gateway in local mode, print curl and kubectl commands to try, and stop both on Ctrl-C. When "
        "the sample dies the gateway keeps serving; press Enter to start the sample again. Files you "
        "changed in the demo folder are never overwritten.",
    )
    demo.add_argument(
        "--dir", default="certs", help="where certificates and demo files live (default certs/)."
    )
    demo.add_argument("--bind-address", default="127.0.0.1", help="IP address both servers listen on.")
    demo.add_argument(
        "--secure-port", type=int, default=8443, help="the gateway's HTTPS port (default 8443)."
    )
    demo.add_argument(
        "--sample-port", type=int, default=0, help="the sample server's HTTPS port (default: a free port)."
    )

    from aggregator.commands.check import add_check_parser

    add_check_parser(commands)
    return parser


def command_parser(parser: argparse.ArgumentParser, names: Sequence[str | None]) -> argparse.ArgumentParser:
    """The parser of the (sub)command `names` (`serve`; `certs`, `init`)."""
    for name in names:
        if name is None:
            break
        commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = commands.choices[name]
    return parser


def unknown_arguments(parser: argparse.ArgumentParser, unknown: Sequence[str], given: Sequence[str]) -> str:
    """pflag's words for the first unknown flag (`unknown flag: --tls-cert`), with the flag that
    was probably meant; words that are not flags are listed as argparse lists them, with a hint
    when one follows a boolean flag (`--anonymous-auth false`: pflag takes no value there)."""
    flag = next((word for word in unknown if word.startswith("-")), None)
    if flag is None:
        message = f"unrecognized arguments: {' '.join(unknown)}"
        booleans = {n for a in parser._actions if isinstance(a, GoBool) for n in a.option_strings}
        for before, word in itertools.pairwise(given):
            if word == unknown[0] and before in booleans:
                return f'{message} ({before} takes a value only after "=": {before}={word})'
        return message
    message = f"unknown flag: {flag.split('=', 1)[0]}"
    names = parser.flag_names() if isinstance(parser, FlagParser) else []
    suggestion = nearest_flag(flag, names)
    return f"{message} (did you mean {suggestion}?)" if suggestion else message


def _certs_init(args: argparse.Namespace) -> int:
    from aggregator.commands.certs import init_pki

    directory = Path(args.dir)
    written = init_pki(
        directory, hosts=args.hosts, user=args.user, groups=args.groups, server=args.server, force=args.force
    )
    for path in written:
        print(f"wrote {path}")
    if not written:
        print(f"{directory}: every file already exists (use --force to replace them)")
    return 0


def _serve(args: argparse.Namespace) -> int:
    options = options_from_args(args)
    stop_logging = None
    try:
        validate(options)
        config = complete(options)
        stop_logging = configure_logging(config.logging.format, config.logging.verbosity)
        # Only the runner that runs is imported: the control process of --workers N loads neither
        # aiohttp's server nor the HTTP/2 listener (tests/runners/test_worker_imports.py).
        if config.workers > 1:
            from aggregator.runners.supervisor import run as run_workers

            return run_workers(config)
        from aggregator.runners.server import run

        return run(config)
    except ConfigError as err:
        if stop_logging is not None:
            stop_logging()  # whatever was logged before the failure goes out before the one line
        # Start-up problems (bad flags, unreadable certificates or kubeconfig, a busy port): one line
        # each, every one of them at once (InvalidOptions).
        for line in str(err).splitlines():
            print(f"aggregator serve: {line}", file=sys.stderr)
        return EXIT_USAGE
    finally:
        if stop_logging is not None:
            stop_logging()


def _demo(args: argparse.Namespace) -> int:
    import asyncio

    from aggregator.commands.demo import run_demo

    return asyncio.run(
        run_demo(
            args.dir, host=args.bind_address, gateway_port=args.secure_port, sample_port=args.sample_port
        )
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        # Reported by the command they were given to (argparse names only the top-level program).
        words = ["aggregator", getattr(args, "command", None), getattr(args, "certs_command", None)]
        given = list(sys.argv[1:] if argv is None else argv)
        command = command_parser(parser, words[1:])
        usage_error(" ".join(w for w in words if w), unknown_arguments(command, unknown, given))
    if args.command == "serve":
        return _serve(args)
    if args.command == "demo":
        return _demo(args)
    if args.command == "certs":
        return _certs_init(args)
    if args.command == "check":
        from aggregator.commands.check import main as check

        return check(args)
    return EXIT_USAGE
