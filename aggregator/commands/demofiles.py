"""The demo's files: where they live, which ports they name, and the rule that keeps the user's edits.

Everything lives under one folder (`certs/` by default, git-ignored). The PKI is written once and
never replaced. The files the demo derives from its ports (the two kubeconfigs, the manifests that
register the sample) are written when absent, and rewritten only while their content is still
exactly what the demo wrote last time: `demo/generated.sha256` records that, in `sha256sum`'s
format (`cd certs && sha256sum -c demo/generated.sha256` lists what you changed). A file whose
content differs was changed by someone else and is kept as it is, with a note; delete it to get a
fresh one. Other files in the manifests folder are never touched.

No file is written before `choose_ports` has found both ports usable, so a demo that cannot start
never breaks one that is running.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import yaml

WARDLE_NAMESPACE, WARDLE_SERVICE = "wardle", "api"


class DemoError(Exception):
    """The demo cannot start; the message says why and what to do."""


@dataclass(frozen=True)
class DemoLayout:
    """Where the demo keeps its files, all under one (git-ignored) folder."""

    certs: Path

    @property
    def demo(self) -> Path:
        return self.certs / "demo"

    @property
    def apiservices(self) -> Path:
        return self.demo / "apiservices"

    @property
    def wardle_manifests(self) -> Path:
        return self.apiservices / "wardle.yaml"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.certs / "demo.kubeconfig"

    @property
    def alice_kubeconfig(self) -> Path:
        return self.certs / "alice.kubeconfig"

    @property
    def stamp(self) -> Path:
        return self.demo / "generated.sha256"

    @property
    def sample_pid(self) -> Path:
        return self.demo / "sample.pid"

    @property
    def lock(self) -> Path:
        return self.demo / ".lock"

    def path(self, name: str) -> str:
        return str(self.certs / name)


# --- ports -------------------------------------------------------------------------------------------


def port_in_use(host: str, port: int) -> bool:
    """Would a server fail to listen there? (SO_REUSEADDR as servers set it: TIME_WAIT is no obstacle.)"""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as err:
            if err.errno in (errno.EADDRINUSE, errno.EACCES):
                return True
            raise
    return False


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def registered_port(manifests: Path) -> int | None:
    """The port the manifests register the sample on (its Service's first port), if readable."""
    try:
        docs = list(yaml.safe_load_all(manifests.read_text()))
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        return None
    for doc in docs:
        if not isinstance(doc, dict) or doc.get("kind") != "Service":
            continue
        meta, spec = doc.get("metadata") or {}, doc.get("spec") or {}
        if (meta.get("namespace"), meta.get("name")) != (WARDLE_NAMESPACE, WARDLE_SERVICE):
            continue
        ports = spec.get("ports") or []
        port = ports[0].get("port") if ports and isinstance(ports[0], dict) else None
        return port if isinstance(port, int) else None
    return None


@dataclass(frozen=True)
class Ports:
    gateway: int
    sample: int


def choose_ports(
    layout: DemoLayout, files: GeneratedFiles, *, host: str, gateway_port: int, sample_port: int = 0
) -> Ports:
    """Both ports, checked before anything is written; DemoError says which one is busy.

    The sample keeps the port its manifests register (so a running gateway's view stays right and
    edited manifests are obeyed); a busy one is replaced only while the manifests are the demo's own.
    """
    if port_in_use(host, gateway_port):
        raise DemoError(
            f"port {gateway_port} on {host} is in use (another demo or gateway?); stop it, or pick another "
            'port with --secure-port (make demo DEMO_ARGS="--secure-port 9443"). No file was changed.'
        )
    manifests = layout.wardle_manifests
    if sample_port:
        if sample_port == gateway_port or port_in_use(host, sample_port):
            raise DemoError(f"--sample-port {sample_port} on {host} is in use. No file was changed.")
        return Ports(gateway_port, sample_port)
    registered = registered_port(manifests) if manifests.exists() else None
    if registered is not None and registered != gateway_port and not port_in_use(host, registered):
        return Ports(gateway_port, registered)
    if registered is not None and files.changed(manifests):
        raise DemoError(
            f"{manifests} (changed by hand) registers the sample server on port {registered}, which is in "
            "use; free that port, pass --sample-port, or delete the file to get a fresh one. No file was "
            "changed."
        )
    port = free_port(host)
    while port == gateway_port:
        port = free_port(host)
    return Ports(gateway_port, port)


# --- generated files ---------------------------------------------------------------------------------


def _digest(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()


@dataclass
class GeneratedFiles:
    """What the demo wrote last time (path relative to the certs folder -> sha256 of the content)."""

    layout: DemoLayout
    written: dict[str, str] = field(default_factory=dict)
    kept: list[Path] = field(default_factory=list)

    @classmethod
    def load(cls, layout: DemoLayout) -> GeneratedFiles:
        written: dict[str, str] = {}
        with contextlib.suppress(OSError, UnicodeDecodeError):
            for line in layout.stamp.read_text().splitlines():
                digest, sep, name = line.partition("  ")
                if sep and len(digest) == 64:
                    written[name] = digest
        return cls(layout, written)

    def _key(self, path: Path) -> str:
        return path.relative_to(self.layout.certs).as_posix()

    def changed(self, path: Path) -> bool:
        """True when `path` exists and is not what the demo wrote there last."""
        try:
            content = path.read_bytes()
        except FileNotFoundError:
            return False
        return self.written.get(self._key(path)) != _digest(content)

    def write(self, path: Path, content: bytes, *, private: bool = False) -> bool:
        """Write `content` unless someone else changed the file; False (and noted) when kept."""
        try:
            current: bytes | None = path.read_bytes()
        except FileNotFoundError:
            current = None
        key = self._key(path)
        if current is not None and current != content and self.written.get(key) != _digest(current):
            self.kept.append(path)
            return False
        if current != content:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
            with os.fdopen(fd, "wb") as handle:
                handle.write(content)
            tmp.replace(path)  # whole files only: the gateway's folder watcher never reads half of one
        self.written[key] = _digest(content)
        return True

    def save(self) -> None:
        lines = [f"{digest}  {name}\n" for name, digest in sorted(self.written.items())]
        self.layout.demo.mkdir(parents=True, exist_ok=True)
        self.layout.stamp.write_text("".join(lines))

    def report(self, out: TextIO) -> None:
        for path in self.kept:
            print(
                f"aggregator demo: kept {path}: it was changed after the demo wrote it (delete it to get a "
                "fresh one)",
                file=out,
            )


def yaml_bytes(docs: list[dict[str, Any]]) -> bytes:
    return yaml.safe_dump_all(docs, sort_keys=False).encode()


# --- one demo per folder -----------------------------------------------------------------------------


@contextlib.contextmanager
def folder_lock(layout: DemoLayout) -> Iterator[None]:
    """Hold `demo/.lock` for the demo's life: a second demo on the same folder would rewrite the
    manifests the first one's gateway is serving."""
    layout.demo.mkdir(parents=True, exist_ok=True)
    fd = os.open(layout.lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            raise DemoError(
                f"another aggregator demo (pid {holder}) is using {layout.certs}; stop it, or use another "
                "folder with --dir"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)
