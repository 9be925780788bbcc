"""Run a command that dies with the process that started it, even when that one is killed with -9.

    python -m aggregator.util.parentdeath PARENT_PID -- COMMAND [ARG...]

Linux's `prctl(PR_SET_PDEATHSIG, SIGTERM)` (called through ctypes: the standard library has no
binding) asks the kernel to send SIGTERM to this process when its parent dies; the setting survives
`execve` (not into set-user-ID programs, which these are not), so it is set here, in a fresh
single-threaded interpreter, and then the command replaces this process under the same pid. That
is why it is a separate step and not a `preexec_fn`: a function run between `fork` and `exec` in a
parent that has threads (the demo has an event loop, a stdin reader and resolver threads) can
deadlock on a lock another thread held at the fork.

A parent that died before the setting took effect would never send the signal, so PARENT_PID is
checked after it: if the parent is already gone, the command is not started.

The signal is SIGTERM, not SIGKILL, so the gateway shuts down in order: it stops its worker
processes itself (and a worker whose control process is gone stops on its own, when the socket it
reads from closes).

On a kernel without prctl (not Linux) the command simply runs: the caller still stops it on an
orderly exit, only an abrupt one leaves it running.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys

PR_SET_PDEATHSIG = 1
EXIT_USAGE = 2


def die_with_parent(sig: int = signal.SIGTERM) -> bool:
    """Have the kernel send `sig` to this process when its parent dies; False where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        return bool(libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def command(parent_pid: int, argv: list[str]) -> list[str]:
    """`argv`, run through this module so that it dies with `parent_pid`."""
    return [sys.executable, "-m", __name__, str(parent_pid), "--", *argv]


def main(args: list[str]) -> int:
    if len(args) < 3 or args[1] != "--" or not args[0].isdigit():
        sys.stderr.write(f"usage: python -m {__name__} PARENT_PID -- COMMAND [ARG...]\n")
        return EXIT_USAGE
    parent, argv = int(args[0]), args[2:]
    die_with_parent(signal.SIGTERM)
    if os.getppid() != parent:
        return 0  # the parent died before the signal was armed: nobody wants this command any more
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
