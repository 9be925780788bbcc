"""Strict field access for decoded manifests: a wrong type is an error that names the field.

Go's JSON decoder refuses `port: "443"` for an int32; we do the same instead of guessing.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

T = TypeVar("T")


class DecodeError(ValueError):
    """An object whose fields have the wrong types; the message names the field."""


_TYPE_NAMES = {bool: "boolean", int: "integer", str: "string", dict: "object", list: "array"}


def field(obj: Mapping[str, Any], key: str, kind: type, path: str, default: Any = None) -> Any:
    value = obj.get(key, default)
    if value is None:
        return default
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise DecodeError(f"{path}: expected {_TYPE_NAMES[int]}, got {type(value).__name__} {value!r}")
    if kind is not int and not isinstance(value, kind):
        raise DecodeError(
            f"{path}: expected {_TYPE_NAMES.get(kind, kind.__name__)}, got {type(value).__name__}"
        )
    return value


def shared(text: str) -> str:
    """One copy per process of a string many objects repeat (a namespace, an address, a port's
    name, a Service's name in its Service, its EndpointSlices and its APIServices). At 5000
    APIServices each such field held its own copy, in the control and again in each worker, whose
    first state pickles an object once however many hold it (about 4 MiB a process)."""
    return sys.intern(text)


def mapping(obj: Mapping[str, Any], key: str, path: str) -> Mapping[str, Any]:
    value: Mapping[str, Any] = field(obj, key, dict, path, {})
    return value


def sequence(obj: Mapping[str, Any], key: str, path: str) -> list[Any]:
    value: list[Any] = field(obj, key, list, path, [])
    return value


def each(obj: Mapping[str, Any], key: str, path: str, decode: Callable[[Any, str], T]) -> tuple[T, ...]:
    """Every item of the list at `key`, each decoded with its own path (`rules[2]`), so an error
    names the item as kube-apiserver's decoder does."""
    return tuple(decode(item, f"{path}[{i}]") for i, item in enumerate(sequence(obj, key, path)))


def int32(obj: Mapping[str, Any], key: str, path: str, default: int | None = None) -> int | None:
    value: int | None = field(obj, key, int, path, default)
    if value is not None and not -(2**31) <= value < 2**31:
        raise DecodeError(f"{path}: {value} overflows int32")
    return value
