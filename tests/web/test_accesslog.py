"""`--access-log`: which requests get a line, and logging that never blocks the event loop."""

from __future__ import annotations

import io
import logging
import os
import sys
import threading
import time

import aiohttp
import pytest

from aggregator.config import validate
from aggregator.util.flags import ConfigError
from aggregator.util.logs import configure_logging
from aggregator.web.accesslog import AccessLog, AccessLogError, AccessLogPolicy
from tests.conftest import StartGateway
from tests.support.gateway import local_options
from tests.support.pki import PKI


@pytest.mark.parametrize(
    ("text", "verbosity", "expected"),
    [
        (None, 0, AccessLogPolicy("errors")),
        (None, 3, AccessLogPolicy("all")),
        ("off", 5, AccessLogPolicy("off")),
        ("sampled", 0, AccessLogPolicy("sampled", 100)),
        ("sampled:7", 0, AccessLogPolicy("sampled", 7)),
        ("all", 0, AccessLogPolicy("all")),
    ],
)
def test_policy_from_the_flag_and_the_verbosity(text: str | None, verbosity: int, expected: AccessLogPolicy) -> None:
    assert AccessLogPolicy.parse(text, verbosity=verbosity) == expected


@pytest.mark.parametrize("text", ["loud", "sampled:0", "sampled:x", "all:3"])
def test_bad_values_are_refused(text: str, pki: PKI, tmp_path: object) -> None:
    with pytest.raises(AccessLogError):
        AccessLogPolicy.parse(text)
    with pytest.raises(ConfigError, match="--access-log"):
        validate(local_options(pki, str(tmp_path), access_log=text))


def test_which_codes_each_mode_logs() -> None:
    codes = [200, 404, 500, 200, 503, 499, 200, 200]
    assert [AccessLog(AccessLogPolicy("off")).wanted(c) for c in codes] == [False] * 8
    assert [AccessLog(AccessLogPolicy("all")).wanted(c) for c in codes] == [True] * 8
    errors = AccessLog(AccessLogPolicy("errors"))
    assert [errors.wanted(c) for c in codes] == [False, False, True, False, True, True, False, False]
    sampled = AccessLog(AccessLogPolicy("sampled", 2))
    # every failure, and one in two of the rest
    assert [sampled.wanted(c) for c in codes] == [True, False, True, True, True, True, False, True]


async def test_errors_mode_logs_only_failures_through_the_gateway(
    start_gateway: StartGateway, pki: PKI, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="aggregator.access")
    server = await start_gateway()  # the default: errors
    async with aiohttp.ClientSession() as session:
        for path in ("/livez", "/apis", "/nothing-here"):
            async with session.get(server.url + path, ssl=pki.client_context()) as resp:
                await resp.read()
    assert [r for r in caplog.records if r.name == "aggregator.access"] == []


def test_a_stalled_stderr_never_blocks_a_log_call(monkeypatch: pytest.MonkeyPatch) -> None:
    read_end, write_end = os.pipe()
    stalled = io.TextIOWrapper(os.fdopen(write_end, "wb", buffering=0), write_through=True)
    monkeypatch.setattr(sys, "stderr", stalled)
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    stop = configure_logging("text", 0)
    drained = threading.Event()
    try:
        started = time.monotonic()
        line = "x" * 1000
        for _ in range(2000):  # about 2 MB: far more than a pipe holds while nobody reads it
            logging.getLogger("test.stalled").info(line)
        assert time.monotonic() - started < 10, "log calls waited for the writer"
    finally:

        def drain() -> None:
            with os.fdopen(read_end, "rb") as reader:
                while reader.read(65536):
                    pass
            drained.set()

        threading.Thread(target=drain, daemon=True).start()
        stop()
        stalled.close()
        drained.wait(10)
        root.handlers[:], root.level = saved
