"""YAML bytes as kube-apiserver writes them (`sigs.k8s.io/yaml.JSONToYAML`, i.e. go-yaml v2).

go-yaml re-reads the JSON into generic maps, so keys come out sorted (by its "natural" key order),
and it double-quotes any string that would otherwise read back as another type (`""`, `"true"`,
`"1"`, timestamps). PyYAML's emitter is a port of the same libyaml emitter, so feeding it the right
key order and quoting style reproduces go-yaml's bytes for the documents we serve.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Any

import yaml

_NULLS = {"", "~", "null", "Null", "NULL"}
_BOOLS = {
    *("y", "Y", "yes", "Yes", "YES", "on", "On", "ON", "true", "True", "TRUE"),
    *("n", "N", "no", "No", "NO", "off", "Off", "OFF", "false", "False", "FALSE"),
}
_FLOAT_SPECIALS = {
    *(".nan", ".NaN", ".NAN", ".inf", ".Inf", ".INF"),
    *("+.inf", "+.Inf", "+.INF", "-.inf", "-.Inf", "-.INF"),
}
_YAML_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")
_GO_INT = re.compile(r"[-+]?(0[bB][01]+|0[oO][0-7]+|0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*)")
_BINARY = re.compile(r"[-+]?0b[01]+")
_BASE60 = re.compile(r"[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?")
_TIMESTAMP = re.compile(
    r"[0-9]{4}-[0-9]{1,2}-[0-9]{1,2}"
    r"(?:(?:[Tt]|[ \t]+)[0-9]{1,2}:[0-9]{1,2}:[0-9]{1,2}(?:\.[0-9]*)?(?:[ \t]*(?:Z|[-+][0-9]{1,2}(?::[0-9]{2})?))?)?"
)


def _resolves_to_non_string(text: str) -> bool:
    """go-yaml v2 `resolve("", text)` yields something other than `!!str` (or a base-60 float)."""
    if text in _NULLS or text in _BOOLS or text in _FLOAT_SPECIALS or text == "<<":
        return True
    if not text or text[0] not in "+-.0123456789":
        return False
    plain = text.replace("_", "")
    if _GO_INT.fullmatch(plain) or _YAML_FLOAT.fullmatch(plain) or _BINARY.fullmatch(plain):
        return True
    return bool(_BASE60.fullmatch(text) or _TIMESTAMP.fullmatch(text))


def _is_letter(ch: str) -> bool:
    return ch.isalpha()


def _key_less(a: str, b: str) -> bool:
    """go-yaml v2 `keyList.Less` for string keys: letters after non-letters, digit runs by value."""
    ar, br = a, b
    for i in range(min(len(ar), len(br))):
        if ar[i] == br[i]:
            continue
        al, bl = _is_letter(ar[i]), _is_letter(br[i])
        if al and bl:
            return ar[i] < br[i]
        if al or bl:
            return bl
        an = bn = 0
        if ar[i] == "0" or br[i] == "0":
            j = i - 1
            while j >= 0 and ar[j].isdigit():
                if ar[j] != "0":
                    an = bn = 1
                    break
                j -= 1
        ai = i
        while ai < len(ar) and ar[ai].isdigit():
            an = an * 10 + int(ar[ai])
            ai += 1
        bi = i
        while bi < len(br) and br[bi].isdigit():
            bn = bn * 10 + int(br[bi])
            bi += 1
        if an != bn:
            return an < bn
        if ai != bi:
            return ai < bi
        return ar[i] < br[i]
    return len(ar) < len(br)


def _key_cmp(a: str, b: str) -> int:
    return -1 if _key_less(a, b) else (1 if _key_less(b, a) else 0)


_KEY_ORDER = functools.cmp_to_key(_key_cmp)


class _GoStr(str):
    """A string the representer must double-quote."""


class _Dumper(yaml.SafeDumper):
    pass


def _represent_str(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    if "\n" in text:
        return dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|")
    if _resolves_to_non_string(text):
        return dumper.represent_scalar("tag:yaml.org,2002:str", text, style='"')
    return dumper.represent_scalar("tag:yaml.org,2002:str", text)


def _represent_dict(dumper: yaml.SafeDumper, data: Mapping[str, Any]) -> yaml.MappingNode:
    items = sorted(data.items(), key=lambda kv: _KEY_ORDER(str(kv[0])))
    return dumper.represent_mapping("tag:yaml.org,2002:map", items)


def _represent_none(dumper: yaml.SafeDumper, _data: None) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:null", "null")


_Dumper.add_representer(str, _represent_str)
_Dumper.add_representer(dict, _represent_dict)
_Dumper.add_representer(type(None), _represent_none)
_Dumper.ignore_aliases = lambda self, data: True  # type: ignore[method-assign]


def go_yaml(obj: Any) -> bytes:
    """The YAML kube-apiserver writes for the JSON document `obj` (dicts, lists, str, int, bool, None)."""
    text = yaml.dump(obj, Dumper=_Dumper, default_flow_style=False, allow_unicode=True, width=80, indent=2)
    return text.encode()
