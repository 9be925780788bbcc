"""A manifest the gateway does not load, seen where an operator looks: `/readyz?verbose` (a warning,
never unready) and `aggregator_manifest_errors{file}` in `/metrics`, with one process and with the
default worker count (2 on CI: `/readyz` is answered by a worker from the control's state)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from aggregator.sources.problems import REFUSED, SKIPPED, UNREADABLE, ManifestProblem, ManifestReport
from tests.support.backend import APISERVICE, apiservice_manifest, write_manifests
from tests.support.pki import PKI
from tests.support.polling import until_async
from tests.workers.group import Group, running_group


def test_each_problem_is_a_warning_line_and_counts_for_its_file() -> None:
    problems = [
        ManifestProblem(Path("d/a.yaml"), UNREADABLE, "d/a.yaml:3: mapping values are not allowed here", kept=2),
        ManifestProblem(Path("d/b.yaml"), REFUSED, 'APIService.apiregistration.k8s.io "x" is invalid: ...'),
        ManifestProblem(Path("d/b.yaml"), SKIPPED, "apps/v1 Deployment"),
    ]
    registry = CollectorRegistry(auto_describe=False)
    report = ManifestReport(lambda: problems, registry)
    notes = report.notes()
    assert notes[0] == (
        "warn: manifest d/a.yaml:3: mapping values are not allowed here "
        "(file not loaded; the 2 objects it held before still served)"
    )
    assert notes[1] == 'warn: manifest d/b.yaml: APIService.apiregistration.k8s.io "x" is invalid: ... (refused)'
    assert notes[2].startswith("warn: manifest d/b.yaml: apps/v1 Deployment (skipped: the gateway reads only ")
    text = generate_latest(registry).decode()
    assert 'aggregator_manifest_errors{file="d/a.yaml"} 1.0' in text
    assert 'aggregator_manifest_errors{file="d/b.yaml"} 2.0' in text
    problems.clear()
    assert report.notes() == [] and "aggregator_manifest_errors{" not in generate_latest(registry).decode()


async def _verbose(group: Group) -> str:
    status, body = await group.get("/readyz?verbose")
    assert status == 200, body  # a broken manifest never takes the gateway out of its Service
    return body.decode()


async def _metrics(group: Group) -> str:
    status, body = await group.get("/metrics")
    assert status == 200
    return body.decode()


@pytest.mark.parametrize("workers", [[], ["--workers", "1"]], ids=["workers-unset", "workers-1"])
async def test_a_file_broken_while_serving_is_a_readyz_warning_and_a_metric(
    pki: PKI, apiservices_dir: Path, tmp_path: Path, workers: list[str]
) -> None:
    svc = apiservice_manifest(port=443, ca_pem=None)
    del svc["status"]
    write_manifests(apiservices_dir, "demo", svc)
    path = apiservices_dir / "demo.yaml"
    (apiservices_dir / "kind.yaml").write_text(
        path.read_text().replace("kind: APIService", "kind: ApiService").replace("demo.example.com", "other.example.com")
    )
    async with running_group(pki, apiservices_dir, tmp_path / "serve.log", *workers) as group:
        verbose = await _verbose(group)
        assert (
            f'warn: manifest {apiservices_dir}/kind.yaml: no matches for kind "ApiService" in version '
            '"apiregistration.k8s.io/v1": did you mean "APIService"? (refused)\n'
        ) in verbose
        assert verbose.endswith("readyz check passed\n")
        # The file breaks while the gateway runs: its APIService stays, and the warning says so.
        path.write_text(path.read_text() + "  broken: [unclosed\n")
        warning = re.compile(
            rf"^warn: manifest {re.escape(str(path))}:\d+: .* \(file not loaded; the object it held before still "
            r"served\)$",
            re.M,
        )

        async def warned() -> bool:
            return bool(warning.search(await _verbose(group)))

        await until_async(warned, 20.0, "the warning in /readyz?verbose")
        status, body = await group.get("/readyz")
        assert (status, body) == (200, b"ok")
        status, _ = await group.get(f"/apis/apiregistration.k8s.io/v1/apiservices/{APISERVICE}")
        assert status == 200
        text = await _metrics(group)
        assert f'aggregator_manifest_errors{{file="{path}"}} 1.0' in text
        assert f'aggregator_manifest_errors{{file="{apiservices_dir}/kind.yaml"}} 1.0' in text
        # Fixed: the warning and the series go.
        path.write_text(path.read_text().replace("  broken: [unclosed\n", ""))
        (apiservices_dir / "kind.yaml").unlink()

        async def quiet() -> bool:
            return "warn: manifest" not in await _verbose(group)

        await until_async(quiet, 20.0, "the warnings to go")
        assert "aggregator_manifest_errors{" not in await _metrics(group)
