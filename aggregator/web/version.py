"""`/version` in kube-apiserver's shape (local mode; in kube mode kube-apiserver answers it)."""

from __future__ import annotations

import platform

from aiohttp import web

from aggregator import __version__
from aggregator.web.responses import json_response


def version_info() -> dict[str, str]:
    """The gateway itself, in `version.Info`'s fields."""
    major, minor, *_ = [*__version__.split("."), "0", "0"]
    return {
        "major": major,
        "minor": minor,
        "gitVersion": f"v{__version__}",
        "gitCommit": "",
        "gitTreeState": "",
        "buildDate": "",
        "goVersion": f"python{platform.python_version()}",
        "compiler": platform.python_implementation().lower(),
        "platform": f"{platform.system().lower()}/{platform.machine()}",
    }


async def serve_version(request: web.Request) -> web.StreamResponse:
    return json_response(request, version_info())
