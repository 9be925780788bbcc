"""The demo's files: ports checked before anything is written, and the user's edits never overwritten."""

from __future__ import annotations

import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from aggregator.commands.demofiles import (
    DemoError,
    DemoLayout,
    GeneratedFiles,
    choose_ports,
    folder_lock,
    port_in_use,
    registered_port,
    yaml_bytes,
)
from aggregator.commands.wardle import local_manifests
from tests.support.ports import free_port

HOST = "127.0.0.1"


@pytest.fixture
def listening() -> Iterator[int]:
    """A port something listens on."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((HOST, 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def manifests(port: int) -> bytes:
    return yaml_bytes(local_manifests(b"-----BEGIN CERTIFICATE-----\n", port))


def test_generated_files_are_rewritten_only_while_unchanged(tmp_path: Path) -> None:
    layout = DemoLayout(tmp_path / "certs")
    files = GeneratedFiles.load(layout)
    target = layout.wardle_manifests
    assert files.write(target, manifests(1111)) and target.read_bytes() == manifests(1111)
    files.save()

    # Still the demo's own: a new port rewrites it.
    files = GeneratedFiles.load(layout)
    assert files.write(target, manifests(2222)) and target.read_bytes() == manifests(2222)
    files.save()

    # Edited by the user: kept, and said so.
    edited = target.read_bytes() + b"# mine\n"
    target.write_bytes(edited)
    files = GeneratedFiles.load(layout)
    assert files.changed(target)
    assert not files.write(target, manifests(3333))
    assert target.read_bytes() == edited and files.kept == [target]
    files.save()
    assert GeneratedFiles.load(layout).changed(target)  # and still the user's on the next start

    # `cd certs && sha256sum -c demo/generated.sha256` lists what the user changed.
    if shutil.which("sha256sum"):
        done = subprocess.run(
            ["sha256sum", "-c", "demo/generated.sha256"], cwd=layout.certs, capture_output=True, text=True
        )
        assert done.stdout == "demo/apiservices/wardle.yaml: FAILED\n"


def test_a_file_equal_to_what_the_demo_would_write_is_its_own_even_without_a_stamp(tmp_path: Path) -> None:
    """Folders from before the stamp existed: identical content is not a user edit."""
    layout = DemoLayout(tmp_path / "certs")
    layout.apiservices.mkdir(parents=True)
    layout.wardle_manifests.write_bytes(manifests(1111))
    files = GeneratedFiles.load(layout)
    assert files.write(layout.wardle_manifests, manifests(1111))
    assert files.write(layout.wardle_manifests, manifests(2222))
    assert files.kept == []


def test_private_files_are_written_0600(tmp_path: Path) -> None:
    layout = DemoLayout(tmp_path / "certs")
    files = GeneratedFiles.load(layout)
    files.write(layout.admin_kubeconfig, b"apiVersion: v1\n", private=True)
    assert layout.admin_kubeconfig.stat().st_mode & 0o777 == 0o600


def test_a_busy_gateway_port_fails_before_any_file_is_written(tmp_path: Path, listening: int) -> None:
    layout = DemoLayout(tmp_path / "certs")
    assert port_in_use(HOST, listening)
    with pytest.raises(DemoError, match=rf"port {listening} on {HOST} is in use .*No file was changed"):
        choose_ports(layout, GeneratedFiles.load(layout), host=HOST, gateway_port=listening)
    assert not layout.certs.exists()


def test_the_sample_keeps_the_port_its_manifests_register(tmp_path: Path, listening: int) -> None:
    layout = DemoLayout(tmp_path / "certs")
    files = GeneratedFiles.load(layout)
    gateway = free_port()
    registered = free_port()
    files.write(layout.wardle_manifests, manifests(registered))
    assert registered_port(layout.wardle_manifests) == registered
    assert choose_ports(layout, files, host=HOST, gateway_port=gateway).sample == registered

    # Busy, and still the demo's file: another port (the file will be rewritten).
    files.write(layout.wardle_manifests, manifests(listening))
    ports = choose_ports(layout, files, host=HOST, gateway_port=gateway)
    assert ports.sample not in (listening, gateway)

    # Busy, and the user's file: refuse rather than rewrite it.
    layout.wardle_manifests.write_bytes(manifests(listening) + b"# mine\n")
    with pytest.raises(
        DemoError, match=r"wardle\.yaml \(changed by hand\) registers the sample server on port"
    ):
        choose_ports(layout, files, host=HOST, gateway_port=gateway)
    # An explicit --sample-port must be free.
    with pytest.raises(DemoError, match=rf"--sample-port {listening} on {HOST} is in use"):
        choose_ports(layout, files, host=HOST, gateway_port=gateway, sample_port=listening)


def test_one_demo_per_folder(tmp_path: Path) -> None:
    layout = DemoLayout(tmp_path / "certs")
    second = pytest.raises(DemoError, match=r"another aggregator demo \(pid \d+\) is using")
    with folder_lock(layout), second, folder_lock(layout):
        pass
    with folder_lock(layout):  # released on exit
        pass
