"""No other process can connect to a worker's channel (`workers/channel.py`).

The channel carries pickles, so whoever could write to it could run code in the worker. It is one
end of a `socketpair()`: no path in the file system, no abstract name, held by the worker alone
(the control holds the other end; no sibling, and nothing the gateway starts, inherits either).
The test looks at a running `--workers 2` group as another local process would: every Unix socket
the group holds is unbound (nothing to `connect()` to), the channel is held by exactly one
process, and connecting or opening through `/proc/<pid>/fd/<n>` fails. (A process with ptrace
rights over the worker, root or its own user without Yama restrictions, can take any of its file
descriptors: that is the operating system's boundary, not the gateway's.)
"""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path

import pytest

from tests.support.pki import PKI
from tests.workers.group import Group, running_group

pytestmark = pytest.mark.skipif(not Path("/proc/net/unix").exists(), reason="needs Linux /proc")


def unix_sockets() -> dict[int, str]:
    """Every Unix socket of the host: inode -> bound path ("" unbound, "@..." abstract)."""
    found: dict[int, str] = {}
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        parts = line.split()
        found[int(parts[6])] = parts[7] if len(parts) > 7 else ""
    return found


def socket_fds(pid: int) -> dict[int, int]:
    """fd -> socket inode, for the sockets `pid` holds."""
    fds: dict[int, int] = {}
    for entry in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(entry)
        except OSError:
            continue
        if target.startswith("socket:["):
            fds[int(entry.name)] = int(target[len("socket:[") : -1])
    return fds


def holders(inode: int) -> set[int]:
    """Every process holding this socket."""
    pids = set()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if inode in socket_fds(int(proc.name)).values():
                    pids.add(int(proc.name))
            except OSError:
                continue
    return pids


def channel_fd(pid: int) -> int:
    """The worker's channel: the descriptor named on its command line (`-m aggregator.runners.worker FD`)."""
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    assert b"aggregator.runners.worker" in argv, argv
    return int(argv[argv.index(b"aggregator.runners.worker") + 1])


async def worker_pids(group: Group) -> set[int]:
    pids: set[int] = set()
    while len(pids) < 2:
        pids.add(await group.worker_pid())
        assert len(group.seen) < 200
    return pids


async def test_a_workers_channel_has_no_address_and_one_holder(
    pki: PKI, apiservices_dir: Path, tmp_path: Path
) -> None:
    async with running_group(pki, apiservices_dir, tmp_path / "serve.log", "--workers", "2") as group:
        workers = await worker_pids(group)
        control = group.process.pid
        host = unix_sockets()

        # Nothing any process of the group holds is a Unix socket with an address.
        for pid in (control, *workers):
            bound = {inode: host[inode] for inode in socket_fds(pid).values() if host.get(inode)}
            assert bound == {}, f"process {pid} holds bound Unix sockets {bound}"

        for pid in workers:
            fd = channel_fd(pid)
            inode = socket_fds(pid)[fd]
            assert inode in host and host[inode] == ""  # a Unix socket, unbound
            assert holders(inode) == {pid}  # not the sibling, not the control, nobody else

            # Another process trying the only handle it can see: the /proc link.
            link = f"/proc/{pid}/fd/{fd}"
            with pytest.raises(OSError) as opened:
                os.open(link, os.O_RDWR)
            assert opened.value.errno == errno.ENXIO
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            with pytest.raises(OSError) as connected:
                probe.connect(link)
            probe.close()
            assert connected.value.errno == errno.ECONNREFUSED

        # The control's Unix sockets (its channel ends among them) are held by the control alone.
        for inode in socket_fds(control).values():
            if inode in host:
                assert holders(inode) == {control}
