"""The frame guard and the token bucket, frame by frame, with a clock the test moves: the limits
the live attacks (test_defences.py) cannot reach cheaply, and frame headers split across reads."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hyperframe.frame import ContinuationFrame, DataFrame, HeadersFrame, PingFrame, SettingsFrame

from aggregator.web.http2.guard import FrameGuard, TokenBucket, Violation
from aggregator.web.http2.limits import H2Limits

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_bucket_refills_at_its_rate_up_to_its_burst() -> None:
    clock = Clock()
    bucket = TokenBucket(3, 2.0, clock)
    assert [bucket.take() for _ in range(4)] == [True, True, True, False]
    clock.now += 0.5  # one token back
    assert [bucket.take(), bucket.take()] == [True, False]
    clock.now += 100  # never more than the burst
    assert [bucket.take() for _ in range(4)] == [True, True, True, False]


def test_answers_queued_for_a_client_that_does_not_read_are_bounded() -> None:
    limits = replace(H2Limits(), control_burst=10**6, max_queued_control_frames=50)
    guard = FrameGuard(limits, Clock())
    guard.inspect(PREFACE)
    ping = PingFrame(0, b"12345678").serialize()
    guard.inspect(ping * 100)  # read while the client reads its answers: fine
    guard.writing_paused = True
    guard.inspect(ping * 50)
    with pytest.raises(Violation) as raised:
        guard.inspect(ping)
    assert raised.value.reason == "control_queue"
    guard2 = FrameGuard(limits, Clock())
    guard2.inspect(PREFACE)
    guard2.writing_paused = True
    guard2.inspect(ping * 50)
    guard2.resumed()  # it read them: the count starts over
    guard2.writing_paused = True
    guard2.inspect(ping * 50)


def test_frame_headers_split_anywhere_across_reads_are_still_counted() -> None:
    guard = FrameGuard(H2Limits(), Clock())
    frames = PREFACE + HeadersFrame(1, b"\x82", flags=["END_HEADERS"]).serialize()
    frames += b"".join(DataFrame(1, b"").serialize() for _ in range(11))
    with pytest.raises(Violation) as raised:
        for i in range(len(frames)):  # one byte per read
            guard.inspect(frames[i : i + 1])
    assert raised.value.reason == "empty_frames"


def test_a_settings_ack_and_a_ping_ack_need_no_answer() -> None:
    limits = replace(H2Limits(), control_burst=5, control_rate=0.0)
    guard = FrameGuard(limits, Clock())
    guard.inspect(PREFACE)
    guard.inspect(SettingsFrame(0, flags=["ACK"]).serialize() * 100)
    guard.inspect(PingFrame(0, b"12345678", flags=["ACK"]).serialize() * 100)
    guard.inspect(PingFrame(0, b"12345678").serialize() * 5)
    with pytest.raises(Violation):
        guard.inspect(PingFrame(0, b"12345678").serialize())


def test_continuations_are_counted_per_header_block() -> None:
    limits = replace(H2Limits(), max_continuations=3)
    guard = FrameGuard(limits, Clock())
    guard.inspect(PREFACE)
    for sid in (1, 3):  # three each: within the limit, block after block
        guard.inspect(HeadersFrame(sid, b"\x82").serialize())
        guard.inspect(ContinuationFrame(sid, b"\x84").serialize() * 2)
        guard.inspect(ContinuationFrame(sid, b"\x86", flags=["END_HEADERS"]).serialize())
    guard.inspect(HeadersFrame(5, b"\x82").serialize())
    with pytest.raises(Violation) as raised:
        guard.inspect(ContinuationFrame(5, b"\x84").serialize() * 4)
    assert raised.value.reason == "continuation_flood"
