"""HTTP/2 on the serving port, chosen by ALPN, feeding the same request pipeline as HTTP/1.1.

kube-apiserver serves `h2` and `http/1.1` on one TLS listener (k8s.io/apiserver
pkg/server/secure_serving.go `tlsConfig`: `NextProtos: ["h2", "http/1.1"]`); client-go and kubectl
offer `h2` first. aiohttp has no HTTP/2 server, so this package adds one on the sans-IO `h2`
library:

- `listener.py`: the ALPN dispatch (once TLS is up, `h2` gets an `H2ServerConnection`, anything
  else aiohttp's HTTP/1.1 handler); `serving.py`: what the listener's HTTP/2 connections share,
  and the registry of the live ones for shutdown;
- `connection.py`: one HTTP/2 connection: frames in, events to streams, frames out, handlers
  bounded and scheduled as Go's server bounds them, graceful GOAWAY;
- `stream.py`: one stream as the aiohttp request the pipeline already knows (head, body stream,
  the connection's identity, cancellation), and its response writer with flow control;
- `limits.py`: kube-apiserver's and Go's numbers; `guard.py`: the frame-level defences.

Upgrades (exec, attach, port-forward) stay on HTTP/1.1: RFC 9113 forbids `Connection: Upgrade`.
"""
