"""The default worker count: the CPU affinity mask and the cgroup CPU quota (v2 and v1)."""

from __future__ import annotations

from pathlib import Path

import pytest

from aggregator.workers import cpus


def _cgroup(tmp_path: Path, lines: str) -> Path:
    path = tmp_path / "proc-self-cgroup"
    path.write_text(lines)
    return path


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_v2_quota_of_two_cpus(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    _write(root / "kubepods" / "pod1" / "cpu.max", "200000 100000\n")
    proc = _cgroup(tmp_path, "0::/kubepods/pod1\n")
    assert cpus.quota_cpus(root, proc) == 2.0


def test_v2_fractional_quota_rounds_up_and_an_ancestor_can_be_tighter(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    _write(root / "kubepods" / "cpu.max", "150000 100000\n")
    _write(root / "kubepods" / "pod1" / "cpu.max", "max 100000\n")
    proc = _cgroup(tmp_path, "0::/kubepods/pod1\n")
    assert cpus.quota_cpus(root, proc) == 1.5
    assert cpus.usable_cpus(root, proc) == min(2, cpus.affinity_cpus())


def test_v2_without_a_limit(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    _write(root / "cpu.max", "max 100000\n")
    assert cpus.quota_cpus(root, _cgroup(tmp_path, "0::/\n")) is None


def test_v1_cfs_quota(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    _write(root / "cpu,cpuacct" / "cpu.cfs_quota_us", "300000\n")
    _write(root / "cpu,cpuacct" / "cpu.cfs_period_us", "100000\n")
    # in a container the cgroup namespace shows the mount's root as the process's own cgroup
    proc = _cgroup(tmp_path, "4:memory:/x\n3:cpu,cpuacct:/kubepods/pod1/abc\n")
    assert cpus.quota_cpus(root, proc) == 3.0


def test_v1_unlimited_quota(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    _write(root / "cpu" / "cpu.cfs_quota_us", "-1\n")
    _write(root / "cpu" / "cpu.cfs_period_us", "100000\n")
    assert cpus.quota_cpus(root, _cgroup(tmp_path, "2:cpu:/\n")) is None


def test_no_cgroup_file_means_no_quota(tmp_path: Path) -> None:
    assert cpus.quota_cpus(tmp_path, tmp_path / "absent") is None


def test_a_quota_below_the_affinity_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpus, "affinity_cpus", lambda: 64)
    root = tmp_path / "cg"
    _write(root / "cpu.max", "200000 100000\n")
    assert cpus.usable_cpus(root, _cgroup(tmp_path, "0::/\n")) == 2
    _write(root / "cpu.max", "max 100000\n")
    assert cpus.usable_cpus(root, _cgroup(tmp_path, "0::/\n")) == 64
    _write(root / "cpu.max", "10000 100000\n")  # a tenth of a CPU still gets one worker
    assert cpus.usable_cpus(root, _cgroup(tmp_path, "0::/\n")) == 1


def test_affinity_counts_the_mask() -> None:
    import os

    assert cpus.affinity_cpus() == len(os.sched_getaffinity(0))
