"""A hostile client: raw HTTP/1.1 bytes over TLS, exactly as written, and the answer as it came.

Attack tests send what no well-behaved library would (header names spelled any way, bodies that
hold requests, bytes pipelined behind an upgrade) and need to see the raw answer and whether the
gateway closed the connection afterwards. With `--workers N`, `on_worker` finds a connection a
given worker serves (its note in `/livez?verbose`), so an attack is tried against every worker.
"""

from __future__ import annotations

import asyncio
import re
import ssl
from dataclasses import dataclass

from tests.support.pki import PKI

WORKER_NOTE = re.compile(rb"info: worker (\d+) of (\d+), pid (\d+)")
TIMEOUT = 10.0


@dataclass
class Answer:
    status: int
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k.lower() == name.lower()), None)


def request_bytes(method: str, path: str, headers: list[tuple[str, str]], body: bytes = b"") -> bytes:
    """A request head with `Host`, these header lines in this order, then `body` as is."""
    lines = [f"{method} {path} HTTP/1.1", "Host: gateway", *(f"{k}: {v}" for k, v in headers)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class RawConnection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, port: int, pki: PKI, cert: str | None = "admin") -> RawConnection:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=pki.client_context(cert), server_hostname="localhost"
        )
        return cls(reader, writer)

    def send(self, data: bytes) -> None:
        self.writer.write(data)

    async def answer(self) -> Answer:
        """One response: its head, then a Content-Length or chunked body."""
        head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), TIMEOUT)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ")[1])
        headers = [(k.strip(), v.strip()) for k, _, v in (line.partition(":") for line in lines[1:] if line)]
        values = {k.lower(): v for k, v in headers}
        if values.get("transfer-encoding", "").lower() == "chunked":
            body = b""
            while size := int((await asyncio.wait_for(self.reader.readuntil(b"\r\n"), TIMEOUT)).strip(), 16):
                body += await asyncio.wait_for(self.reader.readexactly(size + 2), TIMEOUT)
                body = body[:-2]
            await asyncio.wait_for(self.reader.readuntil(b"\r\n"), TIMEOUT)
        else:
            length = int(values.get("content-length", "0"))
            body = await asyncio.wait_for(self.reader.readexactly(length), TIMEOUT) if length else b""
        return Answer(status, headers, body)

    async def exchange(self, data: bytes) -> Answer:
        self.send(data)
        return await self.answer()

    async def closed_by_peer(self) -> bool:
        """True when the gateway closes the connection (EOF or reset) instead of answering."""
        try:
            data = await asyncio.wait_for(self.reader.read(65536), TIMEOUT)
        except (ConnectionError, ssl.SSLError):
            return True
        return data == b""

    async def worker(self) -> int:
        """Which worker serves this connection (0 for a single process)."""
        answer = await self.exchange(request_bytes("GET", "/livez?verbose", []))
        assert answer.status == 200, answer
        match = WORKER_NOTE.search(answer.body)
        return int(match.group(1)) if match else 0

    def close(self) -> None:
        self.writer.close()


async def on_worker(
    port: int, pki: PKI, worker: int, *, cert: str | None = "admin", tries: int = 200
) -> RawConnection:
    """A connection served by `worker` (fresh connections until the kernel hands one to it)."""
    for _ in range(tries):
        connection = await RawConnection.open(port, pki, cert)
        if await connection.worker() == worker:
            return connection
        connection.close()
    raise AssertionError(f"no connection reached worker {worker} in {tries} tries")
