"""A real Prometheus for the alert and dashboard tests: Debian's `prometheus` package.

`promtool` checks and unit-tests the alerting rules; `prometheus` scrapes a running gateway over
TLS with a client certificate, and answers the dashboard's queries through its HTTP API exactly as
it answers Grafana's. `.ci/run` installs the package when it is missing; anywhere else the tests
that need it skip and say how to get it.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
import signal
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from tests.support.polling import until_async
from tests.support.ports import free_port

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
INSTALL = "Debian's prometheus package is not installed (apt-get install prometheus; .ci/run installs it)"
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason=f"promtool: {INSTALL}")
needs_prometheus = pytest.mark.skipif(PROMETHEUS is None, reason=f"prometheus: {INSTALL}")

JSON = dict[str, Any]


class QueryError(AssertionError):
    """Prometheus refused a query (a parse or evaluation error)."""


@dataclass
class Scrape:
    """One scrape job over HTTPS with a client certificate."""

    target: str  # host:port
    ca_file: str
    cert_file: str
    key_file: str
    job: str = "aggregator"
    interval: str = "1s"


def config(scrape: Scrape) -> JSON:
    return {
        "global": {"scrape_interval": scrape.interval, "evaluation_interval": scrape.interval},
        "scrape_configs": [
            {
                "job_name": scrape.job,
                "scheme": "https",
                "metrics_path": "/metrics",
                "scrape_interval": scrape.interval,
                "scrape_timeout": scrape.interval,
                "tls_config": {
                    "ca_file": scrape.ca_file,
                    "cert_file": scrape.cert_file,
                    "key_file": scrape.key_file,
                },
                "static_configs": [{"targets": [scrape.target]}],
            }
        ],
    }


class Prometheus:
    """A running `prometheus`, queried through its HTTP API."""

    def __init__(self, url: str, session: aiohttp.ClientSession) -> None:
        self.url = url
        self.session = session

    async def _get(self, path: str, params: dict[str, str] | list[tuple[str, str]]) -> Any:
        async with self.session.get(self.url + path, params=params) as resp:
            body = await resp.json()
        if body.get("status") != "success":
            raise QueryError(f"{body.get('errorType')}: {body.get('error')} ({params})")
        return body["data"]

    async def query(self, expr: str) -> list[JSON]:
        """An instant query at the current time: the result vector (empty: no data)."""
        data = await self._get("/api/v1/query", {"query": expr})
        result = data["result"]
        return result if isinstance(result, list) else [result]

    async def label_values(self, label: str, match: str) -> list[str]:
        """What Grafana's `label_values(<match>, <label>)` offers."""
        data = await self._get(f"/api/v1/label/{label}/values", [("match[]", match)])
        return list(data)

    async def targets_up(self) -> bool:
        data = await self._get("/api/v1/targets", {"state": "active"})
        return bool(data["activeTargets"]) and all(t["health"] == "up" for t in data["activeTargets"])

    async def last_scrape_error(self) -> str:
        data = await self._get("/api/v1/targets", {"state": "active"})
        return "; ".join(t.get("lastError", "") for t in data["activeTargets"])


@contextlib.asynccontextmanager
async def running_prometheus(workdir: Path, scrape: Scrape) -> AsyncIterator[Prometheus]:
    """`prometheus` on a free loopback port, scraping `scrape`; stopped (SIGTERM) on the way out."""
    assert PROMETHEUS is not None, INSTALL
    workdir.mkdir(parents=True, exist_ok=True)
    config_file = workdir / "prometheus.yml"
    config_file.write_text(yaml.safe_dump(config(scrape)))
    port = free_port()
    log = workdir / "prometheus.log"
    with log.open("wb") as log_file:
        process = await asyncio.create_subprocess_exec(
            PROMETHEUS,
            f"--config.file={config_file}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
            stdout=log_file,
            stderr=log_file,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as session:

            async def ready() -> bool:
                assert process.returncode is None, f"prometheus exited:\n{log.read_text()}"
                with contextlib.suppress(aiohttp.ClientError, OSError):
                    async with session.get(url + "/-/ready") as resp:
                        return resp.status == 200
                return False

            await until_async(ready, 30, lambda: f"prometheus to be ready:\n{log.read_text()}", every=0.1)
            yield Prometheus(url, session)
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
            try:
                async with asyncio.timeout(30):
                    await process.wait()
            except TimeoutError:
                process.kill()
                await process.wait()


# --- the rules, out of the PrometheusRule -------------------------------------------------------------


def rule_groups(prometheus_rule: JSON) -> JSON:
    """A Prometheus rules file (what promtool and prometheus read) from a PrometheusRule's spec."""
    return {"groups": prometheus_rule["spec"]["groups"]}


# --- Grafana's side of a query --------------------------------------------------------------------------

_VARIABLE = re.compile(r"\$(?:\{(\w+)\}|(\w+))")
_LABEL_VALUES = re.compile(r"^label_values\((.*),\s*(\w+)\)$", re.S)


def regex_escape(value: str) -> str:
    """Grafana's escaping of a multi-value variable's values inside a PromQL regex matcher."""
    return re.sub(r"([\\^$.|?*+()\[\]{}])", r"\\\\\1", value)


def interpolate(text: str, values: Mapping[str, str | list[str]], rate_interval: str) -> str:
    """Substitute variables as Grafana's Prometheus data source does: a multi-value variable's
    values regex-escaped and joined as `(a|b)`, "All" as its `allValue`, `$__rate_interval` as
    computed for the scrape interval. Raises KeyError for a variable the dashboard does not define."""

    def value_of(match: re.Match[str]) -> str:
        name = match[1] or match[2]
        if name == "__rate_interval":
            return rate_interval
        value = values[name]
        if isinstance(value, list):
            escaped = [regex_escape(v) for v in value]
            return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"
        return value

    return _VARIABLE.sub(value_of, text)


def label_values_query(query: str) -> tuple[str, str] | None:
    """(match, label) of a `label_values(match, label)` variable query."""
    found = _LABEL_VALUES.match(query.strip())
    return (found[1], found[2]) if found else None
