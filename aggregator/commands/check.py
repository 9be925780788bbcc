"""`aggregator check NAME | --all`: walk an APIService's hops once and say which one fails.

The objects come from the same sources as `serve` (a folder, or one list of APIServices, Services
and EndpointSlices from kube-apiserver); the backend is reached through the gateway's own proxy
transport with the same flags (front-proxy client certificate, aggregator routing, deny list), so
what passes here passes for the gateway. Each hop is printed with ✓ or ✗ and its detail: the
Service, its port, the ready endpoints, the address dialed, TLS (the name expected, the names in
the certificate, the CA trusted), the HTTP status, and whether the discovery body decodes.

Like kubectl, the check finds its kube-apiserver without flags: `--kubeconfig`, else the first
existing file of `$KUBECONFIG`, else `~/.kube/config`, else the pod's service account (client-go's
loading rules; the files of a `$KUBECONFIG` list are not merged). With `--apiservices-dir` and no
`--proxy-client-*` flags it uses the `front-proxy-client.crt`/`.key` pair found in the folder or
one of its two parents, which is where `aggregator certs init` and `aggregator demo` put it, so
`aggregator check --all --apiservices-dir certs/demo/apiservices` works as the demo prints it.

With `--apiservices-dir`, `--all` also names every file of the folder the gateway would not
load, or not wholly (a file that does not parse, an object refused, a document of a kind it does
not read: `sources/problems.py`), and fails for it: `kubectl get apiservices` cannot show what
never loaded.

Exit status: 0 when every hop of every APIService checked passes (and, for `--all`, the folder
loads whole), 1 when one fails (or the APIService does not exist), 2 when the flags or the object
source are unusable.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from prometheus_client import CollectorRegistry

from aggregator.assembly import build_backends, flag_identity_policy
from aggregator.availability.ejections import EJECTED
from aggregator.availability.probe import (
    DISCOVERY_HOP,
    FAIL,
    MAX_BODY,
    PASS,
    SKIP,
    DiscoveryProbe,
    Report,
    Step,
    check_apiservice,
    discovery_path,
)
from aggregator.backends.addresses import Target
from aggregator.backends.errors import BackendError
from aggregator.backends.metrics import BackendMetrics
from aggregator.config import (
    Config,
    Options,
    add_backend_flags,
    add_source_flags,
    complete,
    options_from_args,
)
from aggregator.kube.client import KubeAPIError, KubeClient, KubeError, missing_kube_client
from aggregator.model.apiservice import APIService, service_column
from aggregator.model.decode import DecodeError
from aggregator.model.userinfo import AGGREGATOR
from aggregator.sources.kube import WATCHED, WatchedResource
from aggregator.sources.problems import ManifestProblem
from aggregator.sources.store import Kind, Obj, Store
from aggregator.util.flags import ConfigError, GoBool, InvalidOptions, check_readable
from aggregator.util.logs import configure_logging

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
# Every hop in the order it is walked; hops not reached are printed as such.
HOPS = ("apiservice", "service", "port", "endpoints", "address", "connect", "tls", "http", DISCOVERY_HOP)
LIST_PAGE = 500
CONCURRENT_CHECKS = 5
# The front-proxy client pair `aggregator certs init` writes (and the demo uses).
PROXY_CLIENT_STEM = "front-proxy-client"


def add_check_parser(commands: Any) -> argparse.ArgumentParser:
    """The `check` subcommand, with serve's object-source and backend flags."""
    parser: argparse.ArgumentParser = commands.add_parser(
        "check",
        usage="%(prog)s (NAME | --all) [flags]",
        help="check an APIService hop by hop and name the one that fails",
        description="Check an APIService (or --all of them) the way the gateway does: Service, port, "
        "ready endpoints, the address dialed, TLS, then GET /apis/<group>/<version> as "
        "system:kube-aggregator. Prints each hop with its detail; exits 0 only when every hop passes.",
    )
    parser.add_argument("name", nargs="?", help="APIService name, e.g. v1beta1.metrics.k8s.io")
    parser.add_argument("--all", action=GoBool, help="check every APIService and print a table")
    add_source_flags(parser, command="check")
    add_backend_flags(parser)
    parser.add_argument(
        "-v", "--v", dest="verbosity", type=int, default=0, help="log verbosity (4 and above: debug lines)."
    )
    return parser


# --- options -----------------------------------------------------------------------------------------


def kubeconfig_from_environment(environ: Mapping[str, str], home: Path) -> str | None:
    """client-go's default loading rules: the first existing file of `$KUBECONFIG`, else
    `~/.kube/config` (None: neither exists, so in-cluster or nothing)."""
    listed = [p for p in environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    for candidate in [*listed, *([] if listed else [str(home / ".kube" / "config")])]:
        if os.path.isfile(candidate):
            return candidate
    return None


def proxy_client_pair_near(folder: str) -> tuple[str, str] | None:
    """`front-proxy-client.crt`/`.key` in `folder` or one of its two parents (the demo's layout:
    `certs/demo/apiservices` beside `certs/front-proxy-client.crt`)."""
    here = Path(folder).absolute()
    for directory in (here, here.parent, here.parent.parent):
        cert, key = directory / f"{PROXY_CLIENT_STEM}.crt", directory / f"{PROXY_CLIENT_STEM}.key"
        if cert.is_file() and key.is_file():
            return _shown(cert), _shown(key)
    return None


def _shown(path: Path) -> str:
    """`path` relative to the working directory when it is below it (as a user would type it)."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def check_options(
    args: argparse.Namespace,
    notes: list[str] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    home: Path | None = None,
) -> Options:
    """Options for the check; raises ConfigError naming the flag that cannot work. `notes` gets a
    line for every default found on the user's behalf."""
    if bool(args.name) == bool(args.all):
        raise ConfigError("NAME", "give one APIService name, or --all")
    opts = options_from_args(args)
    notes = notes if notes is not None else []
    source, backends = opts.source, opts.backends
    if source.apiservices_dir is None and source.kubeconfig is None:
        found = kubeconfig_from_environment(os.environ if environ is None else environ, home or Path.home())
        if found is not None:
            source.kubeconfig = found
            notes.append(f"using the kubeconfig {found}")
    if source.apiservices_dir is not None and not (backends.proxy_client_cert_file or backends.proxy_client_key_file):
        pair = proxy_client_pair_near(source.apiservices_dir)
        if pair is not None:
            backends.proxy_client_cert_file, backends.proxy_client_key_file = pair
            notes.append(f"using the front-proxy client certificate {pair[0]} (--proxy-client-cert-file overrides)")
    errors = backends.validate()
    if errors:
        raise InvalidOptions(errors)
    check_readable("--kubeconfig", source.kubeconfig)
    if source.apiservices_dir is not None and not os.path.isdir(source.apiservices_dir):
        raise ConfigError("--apiservices-dir", f"{source.apiservices_dir} is not a readable directory")
    if source.apiservices_dir is None and source.kubeconfig is None and not source.in_cluster:
        raise ConfigError(
            "--apiservices-dir",
            "neither --apiservices-dir nor --kubeconfig is set, $KUBECONFIG and ~/.kube/config name no "
            "file, and no in-cluster service account was found",
        )
    problem = missing_kube_client() if source.kube_mode or source.kubeconfig else None
    if problem:
        raise ConfigError("--kubeconfig", problem)
    return opts


# --- loading the objects -----------------------------------------------------------------------------


@dataclass
class Loaded:
    """The objects to check, and why some kinds could not be read."""

    store: Store
    access_errors: dict[Kind, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    # What the folder holds that the gateway would not load (--apiservices-dir).
    problems: list[ManifestProblem] = field(default_factory=list)

    def access(self, kind: Kind) -> str | None:
        return self.access_errors.get(kind)


def load_folder(directory: str) -> Loaded:
    from aggregator.auth.rbacfolder import RBACFolder
    from aggregator.auth.rbacobjects import is_rbac
    from aggregator.flowcontrol.manifests import is_flowcontrol
    from aggregator.flowcontrol.sources import FolderConfig
    from aggregator.sources.files import FolderSource
    from aggregator.sources.problems import merged_problems

    store = Store()
    # RBAC and API Priority and Fairness objects are read by their own features: not "skipped"
    source = FolderSource(directory, store, read_elsewhere=lambda doc: is_rbac(doc) or is_flowcontrol(doc))
    source.reload()
    rbac = RBACFolder(directory)
    rbac.reload(initial=True)
    apf = FolderConfig(directory)
    apf.reload(initial=True)
    return Loaded(store, problems=list(merged_problems(source.problems, rbac.problems, apf.problems)()))


async def _list(client: KubeClient, spec: WatchedResource, loaded: Loaded) -> list[Obj]:
    items: list[Any] = []
    params: dict[str, str | int] = {"limit": LIST_PAGE}
    while True:
        doc = await client.request_json(spec.list_call, params=params)
        items.extend(doc.get("items") or [])
        token = (doc.get("metadata") or {}).get("continue")
        if not token:
            break
        params = {"limit": LIST_PAGE, "continue": str(token)}
    objects = []
    for item in items:
        try:
            objects.append(spec.decode(item))
        except DecodeError as err:
            name = (item.get("metadata") or {}).get("name", "?") if isinstance(item, dict) else "?"
            loaded.warnings.append(f"{spec.kind_name} {name}: skipped: {err}")
    return objects


async def load_kube(client: KubeClient) -> Loaded:
    """One list of each kind; a Service or EndpointSlice list that fails is an access error."""
    loaded = Loaded(Store())
    for spec in WATCHED:
        try:
            objects = await _list(client, spec, loaded)
        except KubeError as err:
            if spec.kind is Kind.APISERVICE:
                raise
            loaded.access_errors[spec.kind] = getattr(err, "message", "") or str(err)
            if isinstance(err, KubeAPIError) and err.status == 404:
                loaded.warnings.append(
                    f"the server does not serve {spec.kind_name}s: if it is a gateway in local mode, check "
                    "its manifests with --apiservices-dir instead"
                )
            continue
        loaded.store.replace_all(spec.kind, objects)
    return loaded


# --- the discovery hop the gateway does not need but a person does --------------------------------


def discovery_step(svc: APIService, body: bytes) -> Step:
    """Does the 2xx body decode as this group-version's APIResourceList?"""
    expected = f"{svc.group}/{svc.version}" if svc.group else svc.version
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as err:
        excerpt = body[:80].decode("utf-8", "replace")
        return Step(DISCOVERY_HOP, FAIL, f"the body is not JSON ({err})", (f"body: {excerpt!r}",))
    if not isinstance(doc, dict) or not isinstance(doc.get("resources"), list):
        kind = doc.get("kind") if isinstance(doc, dict) else type(doc).__name__
        return Step(DISCOVERY_HOP, FAIL, f"the body is not an APIResourceList (kind {kind!r})")
    if doc.get("groupVersion") != expected:
        return Step(
            DISCOVERY_HOP, FAIL, f"APIResourceList for {doc.get('groupVersion')!r}, expected {expected!r}"
        )
    names = [r.get("name", "?") for r in doc["resources"] if isinstance(r, dict)]
    shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
    count = f"{len(names)} resource{'s' if len(names) != 1 else ''}"
    return Step(
        DISCOVERY_HOP, PASS, f"APIResourceList for {expected}: {count}{': ' + shown if names else ''}"
    )


async def check_one(svc: APIService, loaded: Loaded, probe: DiscoveryProbe) -> Report:
    report = await check_apiservice(svc, loaded.store, probe, access=loaded.access, inspect_tls=True)
    if report.body is not None:
        report.steps.append(discovery_step(svc, report.body))
    return report


def passed(report: Report) -> bool:
    return report.verdict.available and report.failed_step is None


# --- printing ----------------------------------------------------------------------------------------


class Printer:
    """✓/✗ and colour when the terminal can show them; plain words otherwise."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        encoding = (getattr(out, "encoding", None) or "ascii").lower()
        try:
            "✓✗".encode(encoding)
            self.marks = {PASS: "✓", FAIL: "✗", SKIP: "-", "": "·"}
        except (UnicodeEncodeError, LookupError):
            self.marks = {PASS: "ok", FAIL: "X", SKIP: "-", "": "."}
        self.colour = out.isatty() and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"

    def paint(self, text: str, state: str) -> str:
        if not self.colour:
            return text
        code = {PASS: "32", FAIL: "31"}.get(state, "2")
        return f"\033[{code}m{text}\033[0m"

    def line(self, text: str = "") -> None:
        print(text, file=self.out)

    def report(self, svc: APIService, report: Report) -> None:
        self.line(f"APIService {svc.name} ({service_column(svc)}{_port(svc)})")
        self.line()
        steps = {s.hop: s for s in report.steps}
        reached = True
        width = max(len(h) for h in HOPS)
        for hop in HOPS:
            step = steps.get(hop)
            if svc.local and step is None:
                continue
            if step is None:
                summary, state = ("not reached" if not reached else "not checked"), ""
            else:
                summary, state = step.summary, step.state
                if step.state == FAIL:
                    reached = False
            mark = self.paint(self.marks[state], state)
            self.line(f"  {mark} {hop.ljust(width)}  {summary}")
            for detail in step.detail if step else ():
                self.line(f"  {' ' * (len(self.marks[PASS]) + 1 + width)}    {detail}")
        self.line()
        verdict = report.verdict
        available = "True" if verdict.available else f"{verdict.status} ({verdict.reason})"
        self.line(self.paint(f"Available: {available}", PASS if verdict.available else FAIL))
        self.line(f"  {verdict.message}")
        if verdict.available and report.failed_step is not None:
            self.line(
                f"  (the gateway would mark it available; the {report.failed_step.hop} hop fails for clients)"
            )

    def problems(self, problems: Sequence[ManifestProblem]) -> None:
        """The folder's files the gateway would not load, each with its cause."""
        self.line()
        self.line(f"Manifests the gateway does not load ({len(problems)}):")
        for problem in problems:
            self.line(f"{self.paint(self.marks[FAIL], FAIL)} {problem.describe()}")

    def endpoints(self, results: Sequence[tuple[str, str | None]]) -> None:
        """Each ready endpoint's own answer (--enable-aggregator-routing)."""
        self.line()
        self.line("Endpoints (each one's own GET; the gateway ejects those that fail, and balances over the rest):")
        for endpoint, failure in results:
            state = PASS if failure is None else FAIL
            mark = self.paint(self.marks[state], state)
            self.line(f"  {mark} {endpoint}  {'answered' if failure is None else 'ejected: ' + failure}")

    def table(self, rows: Sequence[tuple[APIService, Report]]) -> None:
        header = ("NAME", "SERVICE", "AVAILABLE", "HOP", "DETAIL")
        cells = [header]
        states = [""]
        for svc, report in rows:
            failed = report.failed_step
            verdict = report.verdict
            available = "True" if verdict.available else f"{verdict.status} ({verdict.reason})"
            cells.append(
                (
                    svc.name,
                    service_column(svc) + _port(svc),
                    available,
                    failed.hop if failed else "",
                    failed.summary if failed else "",
                )
            )
            states.append(FAIL if failed or not verdict.available else PASS)
        widths = [max(len(row[i]) for row in cells) for i in range(len(header) - 1)]
        for row, state in zip(cells, states, strict=True):
            text = "   ".join(c.ljust(w) for c, w in zip(row[:-1], widths, strict=True)) + "   " + row[-1]
            mark = self.paint(self.marks[state], state) if state else " "
            self.line(f"{mark} {text.rstrip()}")


def _port(svc: APIService) -> str:
    return f":{svc.service.port}" if svc.service is not None else ""


# --- running -----------------------------------------------------------------------------------------


async def run_check(config: Config, name: str | None, out: TextIO, err: TextIO) -> int:
    printer = Printer(out)
    client = config.source.kube_client() if config.source.kube_mode else None
    # Counted but never served: the check is a command, not a process Prometheus scrapes.
    metrics = BackendMetrics(CollectorRegistry())
    try:
        if client is not None:
            try:
                await client.start()
                loaded = await load_kube(client)
            except (KubeError, ConfigError) as problem:
                print(f"aggregator check: cannot list APIServices: {problem}", file=err)
                return EXIT_USAGE
        else:
            assert config.source.apiservices_dir is not None
            loaded = load_folder(config.source.apiservices_dir)
        for warning in loaded.warnings:
            print(f"warning: {warning}", file=err)
        if config.backends.proxy_client_cert_file is None:
            print(
                "warning: no --proxy-client-cert-file: backends that require a front-proxy client "
                "certificate will refuse the check",
                file=err,
            )
        identity = flag_identity_policy(config.authentication.requestheader)
        backends = build_backends(config.backends, loaded.store, metrics, identity=identity)
        await backends.start()
        try:
            probe = DiscoveryProbe(backends)
            if name is not None:
                for manifest in loaded.problems:
                    print(f"warning: {manifest.describe()}", file=err)
                return await _check_named(name, loaded, probe, printer, err)
            code = await _check_all(loaded, probe, printer)
            if loaded.problems:
                printer.problems(loaded.problems)
                return EXIT_FAILED
            return code
        finally:
            await backends.stop()
    finally:
        if client is not None:
            await client.stop()


async def _check_named(
    name: str, loaded: Loaded, probe: DiscoveryProbe, printer: Printer, err: TextIO
) -> int:
    name = name.split("/", 1)[1] if name.startswith(("apiservice/", "apiservices/")) else name
    svc = loaded.store.apiservice(name)
    if svc is None:
        known = ", ".join(sorted(s.name for s in loaded.store.apiservices())) or "none"
        print(f'aggregator check: apiservice "{name}" not found (APIServices: {known})', file=err)
        return EXIT_FAILED
    report = await check_one(svc, loaded, probe)
    printer.report(svc, report)
    endpoints = await check_endpoints(svc, probe)
    if endpoints:
        printer.endpoints(endpoints)
    stored = svc.condition()
    if stored is not None and EJECTED in stored.message:
        printer.line(f"  the gateway's last recorded condition: {stored.message}")
    return EXIT_OK if passed(report) else EXIT_FAILED


async def check_endpoints(svc: APIService, probe: DiscoveryProbe) -> list[tuple[str, str | None]]:
    """With --enable-aggregator-routing and more than one ready endpoint: each endpoint's own GET of
    the discovery path, as the gateway's ejection probe makes it: (endpoint, None when it answered,
    else why the gateway ejects it)."""
    backends = probe.backends
    resolver = backends.resolver
    if not resolver.endpoint_routing or svc.service is None:
        return []
    targets = [t for group in resolver.addresses(svc).groups for t in group if isinstance(t, Target)]
    if len(targets) < 2:
        return []

    async def one(target: Target) -> tuple[str, str | None]:
        try:
            async with asyncio.timeout(probe.timeout):
                response = await backends.get_from(
                    svc, target, discovery_path(svc), headers={}, user=AGGREGATOR, max_body=MAX_BODY
                )
        except BackendError as err:
            return target.authority, err.cause
        except TimeoutError:
            return target.authority, f"no answer within {probe.timeout:g}s"
        if response.status >= 500:
            return target.authority, f"answered {response.status}"
        return target.authority, None

    return list(await asyncio.gather(*(one(t) for t in targets)))


async def _check_all(loaded: Loaded, probe: DiscoveryProbe, printer: Printer) -> int:
    services = sorted(loaded.store.apiservices(), key=lambda s: s.name)
    if not services:
        printer.line("No APIServices found.")
        return EXIT_OK
    limit = asyncio.Semaphore(CONCURRENT_CHECKS)

    async def one(svc: APIService) -> Report:
        async with limit:
            return await check_one(svc, loaded, probe)

    reports = await asyncio.gather(*(one(s) for s in services))
    printer.table(list(zip(services, reports, strict=True)))
    return EXIT_OK if all(passed(r) for r in reports) else EXIT_FAILED


def main(args: argparse.Namespace) -> int:
    """`aggregator check`, from parsed arguments."""
    notes: list[str] = []
    try:
        options = check_options(args, notes)
    except ConfigError as problem:
        for line in str(problem).splitlines():
            print(f"aggregator check: {line}", file=sys.stderr)
        return EXIT_USAGE
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    configure_logging("text", args.verbosity)
    if args.verbosity < 4:
        # The printed hops say it all; library chatter only with -v.
        logging.getLogger().setLevel(logging.INFO if args.verbosity >= 1 else logging.ERROR)
    return asyncio.run(run_check(complete(options), args.name, sys.stdout, sys.stderr))
