"""One request to a running gateway over HTTP/1.1 or HTTP/2, as its user: status, body and headers
(lower-cased names, every value, in order)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
from yarl import URL

from tests.support.h2client import H2Client
from tests.support.pki import PKI

H1, H2 = "HTTP/1.1", "HTTP/2"
PROTOCOLS = (H1, H2)
LIMIT = aiohttp.ClientTimeout(total=30)
PL_UID = "x-kubernetes-pf-prioritylevel-uid"
FS_UID = "x-kubernetes-pf-flowschema-uid"


@dataclass
class Answer:
    status: int
    body: bytes
    headers: list[tuple[str, str]]

    def all(self, name: str) -> list[str]:
        return [v for k, v in self.headers if k == name.lower()]

    def one(self, name: str) -> str | None:
        values = self.all(name)
        return values[0] if values else None

    @property
    def uids(self) -> tuple[str | None, str | None]:
        """(FlowSchema UID, priority level UID) the gateway answered with."""
        return self.one(FS_UID), self.one(PL_UID)


class Client:
    """Requests as one user, over one protocol: HTTP/1.1 on a fresh connection each, or streams of
    one HTTP/2 connection (what kubectl does)."""

    def __init__(self, pki: PKI, port: int, protocol: str, cert: str | None) -> None:
        self.pki, self.port, self.protocol, self.cert = pki, port, protocol, cert
        self._session: aiohttp.ClientSession | None = None
        self._h2: H2Client | None = None

    async def request(self, method: str, path: str, headers: dict[str, str] | None = None) -> Answer:
        if self.protocol == H2:
            assert self._h2 is not None
            sid = self._h2.request(method, path, list((headers or {}).items()))
            response = await self._h2.response(sid, timeout=30)
            return Answer(response.status, response.body, [(k.lower(), v) for k, v in response.headers])
        assert self._session is not None
        url = URL(f"https://127.0.0.1:{self.port}{path}", encoded=True)
        async with self._session.request(
            method, url, ssl=self.pki.client_context(self.cert), headers=headers, timeout=LIMIT
        ) as resp:
            body = await resp.read()
            raw = [(k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in resp.raw_headers]
            return Answer(resp.status, body, raw)


@contextlib.asynccontextmanager
async def client(pki: PKI, port: int, protocol: str, cert: str | None = "admin") -> AsyncIterator[Client]:
    c = Client(pki, port, protocol, cert)
    if protocol == H2:
        async with H2Client.connect(port, pki.client_context(cert)) as h2:
            c._h2 = h2
            yield c
    else:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
            c._session = session
            yield c
