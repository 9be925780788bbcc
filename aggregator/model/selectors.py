"""Field and label selectors parsed exactly like apimachinery's `fields.ParseSelector` and `labels.Parse`.

The sample server uses them to select objects (`LabelRequirement.matches`). Authorization needs
them twice: a list or watch whose field selector pins `metadata.name` is a
request for one named object (RBAC `resourceNames` rules match it), and a SubjectAccessReview
carries the selectors' requirements so kube-apiserver can authorize selector-limited requests. An
unparsable selector changes both outcomes, so parsing (including its error cases) follows upstream
token for token.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

# selection.Operator values
EQUALS = "="
DOUBLE_EQUALS = "=="
NOT_EQUALS = "!="
IN = "in"
NOT_IN = "notin"
EXISTS = "exists"
DOES_NOT_EXIST = "!"
GREATER_THAN = "gt"
LESS_THAN = "lt"


class SelectorError(ValueError):
    """A selector upstream would refuse to parse."""


@dataclass(frozen=True, slots=True)
class FieldRequirement:
    field: str
    operator: str  # EQUALS or NOT_EQUALS (`==` parses to EQUALS, like upstream's hasTerm)
    value: str


@dataclass(frozen=True, slots=True)
class LabelRequirement:
    key: str
    operator: str
    values: tuple[str, ...]  # sorted and de-duplicated, as the parser's string set leaves them

    def matches(self, labels: Mapping[str, str]) -> bool:
        """`Requirement.Matches`: absent keys satisfy only !=, notin and !."""
        present = self.key in labels
        value = labels.get(self.key, "")
        op = self.operator
        if op in (EQUALS, DOUBLE_EQUALS, IN):
            return present and value in self.values
        if op in (NOT_EQUALS, NOT_IN):
            return not present or value not in self.values
        if op == EXISTS:
            return present
        if op == DOES_NOT_EXIST:
            return not present
        if not present:
            return False
        try:
            left, right = int(value), int(self.values[0])
        except ValueError:
            return False
        return left > right if op == GREATER_THAN else left < right


# --- fields ----------------------------------------------------------------------------------------

_FIELD_OPERATORS = (("!=", NOT_EQUALS), ("==", EQUALS), ("=", EQUALS))


def _split_terms(selector: str) -> list[str]:
    """Split on commas that are not backslash-escaped (the backslash stays in the term)."""
    if not selector:
        return []
    terms: list[str] = []
    start = 0
    in_slash = False
    for i, ch in enumerate(selector):
        if in_slash:
            in_slash = False
        elif ch == "\\":
            in_slash = True
        elif ch == ",":
            terms.append(selector[start:i])
            start = i + 1
    terms.append(selector[start:])
    return terms


def _unescape_field_value(value: str) -> str:
    if not any(c in value for c in "\\,="):
        return value
    out: list[str] = []
    in_slash = False
    for ch in value:
        if in_slash:
            if ch not in "\\,=":
                raise SelectorError(f"invalid field selector: invalid escape sequence: \\{ch}")
            out.append(ch)
            in_slash = False
        elif ch == "\\":
            in_slash = True
        elif ch in ",=":
            raise SelectorError(f"invalid field selector: unescaped character in value: {ord(ch)}")
        else:
            out.append(ch)
    if in_slash:
        raise SelectorError("invalid field selector: invalid escape sequence: \\")
    return "".join(out)


def parse_field_selector(selector: str) -> tuple[FieldRequirement, ...]:
    """`fields.ParseSelector(...).Requirements()`: terms sorted as strings, empty terms skipped."""
    requirements: list[FieldRequirement] = []
    for term in sorted(_split_terms(selector)):
        if not term:
            continue
        for i in range(len(term)):
            hit = next(((tok, op) for tok, op in _FIELD_OPERATORS if term.startswith(tok, i)), None)
            if hit is not None:
                token, operator = hit
                lhs, rhs = term[:i], term[i + len(token) :]
                requirements.append(FieldRequirement(lhs, operator, _unescape_field_value(rhs)))
                break
        else:
            raise SelectorError(f"invalid selector: '{selector}'; can't understand '{term}'")
    return tuple(requirements)


def exact_match(requirements: tuple[FieldRequirement, ...], field: str) -> str | None:
    """`Selector.RequiresExactMatch(field)`: the first `field=value` term (in sorted order)."""
    for requirement in requirements:
        if requirement.operator == EQUALS and requirement.field == field:
            return requirement.value
    return None


# --- label keys and values (apimachinery util/validation) -------------------------------------------

_QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")


def is_qualified_name(value: str) -> bool:
    """`validation.IsQualifiedName`: `[prefix/]name`, prefix a DNS subdomain, name <= 63 chars."""
    parts = value.split("/")
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix or len(prefix) > 253 or not _DNS1123_SUBDOMAIN.fullmatch(prefix):
            return False
    else:
        return False
    return 0 < len(name) <= 63 and _QUALIFIED_NAME.fullmatch(name) is not None


def is_label_value(value: str) -> bool:
    return len(value) <= 63 and _LABEL_VALUE.fullmatch(value) is not None


def is_int64(text: str) -> bool:
    """`strconv.ParseInt(text, 10, 64)` succeeds."""
    if not re.fullmatch(r"[+-]?[0-9]+", text):
        return False
    return -(2**63) <= int(text) < 2**63


# --- labels: lexer and parser (labels/selector.go) --------------------------------------------------

_END, _CLOSE, _COMMA, _NOT, _DEQ, _EQ, _GT, _ID, _IN, _LT, _NEQ, _NOTIN, _OPEN, _ERROR = range(14)
_LITERALS = {
    ")": _CLOSE,
    ",": _COMMA,
    "!": _NOT,
    "==": _DEQ,
    "=": _EQ,
    ">": _GT,
    "in": _IN,
    "<": _LT,
    "!=": _NEQ,
    "notin": _NOTIN,
    "(": _OPEN,
}
_SPECIAL = frozenset("=!(),><")
_WHITESPACE = frozenset(" \t\r\n")
_BINARY = "in, notin, =, ==, !=, gt, lt"


class _Lexer:
    """Byte-at-a-time like upstream's: a NUL character reads as the end of the input."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def read(self) -> str:
        if self.pos < len(self.text):
            ch = self.text[self.pos]
            self.pos += 1
            return ch
        return "\0"

    def unread(self) -> None:
        self.pos -= 1

    def lex(self) -> tuple[int, str]:
        ch = self.read()
        while ch in _WHITESPACE:
            ch = self.read()
        if ch == "\0":
            return _END, ""
        self.unread()
        if ch in _SPECIAL:
            return self._special()
        return self._identifier()

    def _identifier(self) -> tuple[int, str]:
        buffer: list[str] = []
        while True:
            ch = self.read()
            if ch == "\0":
                break
            if ch in _SPECIAL or ch in _WHITESPACE:
                self.unread()
                break
            buffer.append(ch)
        text = "".join(buffer)
        return _LITERALS.get(text, _ID), text

    def _special(self) -> tuple[int, str]:
        last: tuple[int, str] | None = None
        buffer = ""
        while True:
            ch = self.read()
            if ch == "\0":
                break
            if ch in _SPECIAL:
                buffer += ch
                token = _LITERALS.get(buffer)
                if token is not None:
                    last = (token, buffer)
                elif last is not None:
                    self.unread()
                    break
            else:
                self.unread()
                break
        if last is None:
            return _ERROR, f"error expected: keyword found '{buffer}'"
        return last


class _Parser:
    def __init__(self, text: str) -> None:
        lexer = _Lexer(text)
        self.items: list[tuple[int, str]] = []
        while True:
            item = lexer.lex()
            self.items.append(item)
            if item[0] == _END:
                break
        self.position = 0

    def lookahead(self, values: bool) -> tuple[int, str]:
        token, literal = self.items[self.position]
        if values and token in (_IN, _NOTIN):
            token = _ID
        return token, literal

    def consume(self, values: bool) -> tuple[int, str]:
        item = self.lookahead(values)
        self.position += 1
        return item

    def parse(self) -> list[LabelRequirement]:
        requirements: list[LabelRequirement] = []
        while True:
            token, literal = self.lookahead(True)
            if token in (_ID, _NOT):
                requirements.append(self.requirement())
                token, literal = self.consume(True)
                if token == _END:
                    return requirements
                if token == _COMMA:
                    next_token, next_literal = self.lookahead(True)
                    if next_token not in (_ID, _NOT):
                        raise SelectorError(f"found '{next_literal}', expected: identifier after ','")
                    continue
                raise SelectorError(f"found '{literal}', expected: ',' or 'end of string'")
            if token == _END:
                return requirements
            raise SelectorError(f"found '{literal}', expected: !, identifier, or 'end of string'")

    def requirement(self) -> LabelRequirement:
        operator = ""
        token, literal = self.consume(True)
        if token == _NOT:
            operator = DOES_NOT_EXIST
            token, literal = self.consume(True)
        if token != _ID:
            raise SelectorError(f"found '{literal}', expected: identifier")
        key = literal
        if not is_qualified_name(key):
            raise SelectorError(f"invalid label key {key!r}")
        if operator == DOES_NOT_EXIST or self.lookahead(True)[0] in (_END, _COMMA):
            # `!key` never takes an operator: whatever follows it is the caller's problem
            return LabelRequirement(key, operator or EXISTS, ())
        token, literal = self.consume(False)
        operators = {_IN: IN, _EQ: EQUALS, _DEQ: DOUBLE_EQUALS, _GT: GREATER_THAN, _LT: LESS_THAN}
        operators |= {_NOTIN: NOT_IN, _NEQ: NOT_EQUALS}
        if token not in operators:
            raise SelectorError(f"found '{literal}', expected: {_BINARY}")
        operator = operators[token]
        values = self.set_values() if operator in (IN, NOT_IN) else self.exact_value()
        ordered = tuple(sorted(values))
        if operator in (GREATER_THAN, LESS_THAN) and not all(is_int64(v) for v in ordered):
            raise SelectorError("for 'Gt', 'Lt' operators, the value must be an integer")
        for value in ordered:
            if not is_label_value(value):
                raise SelectorError(f"invalid label value {value!r}")
        return LabelRequirement(key, operator, ordered)

    def set_values(self) -> set[str]:
        token, literal = self.consume(True)
        if token != _OPEN:
            raise SelectorError(f"found '{literal}' expected: '('")
        token, literal = self.lookahead(True)
        if token in (_ID, _COMMA):
            values = self.identifiers()
            if self.consume(True)[0] != _CLOSE:
                raise SelectorError(f"found '{literal}', expected: ')'")
            return values
        if token == _CLOSE:
            self.consume(True)
            return {""}
        raise SelectorError(f"found '{literal}', expected: ',', ')' or identifier")

    def identifiers(self) -> set[str]:
        values: set[str] = set()
        while True:
            token, literal = self.consume(True)
            if token == _ID:
                values.add(literal)
                next_token, next_literal = self.lookahead(True)
                if next_token == _COMMA:
                    continue
                if next_token == _CLOSE:
                    return values
                raise SelectorError(f"found '{next_literal}', expected: ',' or ')'")
            if token == _COMMA:
                if not values:
                    values.add("")
                next_token = self.lookahead(True)[0]
                if next_token == _CLOSE:
                    values.add("")
                    return values
                if next_token == _COMMA:
                    self.consume(True)
                    values.add("")
                continue
            raise SelectorError(f"found '{literal}', expected: ',', or identifier")

    def exact_value(self) -> set[str]:
        token = self.lookahead(True)[0]
        if token in (_END, _COMMA):
            return {""}
        token, literal = self.consume(True)
        if token == _ID:
            return {literal}
        raise SelectorError(f"found '{literal}', expected: identifier")


def parse_label_selector(selector: str) -> tuple[LabelRequirement, ...]:
    """`labels.Parse(selector)` requirements, sorted by key (stable, as Go's sort is for short lists)."""
    requirements = _Parser(selector).parse()
    return tuple(sorted(requirements, key=lambda r: r.key))
