"""How an options group adds its flags (`util/flags.py`): bound to a field, shown as pflag users
know them, sharing help sections, and parsed values assigned to their groups."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

import pytest

from aggregator.util.flags import (
    ConfigError,
    FlagParser,
    FlagSet,
    GoBool,
    GoDuration,
    assign,
    check_pair,
    csv_list,
    go_bool,
    levenshtein,
    nearest_flag,
)


@dataclass
class Inner:
    names: list[str] = field(default_factory=list)


@dataclass
class Group:
    path: str | None = None
    timeout: float = 1.0
    on: bool = False
    mode: str = "a"
    inner: Inner = field(default_factory=Inner)


@dataclass
class Command:
    group: Group = field(default_factory=Group)


def parser_with_group() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="x")
    flags = FlagSet(parser, "things", "group.")
    flags.add("--thing-path", field="path", help="a path")
    flags.add("--thing-timeout", field="timeout", action=GoDuration, default=1.0, help="a duration")
    flags.add("--thing-on", field="on", action="store_true", help="a switch")
    flags.add("--thing-mode", field="mode", choices=["a", "b"], default="a", help="a choice")
    FlagSet(parser, "things", "group.inner.").add("--thing-names", field="names", type=csv_list, default=[])
    return parser


def test_a_flag_shows_its_pflag_metavar_and_lands_in_its_field() -> None:
    parser = parser_with_group()
    text = parser.format_help()
    assert "--thing-path THING_PATH" in text and "--thing-timeout THING_TIMEOUT" in text
    assert "--thing-mode {a,b}" in text and "--thing-on " in text
    assert "--thing-names THING_NAMES" in text
    assert text.count("things:") == 1  # one section, however many groups fill it
    command = Command()
    assign(command, vars(parser.parse_args(["--thing-path", "p", "--thing-timeout", "1m", "--thing-names", "a, ,b"])))
    assert command.group == Group(path="p", timeout=60.0, on=False, mode="a", inner=Inner(["a", "b"]))


def test_a_duration_is_refused_in_pflags_words(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parser_with_group().parse_args(["--thing-timeout", "5"])
    assert 'invalid argument "5" for "--thing-timeout" flag: time: missing unit in duration "5"' in capsys.readouterr().err


def test_destinations_without_a_group_are_the_commands_and_unknown_fields_are_errors() -> None:
    command = Command()
    assign(command, {"verbosity": 3, "group.mode": "b"})
    assert command.group.mode == "b"
    with pytest.raises(AttributeError, match="Group has no option 'nope'"):
        assign(command, {"group.nope": 1})


@pytest.mark.parametrize(
    ("text", "value"),
    [*((t, True) for t in ("1", "t", "T", "TRUE", "true", "True")), *((f, False) for f in ("0", "f", "F", "FALSE", "false", "False"))],
)
def test_booleans_read_as_go_reads_them(text: str, value: bool) -> None:
    assert go_bool(text) is value


@pytest.mark.parametrize("text", ["yes", "no", "on", "off", "y", "tRUE", " true", ""])
def test_other_spellings_are_refused_in_strconvs_words(text: str) -> None:
    with pytest.raises(ValueError, match=f'^strconv.ParseBool: parsing "{text}": invalid syntax$'):
        go_bool(text)


def strict_parser() -> FlagParser:
    parser = FlagParser(prog="x")
    flags = FlagSet(parser, "things", "group.")
    flags.add("--thing-on", field="on", action=GoBool, help="a switch")
    flags.add("--thing-path", field="path", help="a path")
    parser.add_argument("name", nargs="?")
    return parser


def test_a_boolean_flag_alone_is_true_and_never_takes_the_next_word() -> None:
    args = strict_parser().parse_args(["--thing-on", "word"])
    assert (args.__dict__["group.on"], args.name) == (True, "word")
    args = strict_parser().parse_args(["--thing-on=F", "--", "--thing-on"])
    assert (args.__dict__["group.on"], args.name) == (False, "--thing-on")
    assert "--thing-on  " in strict_parser().format_help() and "[THING_ON]" not in strict_parser().format_help()


def test_a_strict_parser_takes_no_abbreviation() -> None:
    args, unknown = strict_parser().parse_known_args(["--thing-p", "p", "--thing=1"])
    assert unknown == ["--thing-p", "--thing=1"] and args.__dict__["group.path"] is None
    # argparse's default would have taken it
    loose = argparse.ArgumentParser()
    loose.add_argument("--thing-path")
    assert loose.parse_args(["--thing-p", "p"]).thing_path == "p"


@pytest.mark.parametrize(
    ("typed", "suggested"),
    [
        ("--tls-cert", "--tls-cert-file"),  # a prefix
        ("--tls-cert=a.crt", "--tls-cert-file"),
        ("--secure", "--secure-port"),
        ("--apiservice-dir", "--apiservices-dir"),  # one edit
        ("--TLS-CERT-FILES", "--tls-cert-file"),  # case aside, one edit
        ("--tls", "--tls-cert-file"),  # several prefixes: the nearest
        ("--bar", None),  # two edits of three letters is another word
        ("--nothing-like-it", None),
        ("--", None),
    ],
)
def test_the_nearest_flag_is_suggested(typed: str, suggested: str | None) -> None:
    names = ["--tls-cert-file", "--tls-private-key-file", "--secure-port", "--apiservices-dir", "--dir"]
    assert nearest_flag(typed, names) == suggested


def test_levenshtein() -> None:
    assert [levenshtein(a, b) for a, b in [("", "abc"), ("kitten", "sitting"), ("Dir", "dir"), ("ab", "ba")]] == [3, 3, 0, 2]


def test_a_certificate_needs_its_key_and_the_other_way_round() -> None:
    check_pair("--c", None, "--k", None)
    check_pair("--c", "c", "--k", "k")
    with pytest.raises(ConfigError, match=r"^--k: is required when --c is set$"):
        check_pair("--c", "c", "--k", None)
    with pytest.raises(ConfigError, match=r"^--c: is required when --k is set$"):
        check_pair("--c", None, "--k", "k")
