"""HTTP/1.1 on the serving port: aiohttp's low-level server (its C parser, llhttp) behind the
gateway's `ServerRequest` (`web/serverrequest.py`).

- `server.py`: every aiohttp server internal the gateway relies on: the header-read timeout
  (`TimedServer`), the TLS handshake deadline and the ALPN-dispatching protocol factory
  (`TimedSite`), the request class that drops aiohttp's `Server` header and reports heads
  (`GatewayRequest`), and the raw connection after a `101`;
- `request.py`: one request as a `ServerRequest` (`Http1Request`), its streamed answer and its
  upgrade tunnel, and `serve_http1`, the handler aiohttp calls.

The sibling `web/http2/` serves HTTP/2 behind the same interface: nothing above these two knows
which protocol carried a request. Upgrades (exec, attach, port-forward) exist only here.
"""
