"""Large allocations from the kernel's own mappings, in a process that serves no requests.

glibc serves an allocation of 128 KiB or more from a mapping of its own, given back to the kernel
when freed, until the first such block is freed: it then raises that threshold to the block's size,
and later large blocks come from the heap, recycled from memory that was written before. Every TLS
connection of the event loop (uvloop's and asyncio's alike: `SSLProtocol.max_size`) allocates a
256 KiB read buffer that the kernel fills only as far as an answer needs: from a fresh mapping an
idle connection keeps a page or two of it, from recycled heap all 256 KiB. The control process of
`--workers N` holds a connection to every backend its checks and fetches reach: 5000 healthy
Services took 1.7 GiB that way. A fixed threshold (`M_MMAP_THRESHOLD`, which also stops the
raising) costs a mapping per large allocation; the event loop would read every TLS record into a
fresh 256 KiB bytes object (an mmap, an mremap and an munmap per read), so the process that sets
it reads its backends' answers through `backends._aiohttp.BufferedReads`, into buffers of their
size. The process that proxies requests keeps glibc's default.
"""

from __future__ import annotations

import ctypes
import logging

from aggregator.util.logs import fields

log = logging.getLogger(__name__)

# mallopt(3): M_MMAP_THRESHOLD, and glibc's initial threshold.
M_MMAP_THRESHOLD = -3
THRESHOLD = 128 * 1024


def map_large_allocations() -> bool:
    """Fix glibc's threshold for mapped allocations (True), or leave it where there is no glibc."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    done = bool(mallopt(M_MMAP_THRESHOLD, THRESHOLD))
    log.debug("large allocations mapped", extra=fields(threshold=THRESHOLD, done=done))
    return done
