"""The wardle.example.com sample extension API server: the gateway's counterpart of upstream's
sample-apiserver, used by `aggregator demo` and the end-to-end tests.

    server = SampleServer(SampleOptions(secure_port=0, requestheader_client_ca_file=...))
    await server.start(); ...; await server.stop()
"""

from sample_apiserver.options import SampleOptions
from sample_apiserver.server import SampleServer

__all__ = ["SampleOptions", "SampleServer"]
