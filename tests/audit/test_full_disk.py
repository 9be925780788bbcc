"""A full disk under the audit log: requests keep flowing, and every lost event is counted.

`aggregator serve` (`--workers 1` and `2`) audits every request into a file whose writes really
fail with ENOSPC: on a 32 KiB tmpfs mounted for the test (it fills after a few dozen events, so
the log holds the first events whole and then stops), or on `/dev/full` (every write fails from
the first). Requests go on being answered, `apiserver_audit_error_total{plugin="log"}` counts each
event lost, and the gateway's log says so.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.support.pki import PKI
from tests.support.polling import until, until_async
from tests.workers.group import Group, running_group

pytestmark = pytest.mark.long(10)

POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "None", "nonResourceURLs": ["/livez*", "/readyz*", "/healthz*", "/metrics"]},
        {"level": "Metadata"},
    ],
}
LOST = re.compile(r'^apiserver_audit_error_total\{plugin="log"\} (\S+)$', re.M)


@pytest.fixture(params=["tmpfs", "dev-full"])
def full_disk(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path]:
    """Where the audit log goes: a path whose writes fail with ENOSPC (soon, or at once)."""
    if request.param == "dev-full":
        yield Path("/dev/full")
        return
    mount = tmp_path / "tiny"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=32k", "tmpfs", str(mount)], capture_output=True, check=False
    )
    if done.returncode != 0:
        pytest.skip(f"mounting a tmpfs needs root (CAP_SYS_ADMIN); /dev/full covers ENOSPC: {done.stderr!r}")
    try:
        yield mount / "audit.log"
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


async def lost(group: Group) -> float:
    status, body = await group.get("/metrics")
    assert status == 200
    match = LOST.search(body.decode())
    return float(match.group(1)) if match else 0.0


@pytest.mark.parametrize("workers", [1, 2])
async def test_requests_keep_flowing_and_lost_events_are_counted(
    workers: int, full_disk: Path, pki: PKI, apiservices_dir: Path, tmp_path: Path
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(POLICY))
    args = ("--workers", str(workers), "--audit-policy-file", str(policy), "--audit-log-path", str(full_disk))
    async with running_group(pki, apiservices_dir, tmp_path / "serve.log", *args) as group:
        # Fill the disk (a few dozen events on the tmpfs; none fit on /dev/full).
        sent = 0
        while await lost(group) == 0:
            statuses = [(await group.get("/apis"))[0] for _ in range(20)]
            assert statuses == [200] * 20
            sent += 20
            assert sent < 2000, "the audit log never failed to write"
        # Full: every further request is still answered, and its event counted as lost.
        before = await lost(group)
        statuses = [(await group.get("/apis"))[0] for _ in range(50)]
        assert statuses == [200] * 50

        async def counted() -> bool:
            return await lost(group) >= before + 50

        await until_async(counted, 20.0, "the 50 lost events to be counted")
        assert await lost(group) <= sent + 50  # no event counted twice
        await until(lambda: "audit log write failed: events lost" in group.log(), what="the log to say so")
    if full_disk.name == "audit.log":
        lines = full_disk.read_bytes().split(b"\n")
        whole = [json.loads(line) for line in lines[:-1]]  # everything but a last, cut-off line
        assert whole and all(event["requestURI"] == "/apis" for event in whole)
