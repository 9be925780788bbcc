"""Request attributes against upstream's own table (apiserver `requestinfo_test.go`), plus properties.

The tables below are `TestGetAPIRequestInfo`, `TestGetNonAPIRequestInfo` and `TestSelectorParsing`
ported case for case; hypothesis then checks that what upstream's parser ignores (slashes at the
ends, unrelated query parameters, HEAD vs GET) changes nothing, and that the parse of any
well-formed resource path gives back the parts it was built from.
"""

from __future__ import annotations

from urllib.parse import quote

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from aggregator.web.requestinfo import RequestInfo, RequestInfoError, decoded_path, new_request_info
from aggregator.wire.gourl import parse_query, path_unescape, query_unescape


def info_for(method: str, url: str) -> RequestInfo:
    path, _, query = url.partition("?")
    return new_request_info(method, decoded_path(path), parse_query(query))


# (method, url, verb, prefix, group, version, namespace, resource, subresource, name, parts)
API_CASES = [
    # resource paths
    ("GET", "/api/v1/namespaces", "list", "api", "", "v1", "", "namespaces", "", "", ["namespaces"]),
    ("GET", "/api/v1/namespaces/other", "get", "api", "", "v1", "other", "namespaces", "", "other", ["namespaces", "other"]),
    ("GET", "/api/v1/namespaces/other/pods", "list", "api", "", "v1", "other", "pods", "", "", ["pods"]),
    ("GET", "/api/v1/namespaces/other/pods/foo", "get", "api", "", "v1", "other", "pods", "", "foo", ["pods", "foo"]),
    ("HEAD", "/api/v1/namespaces/other/pods/foo", "get", "api", "", "v1", "other", "pods", "", "foo", ["pods", "foo"]),
    ("GET", "/api/v1/pods", "list", "api", "", "v1", "", "pods", "", "", ["pods"]),
    ("HEAD", "/api/v1/pods", "list", "api", "", "v1", "", "pods", "", "", ["pods"]),
    ("GET", "/api/v1/namespaces/other/pods/foo", "get", "api", "", "v1", "other", "pods", "", "foo", ["pods", "foo"]),
    ("GET", "/api/v1/namespaces/other/pods", "list", "api", "", "v1", "other", "pods", "", "", ["pods"]),
    # special verbs
    ("GET", "/api/v1/proxy/namespaces/other/pods/foo", "proxy", "api", "", "v1", "other", "pods", "", "foo", ["pods", "foo"]),
    (
        "GET",
        "/api/v1/proxy/namespaces/other/pods/foo/subpath/not/a/subresource",
        "proxy", "api", "", "v1", "other", "pods", "", "foo",
        ["pods", "foo", "subpath", "not", "a", "subresource"],
    ),
    ("GET", "/api/v1/watch/pods", "watch", "api", "", "v1", "", "pods", "", "", ["pods"]),
    ("GET", "/api/v1/pods?watch=true", "watch", "api", "", "v1", "", "pods", "", "", ["pods"]),
    ("GET", "/api/v1/pods?watch=false", "list", "api", "", "v1", "", "pods", "", "", ["pods"]),
    ("GET", "/api/v1/watch/namespaces/other/pods", "watch", "api", "", "v1", "other", "pods", "", "", ["pods"]),
    ("GET", "/api/v1/namespaces/other/pods?watch=1", "watch", "api", "", "v1", "other", "pods", "", "", ["pods"]),
    ("GET", "/api/v1/namespaces/other/pods?watch=0", "list", "api", "", "v1", "other", "pods", "", "", ["pods"]),
    # subresource identification
    ("GET", "/api/v1/namespaces/other/pods/foo/status", "get", "api", "", "v1", "other", "pods", "status", "foo", ["pods", "foo", "status"]),
    (
        "GET", "/api/v1/namespaces/other/pods/foo/proxy/subpath",
        "get", "api", "", "v1", "other", "pods", "proxy", "foo", ["pods", "foo", "proxy", "subpath"],
    ),
    ("PUT", "/api/v1/namespaces/other/finalize", "update", "api", "", "v1", "other", "namespaces", "finalize", "other", ["namespaces", "other", "finalize"]),
    ("PUT", "/api/v1/namespaces/other/status", "update", "api", "", "v1", "other", "namespaces", "status", "other", ["namespaces", "other", "status"]),
    # verb identification
    ("PATCH", "/api/v1/namespaces/other/pods/foo", "patch", "api", "", "v1", "other", "pods", "", "foo", ["pods", "foo"]),
    ("DELETE", "/api/v1/namespaces/other/pods/foo", "delete", "api", "", "v1", "other", "pods", "", "foo", ["pods", "foo"]),
    ("POST", "/api/v1/namespaces/other/pods", "create", "api", "", "v1", "other", "pods", "", "", ["pods"]),
    # deletecollection verb identification
    ("DELETE", "/api/v1/nodes", "deletecollection", "api", "", "v1", "", "nodes", "", "", ["nodes"]),
    ("DELETE", "/api/v1/namespaces", "deletecollection", "api", "", "v1", "", "namespaces", "", "", ["namespaces"]),
    ("DELETE", "/api/v1/namespaces/other/pods", "deletecollection", "api", "", "v1", "other", "pods", "", "", ["pods"]),
    ("DELETE", "/apis/extensions/v1/namespaces/other/pods", "deletecollection", "apis", "extensions", "v1", "other", "pods", "", "", ["pods"]),
    # api group identification
    ("POST", "/apis/extensions/v1/namespaces/other/pods", "create", "apis", "extensions", "v1", "other", "pods", "", "", ["pods"]),
    # api version identification
    ("POST", "/apis/extensions/v1beta3/namespaces/other/pods", "create", "apis", "extensions", "v1beta3", "other", "pods", "", "", ["pods"]),
]  # fmt: skip


@pytest.mark.parametrize(
    (
        "method",
        "url",
        "verb",
        "prefix",
        "group",
        "version",
        "namespace",
        "resource",
        "subresource",
        "name",
        "parts",
    ),
    API_CASES,
)
def test_upstream_api_request_info(
    method: str,
    url: str,
    verb: str,
    prefix: str,
    group: str,
    version: str,
    namespace: str,
    resource: str,
    subresource: str,
    name: str,
    parts: list[str],
) -> None:
    # (upstream's table says prefix "api" for /apis/... rows but never checks it; "apis" is right)
    info = info_for(method, url)
    assert info.is_resource_request
    assert (info.verb, info.api_prefix, info.api_group, info.api_version) == (verb, prefix, group, version)
    assert (info.namespace, info.resource, info.subresource, info.name) == (
        namespace,
        resource,
        subresource,
        name,
    )
    assert list(info.parts) == parts


@pytest.mark.parametrize(
    "url",
    [
        "/",  # no resource path
        "/api/version/",  # just apiversion
        "/apis/group/version/",  # just prefix, group, version
        "/badprefix/version/resource",  # bad prefix
        "/apis/version/resource",  # missing api group
    ],
)
def test_upstream_error_cases_are_non_resource(url: str) -> None:
    info = info_for("GET", url)
    assert not info.is_resource_request
    assert (info.verb, info.path) == ("get", url)


NON_API_CASES = {
    "simple groupless": ("/api/version/resource", True),
    "simple group": ("/apis/group/version/resource/name/subresource", True),
    "more steps": ("/api/version/resource/name/subresource", True),
    "group list": ("/apis/batch/v1/job", True),
    "group get": ("/apis/batch/v1/job/foo", True),
    "group subresource": ("/apis/batch/v1/job/foo/scale", True),
    "bad root": ("/not-api/version/resource", False),
    "group without enough steps": ("/apis/extensions/v1beta1", False),
    "group without enough steps 2": ("/apis/extensions/v1beta1/", False),
    "not enough steps": ("/api/version", False),
    "one step": ("/api", False),
    "zero step": ("/", False),
    "empty": ("", False),
}


@pytest.mark.parametrize(("url", "expected"), NON_API_CASES.values(), ids=NON_API_CASES.keys())
def test_upstream_non_api_request_info(url: str, expected: bool) -> None:
    assert info_for("GET", url).is_resource_request is expected


# (name, method, url, expected name, verb, fieldSelector, labelSelector)
SELECTOR_CASES = [
    ("no selector", "GET", "/apis/group/version/resource", "", "list", "", ""),
    ("metadata.name selector", "GET", "/apis/group/version/resource?fieldSelector=metadata.name=name1", "name1", "list", "metadata.name=name1", ""),
    ("metadata.name selector with watch", "GET", "/apis/group/version/resource?watch=true&fieldSelector=metadata.name=name1", "name1", "watch", "metadata.name=name1", ""),
    ("random selector", "GET", "/apis/group/version/resource?fieldSelector=foo=bar&labelSelector=baz=qux", "", "list", "foo=bar", "baz=qux"),
    ("invalid selector with metadata.name", "GET", "/apis/group/version/resource?fieldSelector=metadata.name=name1,foo", "", "list", "metadata.name=name1,foo", ""),
    ("invalid selector with metadata.name with watch", "GET", "/apis/group/version/resource?fieldSelector=metadata.name=name1,foo&watch=true", "", "watch", "metadata.name=name1,foo", ""),
    ("invalid selector with metadata.name with watch false", "GET", "/apis/group/version/resource?fieldSelector=metadata.name=name1,foo&watch=false", "", "list", "metadata.name=name1,foo", ""),
    ("selector on deletecollection is honored", "DELETE", "/apis/group/version/resource?fieldSelector=foo=bar&labelSelector=baz=qux", "", "deletecollection", "foo=bar", "baz=qux"),
    (
        "selector on repeated param matches parsed param",
        "GET",
        "/apis/group/version/resource?fieldSelector=metadata.name=foo&fieldSelector=metadata.name=bar&labelSelector=foo=bar&labelSelector=foo=baz",
        "foo", "list", "metadata.name=foo", "foo=bar",
    ),
    ("selector on other verb is ignored", "GET", "/apis/group/version/resource/name?fieldSelector=foo=bar&labelSelector=foo=bar", "name", "get", "", ""),
    ("selector on deprecated root type watch is not parsed", "GET", "/apis/group/version/watch/resource?fieldSelector=metadata.name=foo&labelSelector=foo=bar", "", "watch", "", ""),
    ("selector on deprecated root item watch is not parsed", "GET", "/apis/group/version/watch/resource/name?fieldSelector=metadata.name=foo&labelSelector=foo=bar", "name", "watch", "", ""),
]  # fmt: skip


@pytest.mark.parametrize(
    ("method", "url", "name", "verb", "field_selector", "label_selector"),
    [case[1:] for case in SELECTOR_CASES],
    ids=[case[0] for case in SELECTOR_CASES],
)
def test_upstream_selector_parsing(
    method: str, url: str, name: str, verb: str, field_selector: str, label_selector: str
) -> None:
    info = info_for(method, url)
    assert (info.name, info.verb) == (name, verb)
    assert (info.field_selector, info.label_selector) == (field_selector, label_selector)


@pytest.mark.parametrize(
    ("query", "name", "verb"),
    [
        # a list option that fails to decode resets them all: the name is lost, `watch` survives
        ("watch=true&fieldSelector=metadata.name=a&limit=ten", "", "watch"),
        ("fieldSelector=metadata.name=a&timeoutSeconds=1.5", "", "list"),
        ("fieldSelector=metadata.name=a&labelSelector=!!", "", "list"),
        ("fieldSelector=metadata.name=a&labelSelector=app%3Dweb&limit=-5", "a", "list"),
        # names a URL path could not carry are not taken from the selector
        ("fieldSelector=metadata.name=a%2Fb", "", "list"),
        ("fieldSelector=metadata.name=..", "", "list"),
        ("fieldSelector=metadata.name%3D%3Db", "b", "list"),
        ("fieldSelector=metadata.name!=b", "", "list"),
        # Go's bool conversion: everything but 0/false (folded) is true, even an empty value
        ("watch=", "", "watch"),
        ("watch=FALSE", "", "list"),
        ("watch=fal%C5%BFe", "", "list"),  # U+017F folds to 's' in Go's EqualFold
        ("watch=no", "", "watch"),
        # Go drops query pairs with a semicolon or a bad escape
        ("watch=1;x=2", "", "list"),
        ("watch=%zz", "", "list"),
    ],
)
def test_list_options_decoding(query: str, name: str, verb: str) -> None:
    info = info_for("GET", f"/apis/g/v1/namespaces/ns/things?{query}")
    assert (info.name, info.verb) == (name, verb)


def test_special_verb_without_resource_is_an_error() -> None:
    with pytest.raises(
        RequestInfoError, match="unable to determine kind and namespace from url, /api/v1/watch"
    ):
        info_for("GET", "/api/v1/watch")


def test_path_is_decoded_as_go_does() -> None:
    info = info_for("GET", "/api/v1/namespaces/a%2Fb/pods")
    assert (info.namespace, info.resource, info.name) == ("a", "b", "pods")
    assert info.path == "/api/v1/namespaces/a/b/pods"
    assert decoded_path("/a+b%20c") == "/a+b c"
    assert decoded_path("/bad%zz") == "/bad%zz"
    assert query_unescape("a+b%2B") == "a b+"
    assert path_unescape("a+b") == "a+b"


def test_non_resource_verb_is_the_lowercase_method() -> None:
    for method in ("GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"):
        info = info_for(method, "/healthz/etcd")
        assert (info.is_resource_request, info.verb, info.path) == (False, method.lower(), "/healthz/etcd")


def test_unknown_method_on_a_resource_has_no_verb() -> None:
    assert info_for("OPTIONS", "/api/v1/pods/x").verb == ""


# --- properties --------------------------------------------------------------------------------------

SEGMENT = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-.", min_size=1, max_size=12).filter(
    lambda s: s not in ("watch", "proxy", "namespaces", "status", "finalize", ".", "..")
)
IGNORED_KEYS = st.sampled_from(
    ["pretty", "resourceVersion", "dryRun", "fieldManager", "propagationPolicy", "x"]
)
METHODS = st.sampled_from(["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"])


@given(
    case=st.sampled_from(API_CASES),
    extra=st.lists(st.tuples(IGNORED_KEYS, st.text(alphabet="abc123=,", max_size=6)), max_size=3),
    leading=st.integers(0, 2),
    trailing=st.integers(0, 2),
)
def test_upstream_cases_survive_ignored_variations(
    case: tuple[str, ...], extra: list[tuple[str, str]], leading: int, trailing: int
) -> None:
    method, url = case[0], case[1]
    path, _, query = url.partition("?")
    expected = info_for(method, url)
    extra_query = "&".join(f"{k}={quote(v, safe='')}" for k, v in extra)
    varied_query = "&".join(q for q in (query, extra_query) if q)
    varied_path = "/" * leading + path + "/" * trailing
    got = info_for(method, f"{varied_path}?{varied_query}" if varied_query else varied_path)
    if method == "GET":
        assert info_for("HEAD", url).verb == expected.verb
    assert got == expected._replace(path=decoded_path(varied_path))


@given(
    method=METHODS,
    grouped=st.booleans(),
    group=SEGMENT,
    version=SEGMENT,
    namespace=st.one_of(st.none(), SEGMENT),
    resource=SEGMENT,
    name=st.one_of(st.none(), SEGMENT),
    subresource=st.one_of(st.none(), SEGMENT),
)
@example("GET", True, "g", "v1", "ns", "pods", None, None)
def test_resource_paths_parse_back_into_their_parts(
    method: str,
    grouped: bool,
    group: str,
    version: str,
    namespace: str | None,
    resource: str,
    name: str | None,
    subresource: str | None,
) -> None:
    path = f"/apis/{group}/{version}" if grouped else f"/api/{version}"
    if namespace is not None:
        path += f"/namespaces/{namespace}"
    path += f"/{resource}"
    if name is not None:
        path += f"/{name}"
        if subresource is not None:
            path += f"/{subresource}"
    info = info_for(method, path)
    assert info.is_resource_request
    assert info.api_group == (group if grouped else "")
    assert (info.api_version, info.namespace, info.resource) == (version, namespace or "", resource)
    assert info.name == (name or "")
    assert info.subresource == (subresource if name is not None and subresource is not None else "")
    collection = name is None
    expected_verb = {
        "GET": "list" if collection else "get",
        "HEAD": "list" if collection else "get",
        "POST": "create",
        "PUT": "update",
        "PATCH": "patch",
        "DELETE": "deletecollection" if collection else "delete",
    }[method]
    assert info.verb == expected_verb


@given(value=st.text(max_size=8))
def test_watch_is_true_unless_zero_or_false(value: str) -> None:
    info = info_for("GET", f"/api/v1/pods?watch={quote(value, safe='')}")
    falsy = value == "0" or value.replace("\u017f", "s").lower() == "false"
    assert info.verb == ("list" if falsy else "watch")


@given(name=SEGMENT, watch=st.booleans())
def test_single_object_list_and_watch_name_the_object(name: str, watch: bool) -> None:
    query = f"fieldSelector=metadata.name%3D{quote(name, safe='')}" + ("&watch=1" if watch else "")
    info = info_for("GET", f"/apis/g/v1/namespaces/ns/things?{query}")
    assert (info.name, info.verb) == (name, "watch" if watch else "list")
    assert info.field_selector == f"metadata.name={name}"


@given(path=st.text(alphabet="abcdefgh/-_.", max_size=30), method=METHODS)
def test_paths_outside_the_api_prefixes_are_non_resource(path: str, method: str) -> None:
    info = info_for(method, "/" + path)
    first = path.strip("/").split("/")[0]
    if first not in ("api", "apis"):
        assert info == RequestInfo(False, "/" + path, method.lower())
