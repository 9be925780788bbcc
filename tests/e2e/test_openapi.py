"""Real kubectl through the gateway: `explain` prints the sample's field docs and `create` validates.

What each kubectl reads (seen with -v=8 and asserted below):
- every version reads `/openapi/v3` (the index) and `/openapi/v3/apis/<g>/<v>?hash=...` for explain;
  `create`/`apply` with the default `--validate=strict` read the index to see that the server
  validates fields itself (`fieldValidation` on the PATCH operation), then send
  `?fieldValidation=Strict`;
- 1.27 and 1.28 also GET `/openapi/v2` with only the gnostic protobuf media type, for explain and
  before every create, and fail without it; 1.29 and later never ask for v2.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.e2e import FLUNDER, WardleStack, kubectl_binaries, kubectl_minor, logged_requests
from tests.support.pki import PKI

# Every versioned binary (1.27 ... 1.33): the v2 protobuf cut-off lies between them.
KUBECTLS = kubectl_binaries(every_version=True)
PROTOBUF = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf"

pytestmark = [
    pytest.mark.long(15),
    pytest.mark.e2e,
    pytest.mark.skipif(not KUBECTLS, reason="kubectl is not installed"),
]


@pytest.mark.parametrize("binary", KUBECTLS, ids=lambda b: Path(b).name)
async def test_explain_and_create_with_default_validation(binary: str, pki: PKI, tmp_path: Path) -> None:
    minor = await kubectl_minor(binary)
    async with WardleStack(pki, tmp_path) as stack:
        kubectl = stack.kubectl(binary)

        _, out, err = await kubectl("explain", "flunders", "-v=8")
        assert "KIND:       Flunder" in out and "VERSION:    v1beta1" in out
        assert "Flunder is an example type with a spec and a status." in out
        assert "spec is the desired state of the Flunder." in out
        requests = logged_requests(err)
        v3 = [r for r in requests if r.path == "/openapi/v3/apis/wardle.example.com/v1beta1"]
        assert v3 and v3[0].status == 200 and "hash=" in v3[0].url
        v2 = [r for r in requests if r.path == "/openapi/v2"]
        if minor <= 28:
            assert v2 and v2[0].headers.get("Accept") == PROTOBUF and v2[0].status == 200
        else:
            assert v2 == []

        _, out, _ = await kubectl("explain", "flunders.spec")
        assert "fischerReference" in out
        assert "A name of a fischer, mutually exclusive to the FlunderReference." in out
        _, out, _ = await kubectl(
            "explain", "fischers.disallowedFlunders", "--api-version=wardle.example.com/v1alpha1"
        )
        assert "disallowedFlunders" in out

        manifest = tmp_path / "flunder.yaml"
        manifest.write_text(FLUNDER)
        _, out, err = await kubectl("create", "-f", str(manifest), "-v=8")
        assert out.strip() == "flunder.wardle.example.com/my-flunder created"
        posts = [r for r in logged_requests(err) if r.method == "POST"]
        assert len(posts) == 1 and "fieldValidation=Strict" in posts[0].url  # the server validates
        if minor <= 28:
            assert any(r.path == "/openapi/v2" and r.status in (200, 304) for r in logged_requests(err))

        bad = tmp_path / "bad.yaml"
        bad.write_text(
            FLUNDER.replace("name: my-flunder", "name: bad").replace(
                "fischerReference: fred", "fischerReference: fred\n  colour: red"
            )
        )
        code, _, err = await kubectl("create", "-f", str(bad), check=False)
        assert code != 0 and 'unknown field "spec.colour"' in err
        _, out, _ = await kubectl("get", "flunders", "-o", "name")
        assert out.split() == ["flunder.wardle.example.com/my-flunder"]


OLD_KUBECTLS = [b for b in KUBECTLS if Path(b).name in ("kubectl.1.27", "kubectl.1.28")]


@pytest.mark.skipif(not OLD_KUBECTLS, reason="no kubectl 1.27/1.28 binary")
@pytest.mark.parametrize("binary", OLD_KUBECTLS, ids=lambda b: Path(b).name)
async def test_kubectl_1_28_and_older_fail_without_v2_as_protobuf(
    binary: str, pki: PKI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Why the gateway renders gnostic protobuf: with v2 as JSON only, old kubectl cannot explain or create."""
    from aggregator.openapi import routes

    monkeypatch.setattr(routes, "_V2_TYPES", tuple(t for t in routes._V2_TYPES if t[2] == "json"))
    async with WardleStack(pki, tmp_path) as stack:
        kubectl = stack.kubectl(binary)
        code, _, err = await kubectl("explain", "flunders", check=False)
        assert code != 0 and "the server could not find the requested resource" in err
        manifest = tmp_path / "flunder.yaml"
        manifest.write_text(FLUNDER)
        code, _, err = await kubectl("create", "-f", str(manifest), check=False)
        assert code != 0 and "the server could not find the requested resource" in err
        code, _, _ = await kubectl("create", "-f", str(manifest), "--validate=false", check=False)
        assert code == 0  # only validation and explain read v2


@pytest.mark.parametrize("binary", kubectl_binaries(), ids=lambda b: Path(b).name)
async def test_a_backend_without_openapi_v3_is_explained_from_its_v2(
    binary: str, pki: PKI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An extension server that predates OpenAPI v3: its v2 document, converted, is what explain reads."""
    from aiohttp import web
    from sample_apiserver.server import SampleAPI

    serve = SampleAPI._non_resource

    def without_v3(self: SampleAPI, request: web.Request) -> web.StreamResponse:
        if request.path.startswith("/openapi/v3"):
            return web.Response(status=404, text="404 page not found")
        return serve(self, request)

    monkeypatch.setattr(SampleAPI, "_non_resource", without_v3)
    async with WardleStack(pki, tmp_path) as stack:
        kubectl = stack.kubectl(binary)
        _, out, _ = await kubectl("explain", "flunders.spec")
        assert "A name of a fischer, mutually exclusive to the FlunderReference." in out
        bad = tmp_path / "bad.yaml"
        bad.write_text(FLUNDER.replace("fischerReference: fred", "fischerReference: fred\n  colour: red"))
        code, _, err = await kubectl("create", "-f", str(bad), "-v=6", check=False)
        assert code != 0 and 'unknown field "spec.colour"' in err
        assert "fieldValidation=Strict" in err  # the converted PATCH still lists fieldValidation


def flat(text: str) -> str:
    """kubectl's output with its line wrapping and indentation undone."""
    return " ".join(text.split())


@pytest.mark.parametrize("binary", kubectl_binaries(), ids=lambda b: Path(b).name)
async def test_explain_apiservices_through_a_local_gateway(binary: str, pki: PKI, tmp_path: Path) -> None:
    """Local mode serves apiregistration.k8s.io/v1 itself, and publishes its OpenAPI for explain."""
    async with WardleStack(pki, tmp_path) as stack:
        kubectl = stack.kubectl(binary)

        _, raw, err = await kubectl("explain", "apiservices", "-v=8")
        out = flat(raw)
        assert "KIND:       APIService" in raw and "VERSION:    v1" in raw
        assert (
            'APIService represents a server for a particular GroupVersion. Name must be "version.group".'
            in out
        )
        assert "Spec contains information for locating and communicating with a server" in out
        v3 = [r for r in logged_requests(err) if r.path == "/openapi/v3/apis/apiregistration.k8s.io/v1"]
        assert v3 and v3[0].status == 200 and "hash=" in v3[0].url

        raw = (await kubectl("explain", "apiservices.spec"))[1]
        out = flat(raw)
        assert "groupPriorityMinimum\t<integer> -required-" in raw
        assert "APIServiceSpec contains information for locating and communicating with a server." in out
        for field in ("caBundle", "group", "groupPriorityMinimum", "insecureSkipTLSVerify", "service"):
            assert field in out, field
        assert "GroupPriorityMinimum is the priority this group should have at least." in out
        assert "InsecureSkipTLSVerify disables TLS certificate verification" in out

        out = flat((await kubectl("explain", "apiservices.spec.service"))[1])
        assert "ServiceReference holds a reference to Service.legacy.k8s.io" in out
        assert "If specified, the port on the service that hosting webhook." in out

        out = flat((await kubectl("explain", "apiservices.status.conditions"))[1])
        assert "Status is the status of the condition. Can be True, False, Unknown." in out
        assert "Unique, one-word, CamelCase reason for the condition's last transition." in out

        # The backend's group-versions are still explained alongside (one merged v2 for old kubectl).
        out = flat((await kubectl("explain", "flunders.spec"))[1])
        assert "A name of a fischer, mutually exclusive to the FlunderReference." in out
