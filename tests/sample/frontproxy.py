"""A minimal front proxy for tests: what kube-apiserver's aggregation layer does for kubectl.

It authenticates the caller by client certificate (client CA: CN = user, O = groups), then calls the
sample server with the front-proxy client certificate and the caller's identity in X-Remote-*
headers, streaming the response back (watches included). It lets real kubectl binaries talk to the
sample server without the gateway, and records each request so tests can see what kubectl asked.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field

import aiohttp
import yarl
from aiohttp import web

from aggregator.tls.peer import request_client_certificates
from aggregator.tls.verify import CAPool, CertificateError
from tests.support.pki import PKI

_HOP = {"connection", "keep-alive", "transfer-encoding", "upgrade", "te", "trailer", "host", "content-length"}


@dataclass
class Seen:
    method: str
    path_qs: str
    accept: str
    content_type: str
    user: str
    status: int = 0


@dataclass
class FrontProxy:
    pki: PKI
    backend: str
    port: int = 0
    seen: list[Seen] = field(default_factory=list)
    _runner: web.AppRunner | None = None
    _session: aiohttp.ClientSession | None = None

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    async def start(self) -> None:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(self.pki.path("serving.crt"), self.pki.path("serving.key"))
        request_client_certificates(ctx, lambda: [self.pki.path("client-ca.crt")])
        with open(self.pki.path("client-ca.crt"), "rb") as f:
            self._client_ca = CAPool(f.read(), source="client-ca.crt")
        upstream = ssl.create_default_context(cafile=self.pki.path("ca.crt"))
        upstream.load_cert_chain(
            self.pki.path("front-proxy-client.crt"), self.pki.path("front-proxy-client.key")
        )
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=upstream),
            auto_decompress=False,
            timeout=aiohttp.ClientTimeout(),
        )
        app = web.Application(client_max_size=8 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=ctx)
        await site.start()
        self.port = int(self._runner.addresses[0][1])  # (host, port) of the listening socket

    async def stop(self) -> None:
        if self._session is not None:
            await self._session.close()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        ssl_object = request.transport.get_extra_info("ssl_object") if request.transport else None
        der = ssl_object.getpeercert(binary_form=True) if ssl_object else None
        try:
            if not der:
                raise CertificateError("no client certificate")
            cert = self._client_ca.verify(der)
        except CertificateError:
            return web.json_response(
                {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "metadata": {},
                    "status": "Failure",
                    "message": "Unauthorized",
                    "reason": "Unauthorized",
                    "code": 401,
                },
                status=401,
            )
        seen = Seen(
            request.method,
            request.path_qs,
            request.headers.get("Accept", ""),
            request.headers.get("Content-Type", ""),
            cert.common_name,
        )
        self.seen.append(seen)
        headers = [
            (k, v)
            for k, v in request.headers.items()
            if k.lower() not in _HOP and not k.lower().startswith("x-remote-")
        ]
        headers.append(("X-Remote-User", cert.common_name))
        headers.extend(("X-Remote-Group", group) for group in (*cert.organizations, "system:authenticated"))
        assert self._session is not None
        async with self._session.request(
            request.method,
            yarl.URL(self.backend + request.raw_path, encoded=True),
            headers=headers,
            data=await request.read(),
            allow_redirects=False,
        ) as upstream:
            seen.status = upstream.status
            response = web.StreamResponse(status=upstream.status)
            for key, value in upstream.headers.items():
                if key.lower() not in _HOP:
                    response.headers.add(key, value)
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response
