"""The numbers an HTTP/2 connection lives by: kube-apiserver's, Go's, and where neither has one,
nghttp2's and Envoy's.

kube-apiserver (k8s.io/apiserver pkg/server/secure_serving.go `Serve`) configures Go's server with
`MaxConcurrentStreams` (`--http2-max-streams-per-connection`, 100 when the flag is 0: "match
http2.initialMaxConcurrentStreams used by clients ... a malicious client can only open 400 streams
before we forcibly close the connection"), a 256 KiB receive buffer and read frame size per stream
("at least 99% of serialized resources in surveyed clusters were smaller than 256kb"), that buffer
times the stream limit per connection, `MaxHeaderBytes` 1 MiB, and a 90 s idle timeout.
golang.org/x/net/http2 server.go adds the rest: a handler queue of 4x the stream limit before
GOAWAY ENHANCE_YOUR_CALM (CVE-2023-44487), 10,000 queued control frames, 100 settings per frame,
a 10 s preface timeout, and 1 s between an error GOAWAY and the close.
"""

from __future__ import annotations

from dataclasses import dataclass

# kube-apiserver's default when --http2-max-streams-per-connection is 0 (secure_serving.go).
DEFAULT_MAX_STREAMS = 100
# secure_serving.go `resourceBody99Percentile`: the per-stream receive window and read frame size.
RESOURCE_BODY_99TH_PERCENTILE = 256 * 1024
# kube-apiserver's `http.Server.MaxHeaderBytes` (1 MiB), padded as Go's http2
# `adjustHTTP1MaxHeaderSize` does for HTTP/2's 32 bytes of overhead per field (10 typical fields).
MAX_HEADER_LIST_SIZE = (1 << 20) + 10 * 32


@dataclass(frozen=True)
class H2Limits:
    # SETTINGS_MAX_CONCURRENT_STREAMS, and the number of handlers that may run at once (Go counts
    # the handlers of streams already reset too: server.go `scheduleHandler`).
    max_streams: int = DEFAULT_MAX_STREAMS
    # SETTINGS_INITIAL_WINDOW_SIZE: request body bytes a client may send on a stream before the
    # gateway has read them.
    stream_window: int = RESOURCE_BODY_99TH_PERCENTILE
    # SETTINGS_MAX_FRAME_SIZE for frames the client sends.
    max_frame_size: int = RESOURCE_BODY_99TH_PERCENTILE
    # SETTINGS_MAX_HEADER_LIST_SIZE, enforced by the HPACK decoder.
    max_header_list_size: int = MAX_HEADER_LIST_SIZE
    # Decoded header bytes (RFC 9113 6.5.2's accounting) held at once by the streams of one
    # connection: past it a request is answered 431 instead of being decoded further, so HPACK
    # references multiplied over 100 streams cannot pin hundreds of MiB (RFC 7541 7.3).
    max_header_bytes_held: int = 4 * MAX_HEADER_LIST_SIZE
    # A header block (HEADERS and its CONTINUATION frames) is refused past this many encoded bytes
    # before it is decoded (CVE-2024-27316, "CONTINUATION flood"): Go's `readMetaFrame` stops at a
    # fragment more than twice the header bytes it will still accept.
    max_header_block: int = 2 * MAX_HEADER_LIST_SIZE
    # ...and past this many CONTINUATION frames (the h2 library's own bound).
    max_continuations: int = 64
    # SETTINGS frames with more entries are a connection error (server.go `settings_big_or_dups`).
    max_settings_per_frame: int = 100
    # Control frames the gateway answers (SETTINGS ACK, PING ACK, RST_STREAM) while the client is
    # not reading its answers: past this the connection is closed (server.go
    # `maxQueuedControlFrames`, CVE-2019-9512 and CVE-2019-9515).
    max_queued_control_frames: int = 10_000
    # Stream resets, the client's and those the gateway sends because of the client's protocol
    # errors (MadeYouReset, CVE-2025-8671), over a token bucket: nghttp2's stream reset rate limit
    # (`NGHTTP2_DEFAULT_STREAM_RESET_BURST` 1000, `..._RATE` 33 per second). Past it: GOAWAY
    # ENHANCE_YOUR_CALM.
    reset_burst: int = 1000
    reset_rate: float = 33.0
    # Streams the client resets before their handler started (what a rapid-reset flood is made
    # of; a client cancels a request it is waiting on, not one it just sent): past this many at
    # once, refilled at `reset_rate`, GOAWAY ENHANCE_YOUR_CALM.
    unstarted_reset_burst: int = DEFAULT_MAX_STREAMS
    # PING and SETTINGS frames (each one makes the gateway answer) over a token bucket; client-go
    # pings once every 30 s on an idle connection.
    control_burst: int = 1000
    control_rate: float = 100.0
    # Consecutive frames carrying nothing (an empty DATA without END_STREAM, an empty header block
    # fragment) before GOAWAY (CVE-2019-9518; Envoy's `max_consecutive_inbound_frames_with_empty_payload`).
    max_empty_frames: int = 10
    # Request body bytes buffered per stream before the gateway stops returning window to the client
    # (aiohttp's StreamReader limit: reading pauses at twice this).
    body_buffer: int = 2**16
    # No stream for this long: GOAWAY and close (kube-apiserver's IdleTimeout).
    idle_timeout: float = 90.0
    # The client preface and first SETTINGS must arrive within this (server.go `prefaceTimeout`).
    preface_timeout: float = 10.0
    # After an error GOAWAY, the connection is read (and discarded) this long before it is closed,
    # so the client reads the GOAWAY instead of a TCP reset (server.go `goAwayTimeout`).
    goaway_timeout: float = 1.0

    @property
    def connection_window(self) -> int:
        """The connection's receive window: the per-stream buffer times the stream limit
        (secure_serving.go `MaxReceiveBufferPerConnection`)."""
        return self.stream_window * self.max_streams

    @property
    def max_queued_handlers(self) -> int:
        """Streams waiting for a handler slot before GOAWAY ENHANCE_YOUR_CALM (server.go
        `scheduleHandler`: `4*sc.advMaxStreams`)."""
        return 4 * self.max_streams

    @classmethod
    def for_flag(cls, max_streams_per_connection: int) -> H2Limits:
        """`--http2-max-streams-per-connection`: zero or less means kube-apiserver's 100."""
        streams = max_streams_per_connection if max_streams_per_connection > 0 else DEFAULT_MAX_STREAMS
        return cls(max_streams=streams, unstarted_reset_burst=streams)
