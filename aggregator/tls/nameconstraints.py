"""Go's name-constraint matching, to name the subject-alternative name a CA may not sign for.

Used to word refusals (cryptography's verifier decides what is accepted): crypto/x509 verify.go
`isValid` -> `checkNameConstraints` and its `match*Constraint` helpers, for the four name types Go
checks (DNS, email, URI, IP; it ignores the others). `violation` returns Go's error text, or None.
"""

from __future__ import annotations

import ipaddress
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from cryptography import x509

from aggregator.model.fielderrors import go_quote

NOT_AUTHORIZED = "x509: a root or intermediate certificate is not authorized to sign for this name: "


class _Unmatchable(Exception):
    """A name or constraint Go cannot compare: a `CANotAuthorizedForThisName` error with this detail."""


class _Unparsable(Exception):
    """A subject-alternative name Go cannot parse: its own error, not wrapped."""


def _reverse_labels(domain: str) -> list[str] | None:
    """crypto/x509 `domainToReverseLabels`."""
    if not domain:
        return []
    labels = domain.split(".")[::-1]
    if any(not label or any(not 33 <= ord(ch) <= 126 for ch in label) for label in labels):
        return None
    return labels


def _match_domain(domain: str, constraint: str) -> bool:
    """crypto/x509 `matchDomainConstraint`: a leading dot demands at least one more label."""
    if not constraint:
        return True
    domain_labels = _reverse_labels(domain)
    if domain_labels is None:
        raise _Unmatchable(f"x509: internal error: cannot parse domain {go_quote(domain)}")
    must_have_subdomains = constraint.startswith(".")
    if must_have_subdomains:
        constraint = constraint[1:]
    constraint_labels = _reverse_labels(constraint)
    if constraint_labels is None:
        raise _Unmatchable(f"x509: internal error: cannot parse domain {go_quote(constraint)}")
    if len(domain_labels) < len(constraint_labels) or (
        must_have_subdomains and len(domain_labels) == len(constraint_labels)
    ):
        return False
    return all(c.lower() == d.lower() for c, d in zip(constraint_labels, domain_labels, strict=False))


def _match_email(mailbox: str, constraint: str) -> bool:
    """crypto/x509 `matchEmailConstraint`: a whole mailbox, or a domain like a DNS constraint."""
    local, _, domain = mailbox.rpartition("@")
    if "@" in constraint:
        want_local, _, want_domain = constraint.rpartition("@")
        return local == want_local and domain.lower() == want_domain.lower()
    return _match_domain(domain, constraint)


def _match_uri(uri: str, constraint: str) -> bool:
    """crypto/x509 `matchURIConstraint`: the URI's host, which must be a domain name."""
    host = urllib.parse.urlsplit(uri).netloc.rpartition("@")[2]
    if not host:
        raise _Unmatchable(f"URI with empty host ({go_quote(uri)}) cannot be matched against constraints")
    if ":" in host and not host.endswith("]"):
        host = host.rsplit(":", 1)[0]
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return _match_domain(host, constraint)
    raise _Unmatchable(f"URI with IP ({go_quote(uri)}) cannot be matched against constraints")


def _match_ip(ip: ipaddress.IPv4Address | ipaddress.IPv6Address, constraint: object) -> bool:
    """crypto/x509 `matchIPConstraint`: the address lies in a network of its own family."""
    return (
        isinstance(constraint, ipaddress.IPv4Network | ipaddress.IPv6Network)
        and constraint.version == ip.version
        and ip in constraint
    )


def _parse_dns(dns: str) -> None:
    if _reverse_labels(dns) is None:
        raise _Unparsable(f"x509: cannot parse dnsName {go_quote(dns)}")


def _parse_email(email: str) -> None:
    if "@" not in email:
        raise _Unparsable(f"x509: cannot parse rfc822Name {go_quote(email)}")


@dataclass(frozen=True)
class _NameType:
    """How Go checks one type of subject-alternative name: what its errors call it, how it parses
    the name (raising `_Unparsable`), and how a constraint of the same type matches it."""

    kind: str
    matches: Callable[[Any, object], bool]
    parse: Callable[[Any], None] = lambda value: None


# The four name types `checkNameConstraints` is called for, in Go's order; it ignores the others.
_NAME_TYPES: dict[type[x509.GeneralName], _NameType] = {
    x509.DNSName: _NameType("DNS name", lambda dns, c: _match_domain(dns, str(c)), _parse_dns),
    x509.RFC822Name: _NameType("email address", lambda email, c: _match_email(email, str(c)), _parse_email),
    x509.UniformResourceIdentifier: _NameType("URI", lambda uri, c: _match_uri(uri, str(c))),
    x509.IPAddress: _NameType("IP address", _match_ip),
}


def _values(subtrees: Sequence[x509.GeneralName] | None, kind: type[x509.GeneralName]) -> list[object]:
    return [subtree.value for subtree in subtrees or () if isinstance(subtree, kind)]


def _violation_for(name: x509.GeneralName, nc: x509.NameConstraints) -> str | None:
    """crypto/x509 `checkNameConstraints` for one name: exclusions first, then at least one permission."""
    name_type = _NAME_TYPES.get(type(name))
    if name_type is None:
        return None  # Go ignores the other name types
    value = name.value
    name_type.parse(value)
    for constraint in _values(nc.excluded_subtrees, type(name)):
        if name_type.matches(value, constraint):
            return f"{name_type.kind} {go_quote(str(value))} is excluded by constraint {go_quote(str(constraint))}"
    permitted = _values(nc.permitted_subtrees, type(name))
    if permitted and not any(name_type.matches(value, constraint) for constraint in permitted):
        return f"{name_type.kind} {go_quote(str(value))} is not permitted by any constraint"
    return None


def violation(names: Sequence[x509.GeneralName], constraints: x509.NameConstraints) -> str | None:
    """Go's error for the first of `names` that `constraints` forbid, or None."""
    try:
        for name in names:
            detail = _violation_for(name, constraints)
            if detail is not None:
                return NOT_AUTHORIZED + detail
    except _Unmatchable as err:
        return NOT_AUTHORIZED + str(err)
    except _Unparsable as err:
        return str(err)
    return None
