"""The sample extension API server: TLS listener, front-proxy authentication, routing.

Every request except the health probes must come through a front proxy (the aggregator or
kube-apiserver) whose client certificate verifies against `--requestheader-client-ca-file`; the
user is the one the proxy names in `X-Remote-User`. Discovery and OpenAPI answers are rendered
once at start-up; resources live in memory for the life of the process.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from email.utils import format_datetime

from aiohttp import web

from aggregator import __version__
from aggregator.model.status import forbidden_details, forbidden_message
from aggregator.openapi.gnostic import CONTENT_TYPE as OPENAPI_V2_PROTOBUF_CONTENT_TYPE
from aggregator.openapi.gnostic import MEDIA_TYPE as OPENAPI_V2_PROTOBUF
from aggregator.tls.serving import ServingCertificate, resolve_serving_files
from aggregator.tls.verify import CAFile
from aggregator.util.logs import fields
from aggregator.util.runtime import wait_for_termination
from aggregator.web.requestinfo import RequestInfo, RequestInfoError, decoded_path, new_request_info
from aggregator.wire.gourl import parse_query
from aggregator.wire.jsonenc import encode_object, go_marshal_indent
from sample_apiserver.api import GROUP, VERSIONS
from sample_apiserver.auth import FrontProxyAuthenticator, StaticAuthorizer, Unauthenticated, log_refusal
from sample_apiserver.discovery import AGGREGATED_CONVERSIONS, Discovery, Rendered
from sample_apiserver.errors import APIError
from sample_apiserver.negotiation import negotiate
from sample_apiserver.openapi import OpenAPIDocuments
from sample_apiserver.options import SampleOptions, validate
from sample_apiserver.resources import ResourceHandlers, WatchSettings
from sample_apiserver.responses import json_response, not_found, status_response, wants_pretty
from sample_apiserver.store import ObjectStore

log = logging.getLogger(__name__)

HEALTH_PATHS = frozenset({"/healthz", "/livez", "/readyz"})
DISCOVERY_TYPES = ("application/json", "application/yaml")


class SampleAPI:
    """Request handling for one sample server: everything it owns lives here, nothing in modules."""

    def __init__(self, options: SampleOptions) -> None:
        assert options.requestheader_client_ca_file
        self.options = options
        self.store = ObjectStore(history=options.watch_history)
        self.discovery = Discovery()
        self.openapi = OpenAPIDocuments()
        self.started = dt.datetime.now(dt.UTC)
        self.front_proxy_ca = CAFile(options.requestheader_client_ca_file)
        self.authenticator = FrontProxyAuthenticator(
            self.front_proxy_ca,
            options.requestheader_allowed_names,
            username_headers=options.requestheader_username_headers,
            group_headers=options.requestheader_group_headers,
            extra_prefixes=options.requestheader_extra_headers_prefix,
        )
        self.authorizer = StaticAuthorizer(
            frozenset(options.authorization_allow_users), frozenset(options.authorization_allow_groups)
        )
        self.resources = ResourceHandlers(
            self.store,
            WatchSettings(
                bookmark_interval=options.watch_bookmark_interval,
                min_request_timeout=options.min_request_timeout,
            ),
        )

    def build_app(self) -> web.Application:
        app = web.Application(client_max_size=3 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app

    async def handle(self, request: web.Request) -> web.StreamResponse:
        started = time.monotonic()
        user_name = ""
        response: web.StreamResponse | None = None
        try:
            if request.path in HEALTH_PATHS or any(request.path.startswith(p + "/") for p in HEALTH_PATHS):
                response = web.Response(text="ok", content_type="text/plain")
                return response
            try:
                user = self.authenticator.authenticate(request)
            except Unauthenticated as err:
                log_refusal(request, str(err))
                response = status_response(request, 401, "Unauthorized")
                return response
            user_name = user.name
            try:
                url = request.rel_url
                info = new_request_info(
                    request.method,
                    decoded_path(url.raw_path),
                    parse_query(url.raw_query_string),
                    request_uri=request.raw_path,
                )
            except RequestInfoError as err:
                response = status_response(request, 500, str(err))
                return response
            if not self.authorizer.allowed(
                user, resource_request=info.is_resource_request, verb=info.verb, path=request.path
            ):
                response = self._forbidden(request, user.name, info.verb, info)
                return response
            try:
                if info.is_resource_request and info.api_group == GROUP:
                    response = await self.resources.handle(request, info)
                else:
                    response = self._non_resource(request)
            except APIError as err:
                response = _status(request, err)
            except (asyncio.CancelledError, ConnectionResetError, web.HTTPException):
                raise
            except Exception:
                log.exception("request failed", extra=fields(method=request.method, path=request.path))
                response = status_response(
                    request, 500, "Internal error occurred: the sample server failed to serve this request"
                )
            return response
        finally:
            log.info(
                "request",
                extra=fields(
                    method=request.method,
                    path=request.path,
                    status=response.status if response is not None else 499,
                    user=user_name,
                    duration_ms=round((time.monotonic() - started) * 1000, 2),
                ),
            )

    def _forbidden(self, request: web.Request, user: str, verb: str, info: RequestInfo) -> web.Response:
        if info.is_resource_request:
            message = forbidden_message(
                user,
                verb,
                resource=info.resource,
                subresource=info.subresource,
                group=GROUP,
                name=info.name,
                namespace=info.namespace,
            )
            details = forbidden_details(info.resource, GROUP, info.name)
        else:
            message = forbidden_message(user, verb, path=request.path)
            details = forbidden_details("", "", "")
        return status_response(request, 403, message, details=details)

    # --- non-resource paths ------------------------------------------------------------------------

    def _non_resource(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        if request.method not in ("GET", "HEAD"):
            if _known_non_resource(path):
                raise APIError(
                    405, "the server does not allow this method on the requested resource", details={}
                )
            return not_found(request)
        if path == "/apis":
            return self._apis(request, aggregated=True)
        if path == "/apis/":
            return self._apis(request, aggregated=False)
        if path in (f"/apis/{GROUP}", f"/apis/{GROUP}/"):
            return self._discovery_doc(request, self.discovery.group)
        for version in VERSIONS:
            if path in (f"/apis/{GROUP}/{version}", f"/apis/{GROUP}/{version}/"):
                return self._discovery_doc(request, self.discovery.resource_lists[version])
        if path in ("/openapi/v3", "/openapi/v3/"):
            return web.Response(body=self.openapi.index, content_type="application/json")
        if path.startswith("/openapi/v3/"):
            return self._openapi_v3(request, path.removeprefix("/openapi/v3/"))
        if path == "/openapi/v2":
            return self._openapi_v2(request)
        if path == "/version":
            return json_response(request, self._version())
        return not_found(request)

    def _apis(self, request: web.Request, *, aggregated: bool) -> web.Response:
        accept = request.headers.get("Accept", "")
        if aggregated:
            chosen = negotiate(accept, DISCOVERY_TYPES, AGGREGATED_CONVERSIONS, conversions_only=True)
            if chosen is not None and chosen.convert is not None:
                return self._aggregated(request, chosen.media_type, chosen.convert[1])
        return self._discovery_doc(request, self.discovery.group_list)

    def _aggregated(self, request: web.Request, media_type: str, version: str) -> web.Response:
        etag = f'"{self.discovery.etag}"'
        headers = {
            "Etag": etag,
            "Vary": "Accept",
            "Cache-Control": "public",
            "Content-Type": Discovery.aggregated_content_type(media_type, version),
        }
        if request.headers.get("If-None-Match") == etag:
            return web.Response(status=304, headers=headers)
        rendered = self.discovery.aggregated[version]
        return web.Response(body=self._pick(request, rendered, media_type), headers=headers)

    def _discovery_doc(self, request: web.Request, rendered: Rendered) -> web.Response:
        chosen = negotiate(request.headers.get("Accept", ""), DISCOVERY_TYPES)
        if chosen is None:
            return _not_acceptable(DISCOVERY_TYPES)
        return web.Response(
            body=self._pick(request, rendered, chosen.media_type), content_type=chosen.media_type
        )

    @staticmethod
    def _pick(request: web.Request, rendered: Rendered, media_type: str) -> bytes:
        if media_type == "application/yaml":
            return rendered.yaml
        return rendered.pretty if wants_pretty(request) else rendered.json

    def _openapi_v3(self, request: web.Request, gv_path: str) -> web.Response:
        data = self.openapi.v3.get(gv_path)
        if data is None:
            return web.Response(status=404, text="404 page not found\n")
        if negotiate(request.headers.get("Accept", ""), ("application/json",)) is None:
            return _not_acceptable(("application/json",))
        etag = self.openapi.v3_etags[gv_path]
        headers = {"Etag": f'"{etag}"', "Last-Modified": format_datetime(self.started, usegmt=True)}
        requested = request.query.get("hash")
        if requested:
            if requested != etag:
                raise web.HTTPMovedPermanently(location=f"/openapi/v3/{gv_path}?hash={etag}")
            headers["Vary"] = "Accept"
            headers["Cache-Control"] = "public, immutable"
            expires = dt.datetime.now(dt.UTC).replace(year=dt.datetime.now(dt.UTC).year + 1)
            headers["Expires"] = format_datetime(expires, usegmt=True)
        if request.headers.get("If-None-Match") == headers["Etag"]:
            return web.Response(status=304, headers=headers)
        return web.Response(body=data, content_type="application/json", headers=headers)

    def _openapi_v2(self, request: web.Request) -> web.Response:
        supported = ("application/json", OPENAPI_V2_PROTOBUF, OPENAPI_V2_PROTOBUF_CONTENT_TYPE)
        chosen = negotiate(request.headers.get("Accept", ""), supported)
        if chosen is None:
            return _not_acceptable(supported)
        if chosen.media_type == "application/json":
            data, etag, content_type = self.openapi.v2, self.openapi.v2_etag, "application/json"
        else:
            data, etag = self.openapi.v2_protobuf, self.openapi.v2_protobuf_etag
            content_type = OPENAPI_V2_PROTOBUF_CONTENT_TYPE
        headers = {"Etag": f'"{etag}"', "Vary": "Accept"}
        if request.headers.get("If-None-Match") == headers["Etag"]:
            return web.Response(status=304, headers=headers)
        return web.Response(body=data, headers={**headers, "Content-Type": content_type})

    def _version(self) -> dict[str, str]:
        return {
            "major": "1",
            "minor": "0",
            "gitVersion": f"v1.0.0-wardle+aggregator.{__version__}",
            "gitCommit": "",
            "gitTreeState": "",
            "buildDate": "",
            "goVersion": "",
            "compiler": "",
            "platform": "",
        }


def _known_non_resource(path: str) -> bool:
    return path.rstrip("/") in ("/apis", f"/apis/{GROUP}", "/openapi/v2", "/openapi/v3", "/version") or any(
        path.rstrip("/") == f"/apis/{GROUP}/{v}" for v in VERSIONS
    )


def _status(request: web.Request, err: APIError) -> web.Response:
    return web.Response(
        body=encode_object(err.body(), pretty=wants_pretty(request)),
        status=err.code,
        content_type="application/json",
    )


def _not_acceptable(types: tuple[str, ...]) -> web.Response:
    """apiserver's 406: the Status indented, without a trailing newline."""
    message = "only the following media types are accepted: " + ", ".join(types)
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": "NotAcceptable",
        "code": 406,
    }
    return web.Response(body=go_marshal_indent(body), status=406, content_type="application/json")


class SampleServer:
    """A sample server listening on TLS: `await start()` -> port, `url`, `await stop()`."""

    def __init__(self, options: SampleOptions) -> None:
        validate(options)
        assert options.requestheader_client_ca_file
        self.options = options
        cert_file, key_file, generated = resolve_serving_files(
            options.tls_cert_file, options.tls_private_key_file, options.cert_dir, ["localhost"]
        )
        if generated:
            log.info("generated a self-signed serving certificate", extra=fields(cert_file=cert_file))
        self.serving = ServingCertificate(
            cert_file, key_file, client_ca_files=[options.requestheader_client_ca_file]
        )
        self.api = SampleAPI(options)
        self.port = 0
        self._runner: web.AppRunner | None = None

    @property
    def store(self) -> ObjectStore:
        return self.api.store

    @property
    def url(self) -> str:
        host = self.options.bind_address
        host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
        return f"https://{host}:{self.port}"

    async def start(self) -> int:
        self._runner = web.AppRunner(self.api.build_app(), handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(
            self._runner,
            self.options.bind_address,
            self.options.secure_port,
            ssl_context=self.serving.context,
        )
        await site.start()
        self.serving.start()
        self.api.front_proxy_ca.start()
        sockets = getattr(site._server, "sockets", None) or []  # aiohttp has no public accessor
        self.port = int(sockets[0].getsockname()[1]) if sockets else self.options.secure_port
        log.info(
            "sample API server serving",
            extra=fields(
                address=f"https://{self.options.bind_address}:{self.port}",
                group=GROUP,
                front_proxy_ca=self.options.requestheader_client_ca_file,
                allowed_names=",".join(self.options.requestheader_allowed_names) or "any",
            ),
        )
        return self.port

    async def stop(self) -> None:
        self.api.store.close()  # ends open watches so the runner does not wait for them
        await self.serving.stop()
        await self.api.front_proxy_ca.stop()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


async def serve(options: SampleOptions) -> int:
    """Run until SIGTERM or SIGINT."""
    server = SampleServer(options)
    await server.start()
    await wait_for_termination()
    log.info("shutting down")
    await server.stop()
    return 0
