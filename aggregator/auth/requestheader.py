"""Identity asserted by a front proxy in request headers (`--requestheader-*`).

Only trusted after the caller's certificate verified against the front-proxy CA with an allowed
common name; the semantics are apiserver's `headerrequest` authenticator (`pkg/authentication/request/headerrequest/requestheader.go`):
first non-empty username header wins, every non-empty value of every group header, extra keys
lower-cased and percent-unescaped (the raw lower-cased key if unescaping fails).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from multidict import CIMultiDictProxy

from aggregator.model.userinfo import UserInfo
from aggregator.tls.verify import CAPool
from aggregator.wire.gourl import path_unescape


@dataclass(frozen=True)
class RequestHeaderConfig:
    pool: CAPool
    allowed_names: frozenset[str]
    username_headers: tuple[str, ...] = ("X-Remote-User",)
    uid_headers: tuple[str, ...] = ()
    group_headers: tuple[str, ...] = ("X-Remote-Group",)
    extra_prefixes: tuple[str, ...] = ("X-Remote-Extra-",)

    def identity_header(self, name: str) -> bool:
        """True for any header this configuration reads identity from (compared case-insensitively)."""
        lowered = name.lower()
        if lowered in {h.lower() for h in (*self.username_headers, *self.uid_headers, *self.group_headers)}:
            return True
        return any(lowered.startswith(p.lower()) for p in self.extra_prefixes)


def user_from_headers(headers: CIMultiDictProxy[str], config: RequestHeaderConfig) -> UserInfo | None:
    """The asserted user, or None when no username header carries a value (not authenticated)."""
    name = next((v for h in config.username_headers if (v := headers.get(h, ""))), "")
    if not name:
        return None
    uid = next((v for h in config.uid_headers if (v := headers.get(h, ""))), "")
    groups = tuple(v for h in config.group_headers for v in headers.getall(h, []) if v)
    extra: dict[str, list[str]] = {}
    prefixes = [p.lower() for p in config.extra_prefixes]
    for prefix in prefixes:
        for header, value in headers.items():
            lowered = header.lower()
            if not lowered.startswith(prefix):
                continue
            suffix = lowered[len(prefix) :]
            try:
                key = path_unescape(suffix)
            except ValueError:
                key = suffix
            extra.setdefault(key, []).append(value)
    frozen: Mapping[str, tuple[str, ...]] = {k: tuple(v) for k, v in extra.items()}
    return UserInfo(name, uid, groups, frozen)
