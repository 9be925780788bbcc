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
from collections.abc import Sequence
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


def go_bool(text: str) -> bool:
    """pflag's boolean values."""
    lowered = text.strip().lower()
    if lowered in ("1", "t", "true", "yes", "y", "on"):
        return True
    if lowered in ("0", "f", "false", "no", "n", "off"):
        return False
    raise argparse.ArgumentTypeError(f"invalid boolean {text!r}")


class GoDuration(argparse.Action):
    """A duration flag read as pflag reads one: Go's `time.ParseDuration`, so a number needs a unit
    (`5s`, `1m30s`; only `0` may go without), and a refusal worded as pflag words it:
    `invalid argument "5" for "--request-timeout" flag: time: missing unit in duration "5"`."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        text = str(values)
        try:
            seconds = parse_go_duration(text)
        except ValueError as err:
            flag = option_string or "/".join(self.option_strings)
            raise argparse.ArgumentError(None, f'invalid argument "{text}" for "{flag}" flag: {err}') from None
        setattr(namespace, self.dest, seconds)


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
        takes_value = action in (None, "store") or isinstance(action, type)
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
