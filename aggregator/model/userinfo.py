"""Who is calling: the authenticated identity that travels with every request."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

ANONYMOUS_USER = "system:anonymous"
AUTHENTICATED_GROUP = "system:authenticated"
UNAUTHENTICATED_GROUP = "system:unauthenticated"
# The identity the gateway uses for its own backend calls (discovery, availability), as upstream.
AGGREGATOR_USER = "system:kube-aggregator"
MASTERS_GROUP = "system:masters"


@dataclass(frozen=True, slots=True)
class UserInfo:
    name: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def anonymous(self) -> bool:
        return self.name == ANONYMOUS_USER

    def with_authenticated_group(self) -> UserInfo:
        """`AuthenticatedGroupAdder`: add system:authenticated unless anonymous or already marked."""
        if self.anonymous or AUTHENTICATED_GROUP in self.groups or UNAUTHENTICATED_GROUP in self.groups:
            return self
        return UserInfo(self.name, self.uid, (*self.groups, AUTHENTICATED_GROUP), self.extra)


ANONYMOUS = UserInfo(ANONYMOUS_USER, groups=(UNAUTHENTICATED_GROUP,))
AGGREGATOR = UserInfo(AGGREGATOR_USER, groups=(MASTERS_GROUP,))
