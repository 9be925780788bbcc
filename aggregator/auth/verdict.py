"""An authorizer's answer: allow, deny or no opinion, with its reason (`authorizer.Decision`)."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Decision(enum.Enum):
    ALLOW = "allow"
    DENY = "deny"
    NO_OPINION = "no-opinion"


@dataclass(frozen=True, slots=True)
class Verdict:
    decision: Decision
    reason: str = ""
    error: str = ""  # set: the request gets a 500 unless the decision is ALLOW


ALLOWED = Verdict(Decision.ALLOW)
NO_OPINION = Verdict(Decision.NO_OPINION)
