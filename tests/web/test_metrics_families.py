"""Every metric family a gateway exposes, pinned: names, help texts, types, label names, buckets.

The features declare their own metrics (`availability/metrics.py`, `proxy/metrics.py`, ...): this
test scrapes one gateway's `/metrics` and holds the whole exposition's HELP and TYPE lines, and each
metric's label names and bucket layout, to the golden files captured before the declarations moved
out of `web/metrics.py`. Upstream-named series must match upstream byte for byte, and dashboards
and alerts (manifests/) read the others: a rename, a new help text or a new bucket fails here.
After an intended change, rewrite the golden files: `.venv/bin/python -m tests.web.test_metrics_families`.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import aiohttp
from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase

from tests.conftest import StartGateway
from tests.support.gateway import local_options, running_gateway
from tests.support.pki import PKI, make_pki

GOLDEN = Path(__file__).parent / "golden"
FAMILIES = GOLDEN / "metrics-families.txt"
LAYOUT = GOLDEN / "metrics-layout.txt"


def exposition_heads(text: str) -> list[str]:
    """The `# HELP` and `# TYPE` lines of an exposition, sorted: every family whether or not it
    has a sample yet."""
    return sorted(line for line in text.splitlines() if line.startswith(("# HELP ", "# TYPE ")))


def layout(registry: CollectorRegistry) -> list[str]:
    """Name, type, label names and bucket bounds of each standard metric in `registry`: what a
    scrape shows of a labelled metric only once it has a series (prometheus_client keeps them in
    the metric's private fields; the custom collectors' families are pinned by the exposition)."""
    rows = []
    for collector in registry._collector_to_names:
        if isinstance(collector, MetricWrapperBase):
            bounds = getattr(collector, "_upper_bounds", None)
            rows.append(f"{collector._name} {collector._type} {','.join(collector._labelnames)} {bounds}")
    return sorted(rows)


async def scrape(server_url: str, pki: PKI) -> str:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{server_url}/metrics", ssl=pki.client_context()) as response,
    ):
        assert response.status == 200
        return await response.text()


async def test_the_exposition_has_exactly_the_pinned_families_and_help_texts(
    start_gateway: StartGateway, pki: PKI
) -> None:
    server = await start_gateway()
    heads = exposition_heads(await scrape(server.url, pki))
    expected = FAMILIES.read_text().splitlines()
    assert sorted(set(heads) - set(expected)) == [], "families or help texts the golden file lacks"
    assert sorted(set(expected) - set(heads)) == [], "families or help texts gone from /metrics"
    assert heads == expected
    assert len(heads) > 100  # the whole exposition: every feature's families, not a few


async def test_every_metric_keeps_its_labels_and_buckets(start_gateway: StartGateway) -> None:
    server = await start_gateway()
    assert layout(server.gateway.metrics.registry) == LAYOUT.read_text().splitlines()


async def _rewrite() -> None:
    """Capture the golden files from a local-mode gateway with the test PKI."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        pki = make_pki(Path(tmp) / "pki")
        apiservices = Path(tmp) / "apiservices"
        apiservices.mkdir()
        async with running_gateway(local_options(pki, str(apiservices))) as server:
            FAMILIES.write_text("\n".join(exposition_heads(await scrape(server.url, pki))) + "\n")
            LAYOUT.write_text("\n".join(layout(server.gateway.metrics.registry)) + "\n")


if __name__ == "__main__":
    asyncio.run(_rewrite())
    sys.exit(0)
