"""The one compiled part of the package, optional: `aggregator.web.http2._h2blocks`, libnghttp2's
header callback in C (native/h2blocks.c, built with cffi's API mode). pyproject.toml holds
everything else. A build without a C compiler or Python's headers still installs: the gateway then
collects HTTP/2 header blocks in Python (aggregator/web/http2/nghttp2.py logs which at start).
"""

from __future__ import annotations

from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    """build_ext whose failure is a warning, not a failed install."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as err:  # the compiler itself missing fails here, before any extension
            self.warn(f"aggregator: the HTTP/2 header accelerator was not built ({err}); Python collects header blocks")

    def build_extension(self, ext: Any) -> None:
        try:
            super().build_extension(ext)
        except Exception as err:
            self.warn(f"aggregator: {ext.name} was not built ({err}); Python collects header blocks")


setup(
    cffi_modules=["native/h2blocks_build.py:ffibuilder"],
    cmdclass={"build_ext": OptionalBuildExt},
)
