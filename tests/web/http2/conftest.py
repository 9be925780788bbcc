"""The HTTP/2 tests' header collectors: the compiled callback and the Python fallback."""

from __future__ import annotations

import pytest

from aggregator.web.http2 import nghttp2


@pytest.fixture(params=["compiled", "python"])
def header_collector(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs a test twice: with request headers collected by the compiled callback (what an install
    with a C compiler serves with) and by Python (`AGGREGATOR_HTTP2_COMPILED=0`, what an install
    without one serves with), before its gateway starts."""
    compiled = request.param == "compiled"
    monkeypatch.setenv(nghttp2.COMPILED_ENV, "1" if compiled else "0")
    binding, why = nghttp2.load()
    assert binding is not None, why
    assert (binding.compiled is not None) == compiled, why
    return str(request.param)
