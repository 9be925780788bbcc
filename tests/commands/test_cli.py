"""`aggregator` as a user runs it: flags, exit codes, and the one-line error for a wrong combination."""

from __future__ import annotations

import os
import signal
import ssl
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.support.pki import PKI
from tests.support.polling import until_blocking
from tests.support.ports import free_port

pytestmark = pytest.mark.long(80)

AGGREGATOR = [sys.executable, "-m", "aggregator"]


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean_env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
    return subprocess.run(
        [*AGGREGATOR, *args], capture_output=True, text=True, timeout=60, env=env or clean_env
    )


def test_help_documents_every_flag_named_in_the_issue() -> None:
    out = run_cli("serve", "--help").stdout
    for flag in (
        "--bind-address",
        "--secure-port",
        "--tls-cert-file",
        "--tls-private-key-file",
        "--cert-dir",
        "--tls-min-version",
        "--tls-cipher-suites",
        "--client-ca-file",
        "--requestheader-client-ca-file",
        "--requestheader-allowed-names",
        "--requestheader-username-headers",
        "--requestheader-group-headers",
        "--requestheader-extra-headers-prefix",
        "--proxy-client-cert-file",
        "--proxy-client-key-file",
        "--kubeconfig",
        "--apiservices-dir",
        "--log-format",
        "-v",
        "--write-apiservice-status",
        "--leader-elect",
        "--leader-elect-lease-duration",
        "--leader-elect-renew-deadline",
        "--leader-elect-retry-period",
        "--leader-elect-resource-lock",
        "--leader-elect-resource-name",
        "--leader-elect-resource-namespace",
        "--api-audiences",
    ):
        assert flag in out, flag
    # argparse prints a help line under every flag; none may be left without one.
    assert "default X-Remote-User" in out and "(default 8443" in out


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["--tls-cert-file", "{pki}/serving.crt"],
            "--tls-private-key-file: is required when --tls-cert-file is set",
        ),
        (
            ["--tls-private-key-file", "{pki}/serving.key"],
            "--tls-cert-file: is required when --tls-private-key-file is set",
        ),
        (
            ["--proxy-client-cert-file", "{pki}/front-proxy-client.crt"],
            "--proxy-client-key-file: is required when --proxy-client-cert-file is set",
        ),
        (
            ["--client-ca-file", "{tmp}/missing.crt"],
            "--client-ca-file: cannot read {tmp}/missing.crt: No such file or directory",
        ),
        (
            ["--apiservices-dir", "{tmp}/nowhere"],
            "--apiservices-dir: {tmp}/nowhere is not a readable directory",
        ),
        (["--secure-port", "70000"], "--secure-port: 70000 is not a valid port (0-65535)"),
        (["--bind-address", "localhost"], "--bind-address: 'localhost' is not an IP address"),
        (["--backend-deny-cidrs", "10.0.0.0/33"], "--backend-deny-cidrs: '10.0.0.0/33' is not a CIDR"),
        (
            [
                "--client-ca-file",
                "{pki}/client-ca.crt",
                "--requestheader-client-ca-file",
                "{pki}/client-ca.crt",
            ],
            "--requestheader-client-ca-file: is the same CA as --client-ca-file and --requestheader-allowed-names is empty",
        ),
        (
            ["--tls-min-version", "VersionTLS14"],
            '--tls-min-version: unknown tls version "VersionTLS14"; '
            "possible values: VersionTLS10, VersionTLS11, VersionTLS12, VersionTLS13",
        ),
        (
            ["--tls-cipher-suites", "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,TLS_FOO"],
            "--tls-cipher-suites: Cipher suite TLS_FOO not supported or doesn't exist",
        ),
        (
            ["--authorization-always-allow-paths", "/a*b"],
            "--authorization-always-allow-paths: '/a*b': '*' is only allowed at the end",
        ),
        (
            ["--leader-elect-lease-duration=10s"],
            "--leader-elect-lease-duration: leaseDuration must be greater than renewDeadline",
        ),
        (
            ["--leader-elect-resource-lock=endpoints"],
            "--leader-elect-resource-lock: endpoints lock is removed, migrate to leases",
        ),
        (
            ["--leader-elect-resource-lock=nope"],
            "--leader-elect-resource-lock: Invalid lock-type nope; possible values: leases",
        ),
        (["--access-log=most"], "--access-log: 'most' is not one of off, errors, sampled[:N], all"),
        # Kube-mode flags mean nothing in local mode: refused rather than silently ignored.
        *(
            (
                [flag],
                f"{flag.split('=')[0]}: only applies in kube mode; it means nothing with --apiservices-dir",
            )
            for flag in (
                "--delegate-auth=impersonate",
                "--delegate-auth=front-proxy",
                "--write-apiservice-status",
                "--leader-elect",
                "--leader-elect=false",
            )
        ),
        (
            ["--shutdown-watch-termination-grace-period=-1s"],
            "--shutdown-watch-termination-grace-period: can not be a negative value",
        ),
        (["--shutdown-delay-duration=-1s"], "--shutdown-delay-duration: can not be negative value"),
    ],
)
def test_wrong_combination_exits_2_with_one_line(
    pki: PKI, tmp_path: Path, args: list[str], expected: str
) -> None:
    (tmp_path / "objs").mkdir()
    filled = [a.format(pki=pki.dir, tmp=tmp_path) for a in args]
    if "--apiservices-dir" not in filled:
        filled += ["--apiservices-dir", str(tmp_path / "objs")]
    result = run_cli("serve", *filled)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert expected.format(pki=pki.dir, tmp=tmp_path) in lines[0]


@pytest.mark.parametrize(
    ("args", "first_line"),
    [
        # pflag's words (`unknown flag: --foo`), with the flag meant when one is near (cobra's rule).
        (["serve", "--foo", "bar"], "aggregator serve: error: unknown flag: --foo"),
        # No abbreviations, as pflag has none: argparse would have read these as the longer flags.
        (
            ["serve", "--tls-cert", "serving.crt"],
            "aggregator serve: error: unknown flag: --tls-cert (did you mean --tls-cert-file?)",
        ),
        (["serve", "--secure=8443"], "aggregator serve: error: unknown flag: --secure (did you mean --secure-port?)"),
        (
            ["serve", "--apiservice-dir", "objs"],
            "aggregator serve: error: unknown flag: --apiservice-dir (did you mean --apiservices-dir?)",
        ),
        (["check", "--al"], "aggregator check: error: unknown flag: --al (did you mean --all?)"),
        # Booleans: strconv.ParseBool's spellings only, a value only after "=".
        (
            ["serve", "--anonymous-auth=yes"],
            'aggregator serve: error: invalid argument "yes" for "--anonymous-auth" flag: '
            'strconv.ParseBool: parsing "yes": invalid syntax',
        ),
        (
            ["serve", "--anonymous-auth", "yes"],
            'aggregator serve: error: unrecognized arguments: yes (--anonymous-auth takes a value only after "=": '
            "--anonymous-auth=yes)",
        ),
        (
            ["serve", "--enable-aggregator-routing=on"],
            'aggregator serve: error: invalid argument "on" for "--enable-aggregator-routing" flag: '
            'strconv.ParseBool: parsing "on": invalid syntax',
        ),
        (
            ["serve", "--delegate-auth", "bogus"],
            "aggregator serve: error: argument --delegate-auth: invalid choice: 'bogus' "
            "(choose from 'front-proxy', 'impersonate')",
        ),
        (
            ["serve", "--secure-port", "x"],
            "aggregator serve: error: argument --secure-port: invalid int value: 'x'",
        ),
        (["certs", "init", "--bar"], "aggregator certs init: error: unknown flag: --bar"),
        (["certs", "init", "--forc"], "aggregator certs init: error: unknown flag: --forc (did you mean --force?)"),
        # pflag's words for a duration without a unit (kube-apiserver refuses `--request-timeout 5`).
        (
            ["serve", "--request-timeout", "5"],
            'aggregator serve: error: invalid argument "5" for "--request-timeout" flag: '
            'time: missing unit in duration "5"',
        ),
        (
            ["serve", "--authentication-token-webhook-cache-ttl=1d"],
            'aggregator serve: error: invalid argument "1d" for "--authentication-token-webhook-cache-ttl" '
            'flag: time: unknown unit "d" in duration "1d"',
        ),
        (
            ["serve", "--log-format", "xml"],
            "aggregator serve: error: argument --log-format: invalid choice: 'xml' (choose from 'text', 'json')",
        ),
        ([], "aggregator: error: the following arguments are required: COMMAND"),
    ],
)
def test_a_usage_error_is_one_line_and_a_hint(args: list[str], first_line: str) -> None:
    result = run_cli(*args)
    assert result.returncode == 2
    prog = first_line.split(": error:")[0]
    assert result.stderr.splitlines() == [first_line, f"See '{prog} --help'."]
    assert result.stdout == ""


def test_serve_help_opens_with_one_usage_line_and_check_describes_its_own_kubeconfig() -> None:
    serve = run_cli("serve", "--help").stdout.splitlines()
    assert serve[0] == "usage: aggregator serve [flags]" and serve[1] == ""
    check = run_cli("check", "--help").stdout
    assert check.splitlines()[0] == "usage: aggregator check (NAME | --all) [flags]"
    kubeconfig = " ".join(check.split("--kubeconfig KUBECONFIG", 1)[1].split("\n  --apiservices-dir")[0].split())
    assert "list APIServices, Services and EndpointSlices from, once" in kubeconfig
    assert "$KUBECONFIG, else ~/.kube/config" in kubeconfig and "delegate" not in kubeconfig
    # Boolean flags are shown bare, as pflag shows them.
    assert "\n  --all  " in check and "[ALL]" not in check


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        *((f"--anonymous-auth={text}", True) for text in ("1", "t", "T", "TRUE", "true", "True")),
        *((f"--anonymous-auth={text}", False) for text in ("0", "f", "F", "FALSE", "false", "False")),
        ("--anonymous-auth", True),
    ],
)
def test_a_boolean_takes_go_spellings_after_equals(flag: str, value: bool) -> None:
    from aggregator.commands.cli import build_parser
    from aggregator.config import options_from_args

    options = options_from_args(build_parser().parse_args(["serve", flag, "--apiservices-dir", "objs"]))
    assert options.authentication.anonymous is value
    assert options.source.apiservices_dir == "objs"  # the next word is never the boolean's value


def test_kube_mode_flags_at_their_defaults_are_not_refused_in_local_mode(tmp_path: Path) -> None:
    from aggregator.commands.cli import build_parser
    from aggregator.config import options_from_args, validate

    options = options_from_args(build_parser().parse_args(["serve", "--apiservices-dir", str(tmp_path)]))
    validate(options)
    assert (
        options.delegation.delegate_auth,
        options.availability.write_apiservice_status,
        options.leader_election.leader_elect,
    ) == (
        "front-proxy",
        False,
        True,
    )
    assert options.explicit_flags == frozenset()


def test_no_object_source_exits_2() -> None:
    result = run_cli("serve")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "aggregator serve: --apiservices-dir: neither --apiservices-dir nor --kubeconfig is set and no "
        "in-cluster service account was found"
    )


def test_mismatched_serving_pair_exits_2(pki: PKI, tmp_path: Path) -> None:
    result = run_cli(
        "serve",
        "--apiservices-dir",
        str(tmp_path),
        "--tls-cert-file",
        pki.path("serving.crt"),
        "--tls-private-key-file",
        pki.path("admin.key"),
    )
    assert result.returncode == 2
    assert "private key does not match the certificate" in result.stderr


def _wait_for_port(port: int, log_path: Path, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    """Until the gateway accepts TCP connections (log lines alone say nothing about the socket)."""
    import socket

    def listening() -> bool:
        if proc.poll() is not None:
            raise AssertionError(log_path.read_text())
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return True
        except OSError:
            return False

    until_blocking(listening, timeout, lambda: "the gateway to start: " + log_path.read_text(), every=0.1)


def test_certs_init_then_serve_answers_healthz_over_mutual_tls(tmp_path: Path) -> None:
    """The issue's own acceptance scenario, run as a user would."""
    certs, empty = tmp_path / "D", tmp_path / "empty"
    empty.mkdir()
    assert run_cli("certs", "init", "--dir", str(certs)).returncode == 0
    port = free_port()
    log_path = tmp_path / "serve.log"
    with log_path.open("wb") as log_file:
        proc = subprocess.Popen(
            [
                *AGGREGATOR,
                "serve",
                "--apiservices-dir",
                str(empty),
                "--tls-cert-file",
                str(certs / "serving.crt"),
                "--tls-private-key-file",
                str(certs / "serving.key"),
                "--client-ca-file",
                str(certs / "client-ca.crt"),
                "--secure-port",
                str(port),
                "--log-format",
                "json",
                "--access-log",
                "all",
            ],
            stderr=log_file,
        )
    try:
        _wait_for_port(port, log_path, proc)
        ctx = ssl.create_default_context(cafile=str(certs / "ca.crt"))
        ctx.load_cert_chain(str(certs / "admin.crt"), str(certs / "admin.key"))
        with urllib.request.urlopen(f"https://127.0.0.1:{port}/healthz", context=ctx) as resp:
            assert resp.status == 200
            assert resp.read() == b"ok"
        # curl, as the issue runs it
        curl = subprocess.run(
            [
                "curl",
                "-s",
                "--cacert",
                str(certs / "ca.crt"),
                "--cert",
                str(certs / "admin.crt"),
                "--key",
                str(certs / "admin.key"),
                f"https://127.0.0.1:{port}/healthz",
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert curl.stdout == "ok"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    log_text = log_path.read_text()
    assert '"msg": "serving"' in log_text and '"mode": "local"' in log_text
    assert '"path": "/healthz"' in log_text


def test_cert_dir_generates_a_self_signed_pair_when_no_cert_is_given(tmp_path: Path) -> None:
    port = free_port()
    cert_dir = tmp_path / "generated"
    log_path = tmp_path / "serve.log"
    with log_path.open("wb") as log_file:
        proc = subprocess.Popen(
            [
                *AGGREGATOR,
                "serve",
                "--apiservices-dir",
                str(tmp_path),
                "--cert-dir",
                str(cert_dir),
                "--secure-port",
                str(port),
            ],
            stderr=log_file,
        )
    try:
        _wait_for_port(port, log_path, proc)
        ctx = ssl.create_default_context(cafile=str(cert_dir / "apiserver.crt"))
        with urllib.request.urlopen(f"https://127.0.0.1:{port}/livez", context=ctx) as resp:
            assert resp.read() == b"ok"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
    assert oct((cert_dir / "apiserver.key").stat().st_mode & 0o777) == "0o600"


def test_busy_port_exits_2_with_one_line(pki: PKI, tmp_path: Path) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_cli(
            "serve",
            "--apiservices-dir",
            str(tmp_path),
            "--bind-address",
            "127.0.0.1",
            "--secure-port",
            str(port),
            "--tls-cert-file",
            pki.path("serving.crt"),
            "--tls-private-key-file",
            pki.path("serving.key"),
        )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        f"aggregator serve: --secure-port: cannot listen on 127.0.0.1:{port}: Address already in use"
    )


def test_unusable_kubeconfig_exits_2_with_one_line(pki: PKI, tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n")
    result = run_cli(
        "serve",
        "--kubeconfig",
        str(kubeconfig),
        "--proxy-client-cert-file",
        pki.path("front-proxy-client.crt"),
        "--proxy-client-key-file",
        pki.path("front-proxy-client.key"),
        "--secure-port",
        "0",
        "--cert-dir",
        str(tmp_path / "certs"),
    )
    assert result.returncode == 2, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("aggregator serve: --kubeconfig: "), result.stderr
    assert "Traceback" not in result.stderr
