"""Which backend answers are redirects, refused on every way to a backend (CVE-2022-3172).

A client that follows a backend's redirect takes its credentials (a bearer token, a client
certificate) wherever the backend says; a gateway that followed one would send its own front-proxy
identity there. So nothing the gateway asks a backend for follows a redirect (the lean client never
does), and no redirect reaches a client: proxied requests get upstream's 502, discovery and OpenAPI
fetches fail, the availability check reports `RedirectRejected`.

Upstream (`upgradeaware.go`, `RejectForwardingRedirects`) refuses a 3xx whose *first* `Location`
value is non-empty, so `Location:` followed by `Location: https://elsewhere` passes with both, and a
3xx with only `Refresh` (which browsers follow) passes too. Here the status decides: every 3xx
except `304 Not Modified` is refused whatever its headers say. A 304 is not a redirect (it answers
a conditional request from the client's cache; no client follows it) and is relayed, but without any
`Location` or `Refresh` value. kube-apiserver's own redirects (its service and pod proxy paths)
pass through the delegate untouched: it is trusted, as upstream's own handlers are.
"""

from __future__ import annotations

from collections.abc import Iterable

REDIRECT_MESSAGE = "the backend attempted to redirect this request, which is not permitted"
NOT_MODIFIED = 304
# Headers that send a client elsewhere: stripped from a relayed 304.
REDIRECT_HEADERS = frozenset({"location", "refresh"})


def is_redirect(status: int) -> bool:
    """Whether an answer with this status is refused: every 3xx but 304."""
    return 300 <= status < 400 and status != NOT_MODIFIED


def without_redirect_headers(headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """`headers` minus every `Location` and `Refresh` value (for a relayed 304)."""
    return [(name, value) for name, value in headers if name.lower() not in REDIRECT_HEADERS]
