"""How many CPUs this process may actually use: the default `--workers`.

`os.cpu_count()` is the node's count: a pod limited to 2 CPUs on a 64-core node would start 64
workers that the CFS quota then throttles. Go's runtime reads the same two limits for its default
GOMAXPROCS (the affinity mask in `runtime/os_linux.go` `getproccount`; the cgroup quota since Go
1.25, `internal/runtime/cgroup`): the CPU affinity mask, and the CPU quota of this process's cgroup
and every ancestor (v2 `cpu.max`; v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`), rounded up.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_SELF_CGROUP = Path("/proc/self/cgroup")


def affinity_cpus() -> int:
    """CPUs in this process's affinity mask (taskset, cpuset), or the node's count."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _ancestors(root: Path, relative: str) -> list[Path]:
    """`root/relative` and each parent folder up to `root`, innermost first."""
    parts = [p for p in relative.strip("/").split("/") if p and p != ".."]
    return [root.joinpath(*parts[:n]) for n in range(len(parts), -1, -1)]


def _v2_quota(root: Path, relative: str) -> float | None:
    """The smallest `cpu.max` quota/period on the way to the root (`max` is no limit)."""
    found: float | None = None
    for folder in _ancestors(root, relative):
        text = _read(folder / "cpu.max")
        if not text:
            continue
        quota, _, period = text.partition(" ")
        if quota == "max" or not period:
            continue
        try:
            cpus = int(quota) / int(period)
        except (ValueError, ZeroDivisionError):
            continue
        found = cpus if found is None else min(found, cpus)
    return found


def _v1_quota(root: Path, mount: str, relative: str) -> float | None:
    """`cpu.cfs_quota_us / cpu.cfs_period_us` (-1 is no limit), smallest on the way to the root.

    In a container the cgroup namespace shows the container's own cgroup as the mount's root, so
    the path from /proc/self/cgroup may not exist below the mount: its root is tried too.
    """
    found: float | None = None
    base = root / mount
    for folder in _ancestors(base, relative):
        quota, period = _read(folder / "cpu.cfs_quota_us"), _read(folder / "cpu.cfs_period_us")
        if not quota or not period:
            continue
        try:
            q, p = int(quota), int(period)
        except ValueError:
            continue
        if q <= 0 or p <= 0:
            continue
        found = q / p if found is None else min(found, q / p)
    return found


def quota_cpus(root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_SELF_CGROUP) -> float | None:
    """The cgroup CPU quota in CPUs (fractional), or None when no quota applies."""
    text = _read(proc_cgroup)
    if text is None:
        return None
    found: float | None = None
    for line in text.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, relative = rest.partition(":")
        if hierarchy == "0" and controllers == "":
            quota = _v2_quota(root, relative)
        elif "cpu" in controllers.split(","):
            quota = _v1_quota(root, controllers, relative)
            if quota is None:
                quota = _v1_quota(root, "cpu", relative)  # mounted as cpu/ with cpu,cpuacct linked
        else:
            continue
        if quota is not None:
            found = quota if found is None else min(found, quota)
    return found


def usable_cpus(root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_SELF_CGROUP) -> int:
    """min(affinity, ceil(quota)), at least 1: the worker count that uses every CPU the pod has."""
    cpus = affinity_cpus()
    quota = quota_cpus(root, proc_cgroup)
    if quota is not None:
        cpus = min(cpus, math.ceil(quota))
    return max(1, cpus)
