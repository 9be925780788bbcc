"""OpenAPI for what local mode serves itself: `apiregistration.k8s.io/v1` (APIServices).

In kube mode kube-apiserver publishes this group-version; a local-mode gateway serves it on its
own (`aggregator/apiregistration.py`), so it publishes its documents too, or `kubectl explain
apiservices` has nothing to read. Built once, in kube-apiserver's layout (`builder.py`): the
APIService schemas with upstream's field descriptions (`apiregistration-v1.yaml`), the meta/v1
schemas they reference, and one operation per verb of the resource and its `status` subresource
with upstream's operation ids and query parameters. Responses list the media types
the gateway serves (JSON, YAML, JSON watch streams). The v3 document is `/openapi/v3/apis/
apiregistration.k8s.io/v1`; the v2 form heads the merged `/openapi/v2`.
"""

from __future__ import annotations

from importlib import resources as package_files
from typing import Any

import yaml

from aggregator import __version__
from aggregator.openapi import builder

JSON = dict[str, Any]

GROUP = "apiregistration.k8s.io"
VERSION = "v1"
KEY = f"apis/{GROUP}/{VERSION}"  # the `/openapi/v3` key
TYPES = "io.k8s.kube-aggregator.pkg.apis.apiregistration.v1."
RESOURCE = builder.Resource(GROUP, VERSION, "APIService", "apiservices", TYPES, subresources=("status",))


def build_documents() -> tuple[JSON, JSON]:
    """(the v3 document of apiregistration.k8s.io/v1, a v2 document with its paths and definitions)."""
    meta = builder.load_meta()
    text = package_files.files("aggregator.openapi").joinpath("apiregistration-v1.yaml").read_text()
    types: JSON = yaml.safe_load(text)
    schemas = builder.expand_markers(
        {**meta["schemas"], **types["schemas"]}, meta["fields"], GROUP, (VERSION,)
    )
    paths = [builder.group_version_path(GROUP, VERSION), *builder.resource_paths(RESOURCE)]
    info = {"title": "Kubernetes", "version": f"v{__version__}"}
    spec = builder.Spec(info, paths, schemas, meta["parameters"])
    return spec.v3(), spec.v2()
