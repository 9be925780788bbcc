"""Backend routes that hold their requests open until a test lets them go, and count what happens
to them (arrivals, cancellations): the lockstep states HTTP/2 tests wait on."""

from __future__ import annotations

import asyncio

from aiohttp import web


class Held:
    """A backend route whose requests wait until released; counts them and sees them cancelled."""

    def __init__(self) -> None:
        self.arrived = 0
        self.in_flight = 0
        self.cancelled = 0
        self.release = asyncio.Event()

    async def __call__(self, request: web.Request) -> web.StreamResponse:
        self.arrived += 1
        self.in_flight += 1
        try:
            await self.release.wait()
            return web.json_response({"kind": "Status", "status": "Success"})
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.in_flight -= 1


class Watch:
    """A backend watch: sends its head and one event, then holds the stream open; records its end."""

    def __init__(self) -> None:
        self.open = 0
        self.cancelled = 0

    async def __call__(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        await response.write(b'{"type":"ADDED","object":{}}\n')
        self.open += 1
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.open -= 1
        return response
