"""A TLS test server on blocking sockets in a thread, for what asyncio's TLS servers cannot do.

asyncio closes a refused TLS connection without writing the alert OpenSSL produced; blocking
sockets let a test server decide exactly what reaches the wire. Subclasses implement `handle`.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading


class ThreadedTLSServer:
    def __init__(self, context: ssl.SSLContext, *, name: str, timeout: float = 1.0) -> None:
        self.context = context
        self._timeout = timeout
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.05)  # so the thread notices `close()` promptly
        self.port = int(self._listener.getsockname()[1])
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def handle(self, conn: socket.socket) -> None:
        raise NotImplementedError

    def _serve(self) -> None:
        while not self._stopped.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn, contextlib.suppress(OSError):
                conn.settimeout(self._timeout)
                self.handle(conn)

    def close(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=5)
        self._listener.close()
