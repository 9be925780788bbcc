"""The header rules, property-tested: nothing that can carry identity crosses the gateway unchanged."""

from __future__ import annotations

import string
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from aggregator.auth.options import RequestHeaderOptions
from aggregator.backends.headers import (
    HOP_BY_HOP,
    IdentityHeaderPolicy,
    LiveIdentityPolicy,
    canonical_header_key,
    forwarded_uri,
    go_path_clean,
    header_key_escape,
    identity_headers,
    request_headers,
    response_headers,
)
from aggregator.model.userinfo import UserInfo
from aggregator.wire.gourl import path_unescape
from aggregator.wire.wsprotocol import BEARER_PROTOCOL_PREFIX

TOKEN = string.ascii_letters + string.digits + "!#$%&'*+-.^_`|~"
token = st.text(TOKEN, min_size=1, max_size=20)
value = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=30)
IDENTITY = ["Authorization", "X-Remote-User", "X-Remote-Uid", "X-Remote-Group"]
IDENTITY_PREFIXES = ["X-Remote-Extra-", "Impersonate-"]


@st.composite
def any_case(draw: st.DrawFn, name: str) -> str:
    flips = draw(st.lists(st.booleans(), min_size=len(name), max_size=len(name)))
    return "".join(c.swapcase() if f else c for c, f in zip(name, flips, strict=True))


@st.composite
def underscored(draw: st.DrawFn, name: str) -> str:
    """`name` with some of its `-` written `_` (`X-Remote_User`): one header to a CGI or WSGI backend."""
    flips = draw(st.lists(st.booleans(), min_size=len(name), max_size=len(name)))
    return "".join("_" if c == "-" and f else c for c, f in zip(name, flips, strict=True))


@st.composite
def identity_name(draw: st.DrawFn, custom: tuple[list[str], list[str]]) -> str:
    names, prefixes = custom
    if draw(st.booleans()):
        return draw(underscored(draw(any_case(draw(st.sampled_from(IDENTITY + names))))))
    prefix = draw(st.sampled_from(IDENTITY_PREFIXES + prefixes))
    return draw(underscored(draw(any_case(prefix)))) + draw(token)


custom_config = st.tuples(
    st.lists(token.map(lambda t: "X-" + t), max_size=3),
    st.lists(token.map(lambda t: "X-" + t + "-"), max_size=2),
)
users = st.builds(
    UserInfo,
    name=value,
    uid=value,
    groups=st.lists(value, max_size=4).map(tuple),
    extra=st.dictionaries(
        st.text(min_size=1, max_size=12), st.lists(value, max_size=2).map(tuple), max_size=3
    ),
)


@settings(max_examples=300, deadline=None)
@given(data=st.data(), custom=custom_config, user=users)
def test_inbound_identity_never_survives(
    data: st.DataObject, custom: tuple[list[str], list[str]], user: UserInfo
) -> None:
    names, prefixes = custom
    policy = IdentityHeaderPolicy.build(username_headers=names, extra_prefixes=prefixes)
    spoofed = data.draw(st.lists(st.tuples(identity_name(custom), st.just("SPOOF")), min_size=1, max_size=30))
    ordinary = data.draw(st.lists(st.tuples(token.map(lambda t: "Y-" + t), value), max_size=10))
    inbound = data.draw(st.permutations(spoofed + ordinary))
    out = request_headers(inbound, user, policy, authority="10.0.0.5:443")
    assert "SPOOF" not in out.values()
    # What the backend is told is exactly the authenticated user.
    asserted = [(k, v) for k, v in out.items() if policy.is_identity(k)]
    assert asserted == identity_headers(user, policy)
    for name, val in ordinary:
        if name.lower() not in HOP_BY_HOP:
            assert val in out.getall(name)


@settings(max_examples=200, deadline=None)
@given(
    inbound=st.lists(
        st.tuples(st.sampled_from(sorted(HOP_BY_HOP)).flatmap(any_case).flatmap(underscored), value),
        max_size=10,
    ),
    extra=token,
)
def test_hop_by_hop_and_connection_named_headers_are_dropped(
    inbound: list[tuple[str, str]], extra: str
) -> None:
    headers = [*inbound, ("Connection", f"close, {extra}"), (extra.upper(), "hop"), ("Keep", "me")]
    out = request_headers(headers, None, authority="h:1")
    # The inbound value never passes; a header the gateway sets itself (X-Forwarded-For, as Go's
    # ReverseProxy sets it after removeHopByHopHeaders) may carry the same name.
    assert not [v for k, v in out.items() if k.lower() == extra.lower() and "hop" in v]
    assert not any(k.lower().replace("_", "-") in HOP_BY_HOP for k in out)
    assert out["Keep"] == "me"


def test_a_forwarded_for_named_in_connection_is_not_passed_on() -> None:
    """Go's ReverseProxy removes the `Connection`-named headers before it appends the client to
    X-Forwarded-For (httputil.ReverseProxy.ServeHTTP): the inbound chain is dropped, the client kept."""
    inbound = [("Connection", "close, X-FORWARDED-FOR"), ("X-Forwarded-For", "10.9.9.9"), ("Keep", "me")]
    assert request_headers(inbound, None, authority="h:1").getall("X-Forwarded-For", []) == []
    out = request_headers(inbound, None, authority="h:1", client_ip="192.0.2.1")
    assert out.getall("X-Forwarded-For") == ["192.0.2.1"]
    kept = request_headers([("X-Forwarded-For", "10.9.9.9")], None, authority="h:1", client_ip="192.0.2.1")
    assert kept.getall("X-Forwarded-For") == ["10.9.9.9, 192.0.2.1"]


subprotocol = st.text(string.ascii_lowercase + string.digits + ".", min_size=1, max_size=12)


@settings(max_examples=200, deadline=None)
@given(
    lines=st.lists(
        st.lists(st.one_of(subprotocol, token.map(lambda t: BEARER_PROTOCOL_PREFIX + t)), min_size=1, max_size=4),
        min_size=1,
        max_size=3,
    ),
    name=any_case("Sec-WebSocket-Protocol"),
)
def test_a_token_offered_as_a_subprotocol_never_reaches_the_backend(lines: list[list[str]], name: str) -> None:
    inbound = [(name, " , ".join(entries)) for entries in lines]
    out = request_headers(inbound, UserInfo("u"), authority="h:1", upgrade="websocket")
    forwarded = out.getall("Sec-WebSocket-Protocol", [])
    assert not any(BEARER_PROTOCOL_PREFIX in v for v in forwarded)
    # Every other subprotocol survives, in order (upstream joins the rest with ",").
    kept = [p.strip() for v in forwarded for p in v.split(",")]
    assert kept == [p for entries in lines for p in entries if not p.startswith(BEARER_PROTOCOL_PREFIX)]


def test_subprotocols_without_a_token_cross_byte_for_byte() -> None:
    out = request_headers(
        [("Sec-WebSocket-Protocol", "v5.channel.k8s.io,  v4.channel.k8s.io")], None, authority="h:1"
    )
    assert out.getall("Sec-WebSocket-Protocol") == ["v5.channel.k8s.io,  v4.channel.k8s.io"]


def test_upgrade_keeps_its_protocol_and_connection() -> None:
    out = request_headers(
        [("Connection", "Upgrade"), ("Upgrade", "SPDY/3.1"), ("Keep-Alive", "1")],
        UserInfo("u"),
        authority="h:1",
        upgrade="SPDY/3.1",
    )
    assert out["Connection"] == "Upgrade"
    assert out["Upgrade"] == "SPDY/3.1"
    assert "Keep-Alive" not in out


def test_identity_headers_follow_set_auth_proxy_headers() -> None:
    user = UserInfo("alice", "", ("a", "b"), {"scopes": ("r", "w"), "example.com/team%": ("x",)})
    assert identity_headers(user) == [
        ("X-Remote-User", "alice"),
        ("X-Remote-Group", "a"),
        ("X-Remote-Group", "b"),
        ("X-Remote-Extra-Example.com%2fteam%25", "x"),
        ("X-Remote-Extra-Scopes", "r"),
        ("X-Remote-Extra-Scopes", "w"),
    ]
    assert identity_headers(UserInfo("", "u1"))[:2] == [("X-Remote-User", ""), ("X-Remote-Uid", "u1")]
    assert identity_headers(UserInfo("bob", groups=("g",)), impersonate=True) == [
        ("Impersonate-User", "bob"),
        ("Impersonate-Group", "g"),
    ]


def test_values_that_could_inject_a_header_line_are_dropped() -> None:
    user = UserInfo(
        "eve\r\nX-Remote-Group: system:masters", groups=("ok", "bad\nX: y"), extra={"k": ("v\r",)}
    )
    assert identity_headers(user) == [("X-Remote-User", ""), ("X-Remote-Group", "ok")]


def test_forwarded_headers() -> None:
    out = request_headers(
        [("X-Forwarded-For", "1.2.3.4"), ("X-Forwarded-Uri", "/spoof"), ("X-Forwarded-Host", "evil")],
        UserInfo("u"),
        authority="10.0.0.5:443",
        client_ip="127.0.0.1",
        forwarded_uri="/apis/g/v/x/",
    )
    assert out.getall("X-Forwarded-For") == ["1.2.3.4, 127.0.0.1"]
    assert out.getall("X-Forwarded-Uri") == ["/apis/g/v/x/"]
    assert out.getall("X-Forwarded-Host") == ["10.0.0.5:443"]
    assert out["X-Forwarded-Proto"] == "https"
    assert out["Host"] == "10.0.0.5:443"


def test_one_policy_decides_each_name_by_its_use_whatever_came_before() -> None:
    """The policy remembers what it decided of each inbound name: the `X-Forwarded-*` a client
    sent pass on to the delegate's fetches (no forwarded URI) and are replaced on proxied requests,
    in either order, and a name in another letter case is decided on its own."""
    policy = IdentityHeaderPolicy.build(group_headers=["X-Custom-Group"])
    inbound = [("X-Forwarded-Uri", "/spoof"), ("x-custom_group", "admins"), ("Accept", "*/*")]
    for _ in range(2):
        plain = request_headers(inbound, None, policy, authority="a")
        assert plain.getall("X-Forwarded-Uri") == ["/spoof"] and "X-Custom-Group" not in plain
        assert plain["Accept"] == "*/*"
        proxied = request_headers(inbound, None, policy, authority="a", forwarded_uri="/apis/g/v")
        assert proxied.getall("X-Forwarded-Uri") == ["/apis/g/v"] and "X-Custom-Group" not in proxied
        assert proxied["Accept"] == "*/*"


@given(key=st.text(max_size=30))
def test_header_key_escape_round_trips_through_the_receiver(key: str) -> None:
    escaped = header_key_escape(key)
    assert all(c in TOKEN for c in escaped)
    # Receivers lower-case the name, then unescape (apiserver's headerrequest).
    assert path_unescape(escaped.lower()) == key.lower() or key != key.lower()
    if key == key.lower():
        assert path_unescape(escaped.lower()) == key


def test_header_key_escape_examples() -> None:
    assert header_key_escape("example.com/team") == "example.com%2Fteam"
    assert header_key_escape("100%") == "100%25"
    assert header_key_escape("a b") == "a%20b"
    assert header_key_escape("é") == "%C3%A9"


@given(name=st.text(TOKEN, max_size=30))
def test_canonical_header_key_is_case_insensitive(name: str) -> None:
    canonical = canonical_header_key(name)
    assert canonical.lower() == name.lower()
    assert canonical_header_key(name.swapcase()) == canonical
    assert canonical_header_key(canonical) == canonical


def test_canonical_header_key_matches_go() -> None:
    assert canonical_header_key("x-remote-extra-example.com%2Fteam") == "X-Remote-Extra-Example.com%2fteam"
    assert canonical_header_key("accept-encoding") == "Accept-Encoding"
    assert canonical_header_key("has space") == "has space"


def test_go_path_clean_and_forwarded_uri() -> None:
    assert go_path_clean("//a//b/./c/../d") == "/a/b/d"
    assert go_path_clean("/../x") == "/x"
    assert go_path_clean("") == "."
    assert forwarded_uri("/apis/g/v/things/?watch=1") == "/apis/g/v/things/"
    assert forwarded_uri("/apis/g/v/a%2Fb?x") == "/apis/g/v/a%2Fb"
    assert forwarded_uri("/") == "/"


@settings(max_examples=200)
@given(
    names=st.lists(
        st.sampled_from(
            [
                "Access-Control-Allow-Origin",
                "Access-Control-Allow-Credentials",
                "Access-Control-Allow-Methods",
                "Access-Control-Allow-Headers",
                "Transfer-Encoding",
                "Connection",
                "ETag",
                "Content-Type",
            ]
        ).flatmap(any_case),
        max_size=12,
    )
)
def test_response_headers_strip_cors_and_hop_by_hop(names: list[str]) -> None:
    out = response_headers([(n, "v") for n in names])
    kept = {k.lower() for k in out}
    assert kept <= {"etag", "content-type"}
    assert len(out) == sum(1 for n in names if n.lower() in ("etag", "content-type"))


def test_live_policy_follows_the_configuration_in_force() -> None:
    """The flags' names always; the followed configuration's names while it is in force; the same
    policy object as long as the configuration object is the same (the per-request cost)."""

    @dataclass(frozen=True)
    class Names:
        username_headers: tuple[str, ...] = ()
        uid_headers: tuple[str, ...] = ()
        group_headers: tuple[str, ...] = ()
        extra_prefixes: tuple[str, ...] = ()

    flags = RequestHeaderOptions(username_headers=["X-Flag-User"], group_headers=[], extra_prefixes=["X-Flag-Extra-"])
    live = LiveIdentityPolicy(flags)
    assert live.current().is_identity("x-flag-user") and not live.current().is_identity("X-Auth-User")
    in_force: list[Names | None] = [
        Names(("X-Auth-User",), ("X-Auth-Uid",), ("X-Auth-Groups",), ("X-Auth-Extra-",))
    ]
    live.follow(lambda: in_force[0])
    first = live.current()
    assert live.current() is first
    for name in (
        "X-AUTH-USER",
        "x-auth-uid",
        "X-Auth-Groups",
        "x-auth-extra-scopes",
        "X-Flag-User",
        "X-Remote-User",
    ):
        assert first.is_identity(name), name
    assert first.is_identity("Impersonate-User")
    in_force[0] = Names(("X-Proxy-User",))
    second = live.current()
    assert (
        second is not first and second.is_identity("x-proxy-user") and not second.is_identity("X-Auth-User")
    )
    assert second.is_identity("X-Flag-Extra-A")
    in_force[0] = None
    assert not live.current().is_identity("X-Proxy-User") and live.current().is_identity("X-Flag-User")
    keep = LiveIdentityPolicy(keep_impersonation=True)
    keep.follow(lambda: in_force[0])
    assert not keep.current().is_identity("Impersonate-User")


def test_look_alikes_of_every_header_the_gateway_sets_are_dropped() -> None:
    """What a WSGI backend would read as the gateway's own headers (HTTP_X_FORWARDED_FOR, HTTP_HOST...)."""
    policy = IdentityHeaderPolicy.build(username_headers=["X-Auth_User"], extra_prefixes=["X_Auth-Extra_"])
    inbound = [
        ("X-Remote_User", "SPOOF"),
        ("X_Remote_User", "SPOOF"),
        ("x_remote_group", "SPOOF"),
        ("X-Remote-Extra_Scopes", "SPOOF"),
        ("X_Auth_User", "SPOOF"),  # the configured name, its look-alike
        ("X-Auth-User", "SPOOF"),
        ("x-auth-extra-team", "SPOOF"),
        ("Impersonate_User", "SPOOF"),
        ("X_Forwarded_Host", "SPOOF"),
        ("X_Forwarded_Uri", "SPOOF"),
        ("X_Forwarded_Proto", "SPOOF"),
        ("Transfer_Encoding", "SPOOF"),
        ("Connection", "x_secret"),
        ("X-Secret", "SPOOF"),
        ("X-Custom_Header", "kept"),
    ]
    out = request_headers(inbound, UserInfo("alice"), policy, authority="h:1", forwarded_uri="/x")
    assert "SPOOF" not in out.values()
    assert out["X-Custom_Header"] == "kept"
    assert out["X-Remote-User"] == "alice"
    assert policy.is_identity("x_auth_user") and policy.is_identity("X-Auth-Extra-Team")
