"""`aggregator certs init`: the files, their permissions, and that each certificate verifies."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from aggregator.commands.certs import PKI_FILES

pytestmark = pytest.mark.long(15)


def certs_init(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "aggregator", "certs", "init", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_writes_every_file_with_private_keys_0600(tmp_path: Path) -> None:
    result = certs_init("--dir", str(tmp_path / "c"))
    assert result.returncode == 0, result.stderr
    for name in PKI_FILES:
        path = tmp_path / "c" / name
        assert path.exists(), name
        if name.endswith(".key") or name.endswith(".kubeconfig"):
            assert path.stat().st_mode & 0o777 == 0o600, name


def test_openssl_verifies_each_certificate_against_its_ca(tmp_path: Path) -> None:
    certs_init("--dir", str(tmp_path))
    for leaf, ca in (("serving", "ca"), ("admin", "client-ca"), ("front-proxy-client", "front-proxy-ca")):
        out = subprocess.run(
            ["openssl", "verify", "-CAfile", str(tmp_path / f"{ca}.crt"), str(tmp_path / f"{leaf}.crt")],
            capture_output=True,
            text=True,
        )
        assert out.stdout.strip() == f"{tmp_path / leaf}.crt: OK", out.stderr
    # ...and not against another CA: the three CAs are really separate.
    wrong = subprocess.run(
        [
            "openssl",
            "verify",
            "-CAfile",
            str(tmp_path / "client-ca.crt"),
            str(tmp_path / "front-proxy-client.crt"),
        ],
        capture_output=True,
        text=True,
    )
    assert wrong.returncode != 0


def test_subjects_usages_and_sans(tmp_path: Path) -> None:
    certs_init(
        "--dir",
        str(tmp_path),
        "--hosts",
        "gw.example.com,10.1.2.3",
        "--user",
        "alice",
        "--groups",
        "devs,ops",
    )
    serving = load(tmp_path / "serving.crt")
    sans = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(sans.get_values_for_type(x509.DNSName)) == {"localhost", "gw.example.com"}
    assert {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)} == {"127.0.0.1", "10.1.2.3"}
    assert (
        ExtendedKeyUsageOID.SERVER_AUTH
        in serving.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    )

    admin = load(tmp_path / "admin.crt")
    assert admin.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "alice"
    assert [a.value for a in admin.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)] == [
        "devs",
        "ops",
    ]

    proxy = load(tmp_path / "front-proxy-client.crt")
    assert proxy.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "front-proxy-client"
    assert (
        ExtendedKeyUsageOID.CLIENT_AUTH
        in proxy.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    )


def test_default_admin_is_in_system_masters(tmp_path: Path) -> None:
    certs_init("--dir", str(tmp_path))
    admin = load(tmp_path / "admin.crt")
    assert admin.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "admin"
    assert [a.value for a in admin.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)] == [
        "system:masters"
    ]


def test_kubeconfig_embeds_serving_ca_and_admin_cert(tmp_path: Path) -> None:
    certs_init("--dir", str(tmp_path))
    config = yaml.safe_load((tmp_path / "admin.kubeconfig").read_text())
    cluster = config["clusters"][0]["cluster"]
    assert cluster["server"] == "https://127.0.0.1:8443"
    import base64

    assert base64.b64decode(cluster["certificate-authority-data"]) == (tmp_path / "ca.crt").read_bytes()
    user = config["users"][0]["user"]
    assert base64.b64decode(user["client-certificate-data"]) == (tmp_path / "admin.crt").read_bytes()
    assert base64.b64decode(user["client-key-data"]) == (tmp_path / "admin.key").read_bytes()


def test_existing_files_are_kept_unless_force(tmp_path: Path) -> None:
    certs_init("--dir", str(tmp_path))
    before = {n: (tmp_path / n).read_bytes() for n in PKI_FILES}
    again = certs_init("--dir", str(tmp_path))
    assert "every file already exists" in again.stdout
    assert {n: (tmp_path / n).read_bytes() for n in PKI_FILES} == before
    forced = certs_init("--dir", str(tmp_path), "--force")
    assert forced.returncode == 0
    assert (tmp_path / "ca.crt").read_bytes() != before["ca.crt"]


def test_a_missing_leaf_is_reissued_from_the_kept_ca(tmp_path: Path) -> None:
    certs_init("--dir", str(tmp_path))
    ca_before = (tmp_path / "ca.crt").read_bytes()
    (tmp_path / "serving.crt").unlink()
    result = certs_init("--dir", str(tmp_path))
    assert f"wrote {tmp_path / 'serving.crt'}" in result.stdout
    assert (tmp_path / "ca.crt").read_bytes() == ca_before
    out = subprocess.run(
        ["openssl", "verify", "-CAfile", str(tmp_path / "ca.crt"), str(tmp_path / "serving.crt")],
        capture_output=True,
    )
    assert out.returncode == 0
