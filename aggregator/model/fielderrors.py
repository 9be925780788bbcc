"""apimachinery's `field.Error` strings, byte for byte (`<path>: <Type>[: <value>][: <detail>]`)."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence

REQUIRED = "Required value"
INVALID = "Invalid value"
FORBIDDEN = "Forbidden"
UNSUPPORTED = "Unsupported value"

_SIMPLE_ESCAPES = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v"}


def go_quote(text: str) -> str:
    """Go's `%q` for a string."""
    out = ['"']
    for ch in text:
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif ch in _SIMPLE_ESCAPES:
            out.append(_SIMPLE_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        elif ord(ch) < 0x80 or unicodedata.category(ch)[0] not in ("C", "Z") or ch == " ":
            out.append(ch)
        elif ord(ch) <= 0xFFFF:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(f"\\U{ord(ch):08x}")
    out.append('"')
    return "".join(out)


def aggregate(errors: Sequence[str]) -> str:
    """`ErrorList.ToAggregate().Error()` (utilerrors' aggregate): duplicates dropped, one error bare,
    several in brackets."""
    unique = list(dict.fromkeys(errors))
    return unique[0] if len(unique) == 1 else "[" + ", ".join(unique) + "]"


def invalid_object(qualified_kind: str, name: str, errors: Sequence[str]) -> str:
    """`apierrors.NewInvalid(qualifiedKind, name, errs).Error()`, the 422 answer to an object that
    fails validation: `Role.rbac.authorization.k8s.io "x" is invalid: <errors>`."""
    return f"{qualified_kind} {go_quote(name)} is invalid: {aggregate(errors)}"


def _value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return go_quote(value)
    return str(value)


def required(path: str, detail: str = "") -> str:
    return f"{path}: {REQUIRED}" + (f": {detail}" if detail else "")


def forbidden(path: str, detail: str = "") -> str:
    return f"{path}: {FORBIDDEN}" + (f": {detail}" if detail else "")


def invalid(path: str, value: object, detail: str = "") -> str:
    return f"{path}: {INVALID}: {_value(value)}" + (f": {detail}" if detail else "")


def unsupported(path: str, value: object, supported: list[str]) -> str:
    listed = ", ".join(go_quote(s) for s in supported)
    return f"{path}: {UNSUPPORTED}: {_value(value)}: supported values: {listed}"


# --- apimachinery/pkg/util/validation -------------------------------------------------------------

DNS1123_LABEL_FMT = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS1123_SUBDOMAIN_FMT = DNS1123_LABEL_FMT + "(\\." + DNS1123_LABEL_FMT + ")*"
DNS1123_SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
    "and must start and end with an alphanumeric character"
)
DNS1123_LABEL_MSG = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must "
    "start and end with an alphanumeric character"
)
DNS1035_LABEL_FMT = "[a-z]([-a-z0-9]*[a-z0-9])?"
DNS1035_LABEL_MSG = (
    "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an "
    "alphabetic character, and end with an alphanumeric character"
)
_DNS1123_LABEL = re.compile(DNS1123_LABEL_FMT, re.ASCII)
_DNS1123_SUBDOMAIN = re.compile(DNS1123_SUBDOMAIN_FMT, re.ASCII)
_DNS1035_LABEL = re.compile(DNS1035_LABEL_FMT, re.ASCII)


def max_len_error(length: int) -> str:
    return f"must be no more than {length} characters"


def regex_error(msg: str, fmt: str, *examples: str) -> str:
    if not examples:
        return f"{msg} (regex used for validation is '{fmt}')"
    # Go builds this with `"'" + example + "', "` per example joined by " or " (hence the double space).
    msg += " (e.g. "
    for i, example in enumerate(examples):
        if i > 0:
            msg += " or "
        msg += f"'{example}', "
    return msg + f"regex used for validation is '{fmt}')"


def _dns_name_errors(
    value: str, max_len: int, pattern: re.Pattern[str], msg: str, fmt: str, *examples: str
) -> list[str]:
    """The length, then the pattern: how apimachinery's `IsDNS1123Label`, `IsDNS1123Subdomain` and
    `IsDNS1035Label` each check a name (they differ only in these arguments)."""
    errs = []
    if len(value) > max_len:
        errs.append(max_len_error(max_len))
    if not pattern.fullmatch(value):
        errs.append(regex_error(msg, fmt, *examples))
    return errs


def is_dns1123_label(value: str) -> list[str]:
    return _dns_name_errors(
        value, 63, _DNS1123_LABEL, DNS1123_LABEL_MSG, DNS1123_LABEL_FMT, "my-name", "123-abc"
    )


def is_dns1123_subdomain(value: str) -> list[str]:
    return _dns_name_errors(
        value, 253, _DNS1123_SUBDOMAIN, DNS1123_SUBDOMAIN_MSG, DNS1123_SUBDOMAIN_FMT, "example.com"
    )


def is_dns1035_label(value: str) -> list[str]:
    return _dns_name_errors(
        value, 63, _DNS1035_LABEL, DNS1035_LABEL_MSG, DNS1035_LABEL_FMT, "my-name", "abc-123"
    )


def is_valid_path_segment_name(name: str) -> list[str]:
    for illegal in (".", ".."):
        if name == illegal:
            return [f"may not be '{illegal}'"]
    return [f"may not contain '{c}'" for c in ("/", "%") if c in name]


def is_valid_port_num(port: int) -> list[str]:
    return [] if 1 <= port <= 65535 else ["must be between 1 and 65535, inclusive"]
