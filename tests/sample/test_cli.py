"""`python -m sample_apiserver` as a human runs it: flags, a real request, clean exit on SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

import aiohttp

from tests.support.pki import PKI
from tests.support.polling import until_async
from tests.support.ports import free_port


async def test_module_serves_until_sigterm(pki: PKI, tmp_path: Path) -> None:
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "sample_apiserver",
        "--bind-address",
        "127.0.0.1",
        "--secure-port",
        str(port),
        "--tls-cert-file",
        pki.path("serving.crt"),
        "--tls-private-key-file",
        pki.path("serving.key"),
        "--requestheader-client-ca-file",
        pki.path("front-proxy-ca.crt"),
        "--requestheader-allowed-names",
        "front-proxy-client",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        async with aiohttp.ClientSession() as session:

            async def listed() -> bool:
                try:
                    async with session.get(
                        f"https://127.0.0.1:{port}/apis/wardle.example.com/v1beta1/namespaces/default/flunders",
                        headers={"X-Remote-User": "admin", "X-Remote-Group": "system:masters"},
                        ssl=pki.client_context("front-proxy-client"),
                    ) as response:
                        assert response.status == 200
                        assert (await response.json())["kind"] == "FlunderList"
                        return True
                except aiohttp.ClientConnectorError:
                    return False

            await until_async(listed, 30, "the sample server to start", every=0.1)
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 10) == 0
        assert process.stdout is not None
        output = (await process.stdout.read()).decode()
        assert "sample API server serving" in output
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def test_missing_front_proxy_ca_is_a_clear_error() -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "sample_apiserver",
        "--secure-port",
        "0",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(process.communicate(), 20)
    assert process.returncode == 2
    assert b"--requestheader-client-ca-file: required" in err


async def test_unreadable_certificate_is_a_clear_error(pki: PKI, tmp_path: Path) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "sample_apiserver",
        "--secure-port",
        "0",
        "--tls-cert-file",
        str(tmp_path / "missing.crt"),
        "--tls-private-key-file",
        str(tmp_path / "missing.key"),
        "--requestheader-client-ca-file",
        pki.path("front-proxy-ca.crt"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(process.communicate(), 20)
    assert process.returncode == 1
    assert b"missing.crt" in err
