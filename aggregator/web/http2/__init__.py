"""HTTP/2 on the serving port, chosen by ALPN, behind the same `ServerRequest` as HTTP/1.1.

kube-apiserver serves `h2` and `http/1.1` on one TLS listener (k8s.io/apiserver
pkg/server/secure_serving.go `tlsConfig`: `NextProtos: ["h2", "http/1.1"]`); client-go and kubectl
offer `h2` first. aiohttp has no HTTP/2 server; this package serves it on libnghttp2, the HTTP/2
library of curl and Apache httpd, through cffi (`nghttp2.py` says why and how):

- `listener.py`: the ALPN dispatch (once TLS is up, `h2` gets an `H2ServerConnection`, anything
  else the HTTP/1.1 handler); `serving.py`: what the listener's HTTP/2 connections share, and the
  registry of the live ones for shutdown;
- `connection.py`: one HTTP/2 connection: a libnghttp2 session between the transport and the
  streams, handlers bounded and scheduled as Go's server bounds them, graceful GOAWAY;
- `stream.py`: one stream as a `ServerRequest` (head, body with flow control, the connection's
  identity, cancellation) and its answer within the client's windows;
- `heads.py`: request heads checked and turned into the pipeline's headers, response heads
  encoded; `codes.py`: RFC 9113's error codes;
- `limits.py`: kube-apiserver's and Go's numbers; `guard.py`: the frame-level defences in front
  of the library.

Upgrades (exec, attach, port-forward) stay on HTTP/1.1: RFC 9113 forbids `Connection: Upgrade`.
"""
