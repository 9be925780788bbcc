"""Command-line flags read as kube-apiserver's pflag reads them, and how a feature's options group
adds its own (k8s.io/apiserver's `XxxOptions.AddFlags`).

Each feature owns a dataclass of its options (`audit/options.py`, `auth/options.py`, ...) with
`add_flags`, `validate` and what the feature builds from it (upstream's `ApplyTo`). A group binds
each flag to one of its fields through a `FlagSet`: the flag's argparse destination is the
group's place in the command's options plus the field (`audit.log_path`), so the parsed flags fill
the groups without a second table naming them (`assign`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

from aggregator.util.durations import parse_go_duration


class ConfigError(Exception):
    """A flag combination that cannot work. `str()` is the one line shown before exiting with code 2."""

    def __init__(self, flag: str, problem: str) -> None:
        super().__init__(f"{flag}: {problem}")
        self.flag = flag
        self.problem = problem


def csv_list(text: str) -> list[str]:
    """A comma-separated flag value (pflag's StringSlice), blanks dropped."""
    return [part.strip() for part in text.split(",") if part.strip()]


# strconv.ParseBool's spellings, the only ones pflag's boolean flags take.
GO_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
GO_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})


def go_bool(text: str) -> bool:
    """Go's `strconv.ParseBool`: `yes`, `on` or ` true` are refused (ValueError in its words)."""
    if text in GO_TRUE:
        return True
    if text in GO_FALSE:
        return False
    raise ValueError(f'strconv.ParseBool: parsing "{text}": invalid syntax')


class GoValue(argparse.Action):
    """A flag whose value is read as pflag reads its type (`convert`), refused in pflag's words
    (`FlagSet.set`): `invalid argument "5" for "--x" flag: <why convert refused it>`."""

    # The value of a text; ValueError (its message is the cause) when it is not one.
    convert: Callable[[str], Any]

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        text = str(values)
        try:
            value = self.convert(text)
        except ValueError as err:
            flag = option_string or "/".join(self.option_strings)
            raise argparse.ArgumentError(None, f'invalid argument "{text}" for "{flag}" flag: {err}') from None
        setattr(namespace, self.dest, value)


class GoBool(GoValue):
    """A boolean flag read as pflag reads one: `--x` alone is true; a value only after `=`
    (`--x=false`), in `strconv.ParseBool`'s spellings; anything else is refused in pflag's words:
    `invalid argument "yes" for "--x" flag: strconv.ParseBool: parsing "yes": invalid syntax`.

    A word after the flag is never its value (`--x false` leaves `false` as an argument, which the
    command refuses), as pflag's `NoOptDefVal` has it: `FlagParser` gives a bare boolean flag its
    `=true` before argparse sees it, so argparse's optional value cannot swallow the next word.
    """

    convert = staticmethod(go_bool)

    def __init__(
        self,
        option_strings: Sequence[str],
        dest: str,
        default: Any = False,
        required: bool = False,
        help: str | None = None,
        metavar: str | None = None,
    ) -> None:
        super().__init__(
            option_strings, dest, nargs="?", const="true", default=default, required=required, help=help,
            metavar=metavar,
        )


class GoDuration(GoValue):
    """A duration flag read as pflag reads one: Go's `time.ParseDuration`, so a number needs a unit
    (`5s`, `1m30s`; only `0` may go without), and a refusal worded as pflag words it:
    `invalid argument "5" for "--request-timeout" flag: time: missing unit in duration "5"`."""

    convert = staticmethod(parse_go_duration)


class FlagHelpFormatter(argparse.HelpFormatter):
    """A boolean flag is shown bare (`--leader-elect`), as pflag's help shows it: its value, if
    any, goes after `=`."""

    def _format_args(self, action: argparse.Action, default_metavar: str) -> str:
        if isinstance(action, GoBool):
            return ""
        return super()._format_args(action, default_metavar)

    def _format_action_invocation(self, action: argparse.Action) -> str:
        if isinstance(action, GoBool):
            return ", ".join(action.option_strings)
        return super()._format_action_invocation(action)


class FlagParser(argparse.ArgumentParser):
    """argparse as strict as pflag: only whole flag names (no `--tls-cert` for `--tls-cert-file`:
    pflag has no abbreviations), and boolean flags (`GoBool`) take a value only after `=`.
    Subcommands get the same class (argparse makes them of their parent's type)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", FlagHelpFormatter)
        super().__init__(*args, **kwargs)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        words = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(bare_booleans_true(self, words), namespace)

    def flag_names(self) -> list[str]:
        """Every long flag of this command, `--help` aside."""
        return sorted(
            name
            for action in self._actions
            for name in action.option_strings
            if name.startswith("--") and name != "--help"
        )


def bare_booleans_true(parser: argparse.ArgumentParser, words: Sequence[str]) -> list[str]:
    """`--flag` -> `--flag=true` for this parser's boolean flags (pflag's `NoOptDefVal`), up to a
    `--`: the word after a boolean flag stays an argument of its own."""
    booleans = {name for action in parser._actions if isinstance(action, GoBool) for name in action.option_strings}
    out: list[str] = []
    for at, word in enumerate(words):
        if word == "--":
            out.extend(words[at:])
            break
        out.append(f"{word}=true" if word in booleans else word)
    return out


# cobra's `SuggestionsMinimumDistance` default: how far a typed name may be from a suggestion.
SUGGESTION_DISTANCE = 2


def levenshtein(a: str, b: str) -> int:
    """Edit distance, case-insensitive (cobra's `ld(s, t, ignoreCase=true)`)."""
    a, b = a.lower(), b.lower()
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        previous, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (ca != cb))
    return row[-1]


def nearest_flag(typed: str, names: Sequence[str]) -> str | None:
    """The flag to suggest for an unknown `typed` (`--tls-cert=x` -> `--tls-cert-file`): cobra's
    rule for a mistyped command (`Command.SuggestionsFor`: within two edits, or `typed` begins it),
    the nearest such name first; an edit may not change half the name (`--bar` is not `--dir`)."""
    word = typed.split("=", 1)[0].lstrip("-")
    if not word:
        return None

    def near(name: str) -> bool:
        distance = levenshtein(word, name.lstrip("-"))
        return (distance <= SUGGESTION_DISTANCE and 2 * distance < len(word)) or name.lstrip("-").lower().startswith(
            word.lower()
        )

    candidates = [name for name in names if near(name)]
    if not candidates:
        return None
    return min(candidates, key=lambda name: (levenshtein(word, name.lstrip("-")), name))


class InvalidOptions(ConfigError):
    """Every problem the flags have, not only the first (k8s.io/apiserver's
    `RecommendedOptions.Validate` gathers them all): `str()` is one line per problem."""

    def __init__(self, errors: Sequence[ConfigError]) -> None:
        first = errors[0]
        super().__init__(first.flag, first.problem)
        self.errors = list(errors)

    def __str__(self) -> str:
        return "\n".join(str(error) for error in self.errors)


class Problems:
    """What one options group's `validate` found: each check adds to it instead of raising."""

    def __init__(self) -> None:
        self.errors: list[ConfigError] = []

    def add(self, flag: str, problem: str) -> None:
        self.errors.append(ConfigError(flag, problem))

    def check(self, check: Callable[..., object], *args: Any, **kwargs: Any) -> None:
        """Run a check that raises ConfigError (`check_readable`...), keeping what it says."""
        try:
            check(*args, **kwargs)
        except ConfigError as err:
            self.errors.append(err)


def check_readable(flag: str, path: str | None) -> None:
    """ConfigError unless `path` (when given) can be opened and read."""
    if path is None:
        return
    try:
        with open(path, "rb") as handle:
            handle.read(1)
    except OSError as err:
        raise ConfigError(flag, f"cannot read {path}: {err.strerror or err}") from err


def check_pair(cert_flag: str, cert: str | None, key_flag: str, key: str | None) -> None:
    """ConfigError when only one of a certificate and its key is given."""
    if cert and not key:
        raise ConfigError(key_flag, f"is required when {cert_flag} is set")
    if key and not cert:
        raise ConfigError(cert_flag, f"is required when {key_flag} is set")


def section(parser: argparse.ArgumentParser, title: str) -> argparse._ArgumentGroup:
    """The help section titled `title`, created on first use: groups may share one (the shutdown
    flags sit with secure serving, as kube-apiserver's --help shows them)."""
    for group in parser._action_groups:
        if group.title == title:
            return group
    return parser.add_argument_group(title)


class FlagSet:
    """Where an options group adds its flags: a help section, and the destination prefix that
    names the group's place in the command's options (`audit.`)."""

    def __init__(self, parser: argparse.ArgumentParser, title: str, prefix: str) -> None:
        self.parser = parser
        self.section = section(parser, title)
        self.prefix = prefix

    def titled(self, title: str) -> FlagSet:
        """The same group's flags under another help section."""
        return FlagSet(self.parser, title, self.prefix)

    def add(self, *names: str, field: str, **kwargs: Any) -> argparse.Action:
        """`add_argument` bound to `field`. The usage shows the metavar pflag users know (the
        long flag's name) or the choices, not the destination."""
        kwargs["dest"] = self.prefix + field
        action = kwargs.get("action")
        takes_value = action in (None, "store") or (isinstance(action, type) and not issubclass(action, GoBool))
        if "metavar" not in kwargs and "choices" not in kwargs and takes_value:
            long_name = next(n for n in names if n.startswith("--"))
            kwargs["metavar"] = long_name[2:].replace("-", "_").upper()
        return self.section.add_argument(*names, **kwargs)


def assign(target: object, values: dict[str, Any]) -> None:
    """Set each `group.field` (or `group.sub.field`) destination in `values` on `target`;
    destinations without a dot belong to the command, not to an options group."""
    for dest, value in values.items():
        if "." not in dest:
            continue
        *path, name = dest.split(".")
        owner = target
        for part in path:
            owner = getattr(owner, part)
        if not hasattr(owner, name):
            raise AttributeError(f"{type(owner).__name__} has no option {name!r} (flag destination {dest})")
        setattr(owner, name, value)
