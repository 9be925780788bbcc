"""HTTP/2 with `--workers 2`, as shipped: every worker negotiates h2 on the shared port and serves
the same routes over it, the group's metrics count the connections of both, and
`--disable-http2-serving` takes h2 out of every worker's ALPN."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.runners.test_supervisor import _register
from tests.support.backend import PREFIX, BackendPKI, FakeBackend
from tests.support.h2client import H2Client, negotiated_alpn
from tests.support.pki import PKI
from tests.workers.group import PID_NOTE, running_group

pytestmark = pytest.mark.long(10)


async def test_every_worker_serves_http2(
    pki: PKI, apiservices_dir: Path, tmp_path: Path, backend: FakeBackend, backend_pki: BackendPKI
) -> None:
    _register(apiservices_dir, backend, backend_pki)
    async with running_group(pki, apiservices_dir, tmp_path / "serve.log", "--workers", "2") as group:
        pids: set[int] = set()
        connections = 0
        while len(pids) < 2:
            async with H2Client.connect(group.port, group.context()) as client:
                connections += 1
                livez = await client.get("/livez?verbose")
                match = PID_NOTE.search(livez.body.decode())
                assert livez.status == 200 and match is not None
                pids.add(int(match.group(3)))
                answers = [client.request("GET", f"{PREFIX}/namespaces/default/things") for _ in range(8)]
                for sid in answers:
                    proxied = await client.response(sid)
                    assert proxied.status == 200 and b'"user": "admin"' in proxied.body
                discovery = await client.get("/apis")
                assert discovery.status == 200 and b"demo.example.com" in discovery.body
                assert client.goaway is None
            assert connections < 200, f"every fresh connection went to {pids}"
        status, body = await group.get("/metrics")
        assert status == 200
        h2 = sum(
            float(m.group(1))
            for m in re.finditer(
                r'^aggregator_connections_total\{protocol="h2"[^}]*\} (\S+)$', body.decode(), re.M
            )
        )
        assert h2 == connections


async def test_disable_http2_serving_reaches_every_worker(
    pki: PKI, apiservices_dir: Path, tmp_path: Path
) -> None:
    args = ("--workers", "2", "--disable-http2-serving")
    async with running_group(pki, apiservices_dir, tmp_path / "serve.log", *args) as group:
        pids: set[int] = set()
        tries = 0
        while len(pids) < 2:
            chosen, answer = await negotiated_alpn(group.port, group.context(), ["h2", "http/1.1"])
            assert chosen == "http/1.1"
            match = PID_NOTE.search(answer.decode())
            assert answer.startswith(b"HTTP/1.1 200") and match is not None, answer
            pids.add(int(match.group(3)))
            tries += 1
            assert tries < 200, f"every fresh connection went to {pids}"
