"""Field and label selector parsing against apimachinery's own test tables, plus round-trip properties."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aggregator.model.selectors import (
    DOES_NOT_EXIST,
    DOUBLE_EQUALS,
    EQUALS,
    EXISTS,
    GREATER_THAN,
    IN,
    LESS_THAN,
    NOT_EQUALS,
    NOT_IN,
    FieldRequirement,
    LabelRequirement,
    SelectorError,
    exact_match,
    is_qualified_name,
    parse_field_selector,
    parse_label_selector,
)

# --- fields (fields/selector_test.go) --------------------------------------------------------------


@pytest.mark.parametrize("text", ["x=a,y=b,z=c", "", "x!=a,y=b"])
def test_field_selector_good_strings(text: str) -> None:
    parse_field_selector(text)


@pytest.mark.parametrize("text", ["x=a||y=b", "x==a==b", "x", "a=b\\", "a=b\\q", "a=b=c"])
def test_field_selector_bad_strings(text: str) -> None:
    with pytest.raises(SelectorError):
        parse_field_selector(text)


def test_field_selector_terms_are_sorted_and_operators_normalised() -> None:
    assert parse_field_selector("x=a,a==x,m!=n") == (
        FieldRequirement("a", EQUALS, "x"),
        FieldRequirement("m", NOT_EQUALS, "n"),
        FieldRequirement("x", EQUALS, "a"),
    )
    assert parse_field_selector("x=a,a=x") == parse_field_selector("a=x,x=a")
    assert parse_field_selector(",,") == ()


def test_field_selector_escapes() -> None:
    assert parse_field_selector(r"a=x\,y\=z\\w") == (FieldRequirement("a", EQUALS, "x,y=z\\w"),)
    with pytest.raises(SelectorError, match="invalid escape sequence"):
        parse_field_selector(r"a=\n")
    with pytest.raises(SelectorError, match="can't understand 'b'"):
        parse_field_selector("a=1,b")


def test_exact_match_takes_the_first_equality_in_sorted_order() -> None:
    assert exact_match(parse_field_selector("metadata.name=b,metadata.name!=c"), "metadata.name") == "b"
    assert exact_match(parse_field_selector("metadata.name=z,metadata.name=a"), "metadata.name") == "a"
    assert exact_match(parse_field_selector("metadata.name!=b"), "metadata.name") is None
    assert exact_match(parse_field_selector("test="), "test") == ""
    assert exact_match((), "test") is None


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace(",", "\\,").replace("=", "\\=")


@given(field=st.text(alphabet="abc.xyz", min_size=1, max_size=8), value=st.text(max_size=12))
def test_escaped_field_values_round_trip(field: str, value: str) -> None:
    assert parse_field_selector(f"{field}={_escape(value)}") == (FieldRequirement(field, EQUALS, value),)


# --- labels (labels/selector_test.go) ---------------------------------------------------------------


@pytest.mark.parametrize(
    "text", ["x=a,y=b,z=c", "", "x!=a,y=b", "x=", "x= ", "x=,z= ", "x= ,z= ", "!x", "x>1", "x>1,z<5"]
)
def test_label_selector_good_strings(text: str) -> None:
    parse_label_selector(text)


@pytest.mark.parametrize("text", ["x=a||y=b", "x==a==b", "!x=a", "x<a"])
def test_label_selector_bad_strings(text: str) -> None:
    with pytest.raises(SelectorError):
        parse_label_selector(text)


def req(key: str, op: str, *values: str) -> LabelRequirement:
    return LabelRequirement(key, op, tuple(sorted(set(values))))


SET_SELECTOR_CASES: list[tuple[str, tuple[LabelRequirement, ...] | None]] = [
    ("", ()),
    ("\rx", (req("x", EXISTS),)),
    ("this-is-a-dns.domain.com/key-with-dash", (req("this-is-a-dns.domain.com/key-with-dash", EXISTS),)),
    (
        "this-is-another-dns.domain.com/key-with-dash in (so,what)",
        (req("this-is-another-dns.domain.com/key-with-dash", IN, "so", "what"),),
    ),
    (
        "0.1.2.domain/99 notin (10.10.100.1, tick.tack.clock)",
        (req("0.1.2.domain/99", NOT_IN, "10.10.100.1", "tick.tack.clock"),),
    ),
    ("foo  in\t (abc)", (req("foo", IN, "abc"),)),
    ("x notin\n (abc)", (req("x", NOT_IN, "abc"),)),
    ("x  notin\t\t\t(abc,def)", (req("x", NOT_IN, "abc", "def"),)),
    ("x in (abc,def)", (req("x", IN, "abc", "def"),)),
    ("x in (abc,)", (req("x", IN, "abc", ""),)),
    ("x in ()", (req("x", IN, ""),)),
    (
        "x notin (abc,,def),bar,z in (),w",
        (req("bar", EXISTS), req("w", EXISTS), req("x", NOT_IN, "abc", "", "def"), req("z", IN, "")),
    ),
    ("x,y in (a)", (req("x", EXISTS), req("y", IN, "a"))),
    ("x=a", (req("x", EQUALS, "a"),)),
    ("x>1", (req("x", GREATER_THAN, "1"),)),
    ("x<7", (req("x", LESS_THAN, "7"),)),
    ("x=a,y!=b", (req("x", EQUALS, "a"), req("y", NOT_EQUALS, "b"))),
    (
        "x=a,y!=b,z in (h,i,j)",
        (req("x", EQUALS, "a"), req("y", NOT_EQUALS, "b"), req("z", IN, "h", "i", "j")),
    ),
    ("x=a||y=b", None),
    ("x,,y", None),
    (",x,y", None),
    ("x nott in (y)", None),
    ("x notin ( )", (req("x", NOT_IN, ""),)),
    ("x notin (, a)", (req("x", NOT_IN, "", "a"),)),
    ("a in (xyz),", None),
    ("a in (xyz)b notin ()", None),
    ("a ", (req("a", EXISTS),)),
    ("a in (x,y,notin, z,in)", (req("a", IN, "in", "notin", "x", "y", "z"),)),
    ("a in (xyz abc)", None),
    ("a notin(", None),
    ("a (", None),
    ("(", None),
    ("x==a", (req("x", DOUBLE_EQUALS, "a"),)),
    ("!x,y", (req("x", DOES_NOT_EXIST), req("y", EXISTS))),
    ("a" * 254, None),  # longer than a DNS subdomain key may be
    ("x=" + "v" * 64, None),  # label values are at most 63 characters
    ("x \0,!!", (req("x", EXISTS),)),  # a NUL between tokens ends the input, as Go's lexer reads it
    ("x\0,!!", None),  # ... but inside an identifier it only ends the identifier
]


@pytest.mark.parametrize(("text", "expected"), SET_SELECTOR_CASES)
def test_set_selector_parser(text: str, expected: tuple[LabelRequirement, ...] | None) -> None:
    if expected is None:
        with pytest.raises(SelectorError):
            parse_label_selector(text)
    else:
        assert parse_label_selector(text) == expected


def test_label_parse_is_deterministic() -> None:
    assert parse_label_selector("x=a,a=x") == parse_label_selector("a=x,x=a")


@pytest.mark.parametrize(
    ("key", "valid"),
    [("x", True), ("1foo", True), ("1234", True), ("a" * 63, True), ("a" * 64, False), ("a/b", True),
     ("/b", False), ("A.com/b", False), ("a/b/c", False), ("-a", False), ("a_b.c-d", True)],
)  # fmt: skip
def test_label_keys(key: str, valid: bool) -> None:
    assert is_qualified_name(key) is valid


LABEL_PART = st.text(alphabet="abcxyz019", min_size=1, max_size=10)


@given(key=LABEL_PART, values=st.lists(LABEL_PART, min_size=1, max_size=4), negate=st.booleans())
def test_set_requirements_hold_their_sorted_values(key: str, values: list[str], negate: bool) -> None:
    op = NOT_IN if negate else IN
    text = f"{key} {'notin' if negate else 'in'} ({', '.join(values)})"
    assert parse_label_selector(text) == (LabelRequirement(key, op, tuple(sorted(set(values)))),)
