"""Length-prefixed frames between the control process and one worker, over a socketpair.

Each frame is a 4-byte big-endian length and a pickle. Pickle is safe here because both ends are
this program and the socket is one end of a `socketpair()` inherited by exactly one child: it has
no path, nobody else can connect to it, and nothing read from the network is ever unpickled.
It carries the gateway's own objects (APIService, Service, EndpointSlice, rendered documents)
without a second encoding to maintain next to the model.
"""

from __future__ import annotations

import asyncio
import pickle
import socket
import struct

_LENGTH = struct.Struct(">I")


def encode(message: object) -> bytes:
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _LENGTH.pack(len(body)) + body


class Channel:
    """One end of a control <-> worker connection: `send` never blocks, `receive` waits for a frame."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    @classmethod
    async def open(cls, sock: socket.socket) -> Channel:
        reader, writer = await asyncio.open_unix_connection(sock=sock)
        return cls(reader, writer)

    def send(self, message: object) -> None:
        """Queue a frame (the transport buffers it; frames keep their order)."""
        self.send_frame(encode(message))

    def send_frame(self, frame: bytes) -> None:
        """Queue a frame already encoded (`encode`: one message for several channels)."""
        if not self._writer.is_closing():
            self._writer.write(frame)

    async def drain(self) -> None:
        await self._writer.drain()

    async def receive(self) -> object:
        """The next message; EOFError once the other end is gone."""
        try:
            head = await self._reader.readexactly(_LENGTH.size)
            (length,) = _LENGTH.unpack(head)
            body = await self._reader.readexactly(length)
        except (asyncio.IncompleteReadError, ConnectionError) as err:
            raise EOFError("the other end closed the channel") from err
        return pickle.loads(body)

    def close(self) -> None:
        self._writer.close()
