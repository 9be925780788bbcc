"""Frame-level defences: what an HTTP/2 client may send before the connection is cut.

`FrameGuard` reads the 9-byte header of every frame the client sends, before the h2 library
parses it, and counts what the h2 library does not bound on its own:

- header blocks: the encoded bytes of a HEADERS frame and its CONTINUATION frames, and how many
  CONTINUATION frames (CVE-2024-27316: Go's `readMetaFrame` refuses a block well past the header
  list size before decoding it);
- SETTINGS frames with more than 100 entries (Go's `processSettings`);
- frames that demand an answer (PING, SETTINGS) and PRIORITY frames, over a token bucket
  (CVE-2019-9512, CVE-2019-9515), and those answers piling up while the client does not read them
  (Go's `maxQueuedControlFrames`);
- consecutive frames that carry nothing (CVE-2019-9518).

`TokenBucket` is also the reset budget of `connection.py` (rapid reset and MadeYouReset).
Pure: no sockets, no event loop; the clock is passed in.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from aggregator.web.http2.codes import ErrorCode
from aggregator.web.http2.limits import H2Limits

PREFACE_LENGTH = 24  # b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", checked by the h2 library
FRAME_HEADER = 9

DATA, HEADERS, PRIORITY, SETTINGS, PING, CONTINUATION = 0x0, 0x1, 0x2, 0x4, 0x6, 0x9
# Frames the guard has no count for (RST_STREAM, GOAWAY, WINDOW_UPDATE: the connection counts the
# resets), passed over without a call.
_UNCOUNTED = frozenset({0x3, 0x7, 0x8})
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4


class Violation(Exception):
    """The client broke a limit: the connection ends with a GOAWAY carrying `code`.

    `reason` names the limit (the `aggregator_http2_goaways_total` label and the log line).
    """

    def __init__(self, reason: str, code: ErrorCode, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.code = code


class TokenBucket:
    """`burst` tokens, refilled at `rate` per second; `take` is False once they are spent."""

    __slots__ = ("_clock", "_last", "_tokens", "burst", "rate")

    def __init__(self, burst: int, rate: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.burst = float(burst)
        self.rate = rate
        self._clock = clock
        self._tokens = float(burst)
        self._last = clock()

    def take(self) -> bool:
        now = self._clock()
        tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
        self._last = now
        if tokens < 1.0:
            self._tokens = tokens
            return False
        self._tokens = tokens - 1.0
        return True


class FrameGuard:
    """Sees every inbound frame's header, in order, across reads; raises `Violation`."""

    __slots__ = (
        "_block",
        "_continuations",
        "_control",
        "_empty",
        "_in_block",
        "_partial",
        "_skip",
        "limits",
        "unanswered",
        "writing_paused",
    )

    def __init__(self, limits: H2Limits, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits
        self._control = TokenBucket(limits.control_burst, limits.control_rate, clock)
        self._skip = PREFACE_LENGTH  # payload bytes still to pass over (the preface first)
        self._partial = b""  # a frame header split across reads
        self._in_block = False
        self._block = 0
        self._continuations = 0
        self._empty = 0
        # Set by the connection while its transport is paused (the client is not reading).
        self.writing_paused = False
        self.unanswered = 0

    def resumed(self) -> None:
        """The client reads again: the answers queued for it are on their way."""
        self.writing_paused = False
        self.unanswered = 0

    def inspect(self, data: bytes) -> None:
        size = len(data)
        pos = self._skip  # zero whenever a partial header is kept
        if pos >= size:
            self._skip = pos - size
            return
        if self._partial:
            data = self._partial + data
            size = len(data)
        frame = self._frame
        while pos + FRAME_HEADER <= size:
            length = (data[pos] << 16) | (data[pos + 1] << 8) | data[pos + 2]
            kind = data[pos + 3]
            if kind in _UNCOUNTED and not self._in_block:
                self._empty = 0  # RST_STREAM, WINDOW_UPDATE, GOAWAY: nothing to count
            else:
                frame(kind, data[pos + 4], length)
            pos += FRAME_HEADER + length
        if pos <= size:
            self._partial = data[pos:]
            self._skip = 0
        else:
            self._partial = b""
            self._skip = pos - size

    def _frame(self, kind: int, flags: int, length: int) -> None:
        limits = self.limits
        if kind == DATA:
            self._count_empty(length == 0 and not flags & END_STREAM)
            return
        if kind == HEADERS:
            self._in_block = not flags & END_HEADERS
            self._block = length
            self._continuations = 0
            self._count_empty(length == 0 and self._in_block)
            return
        if kind == CONTINUATION:
            self._continuations += 1
            self._block += length
            if self._block > limits.max_header_block:
                raise Violation(
                    "header_block",
                    ErrorCode.PROTOCOL_ERROR,
                    f"header block over {limits.max_header_block} bytes",
                )
            if self._continuations > limits.max_continuations:
                raise Violation(
                    "continuation_flood",
                    ErrorCode.ENHANCE_YOUR_CALM,
                    f"more than {limits.max_continuations} CONTINUATION frames in one header block",
                )
            if flags & END_HEADERS:
                self._in_block = False
            self._count_empty(length == 0 and self._in_block)
            return
        self._empty = 0
        if kind == SETTINGS:
            if flags & ACK:
                return
            if length // 6 > limits.max_settings_per_frame:
                raise Violation(
                    "settings",
                    ErrorCode.PROTOCOL_ERROR,
                    f"SETTINGS frame with {length // 6} entries (at most {limits.max_settings_per_frame})",
                )
            self._answered("SETTINGS")
        elif kind == PING:
            if not flags & ACK:
                self._answered("PING")
        elif kind == PRIORITY and not self._control.take():
            raise Violation("control_flood", ErrorCode.ENHANCE_YOUR_CALM, "PRIORITY frames too fast")

    def _answered(self, kind: str) -> None:
        """A frame the gateway must answer."""
        if not self._control.take():
            raise Violation("control_flood", ErrorCode.ENHANCE_YOUR_CALM, f"{kind} frames too fast")
        if self.writing_paused:
            self.unanswered += 1
            if self.unanswered > self.limits.max_queued_control_frames:
                raise Violation(
                    "control_queue",
                    ErrorCode.ENHANCE_YOUR_CALM,
                    f"more than {self.limits.max_queued_control_frames} answers queued for a client "
                    "that does not read them",
                )

    def _count_empty(self, empty: bool) -> None:
        if not empty:
            self._empty = 0
            return
        self._empty += 1
        if self._empty > self.limits.max_empty_frames:
            raise Violation(
                "empty_frames",
                ErrorCode.ENHANCE_YOUR_CALM,
                f"more than {self.limits.max_empty_frames} consecutive frames without payload",
            )
