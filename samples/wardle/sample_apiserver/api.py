"""The wardle.example.com API: resource types, versions, conversion, defaulting and validation.

Mirrors upstream's sample-apiserver (`k8s.io/sample-apiserver/pkg/apis/wardle`): objects are stored
in the internal form (v1beta1's Flunder spec: `flunderReference` / `fischerReference` /
`referenceType`) and converted to the requested version on the way out, so a Flunder created
through v1alpha1 (`reference` + `referenceType`) reads back through v1beta1 and vice versa.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aggregator.model.fielderrors import go_quote

GROUP = "wardle.example.com"
# Upstream's install.go: v1beta1 is preferred over v1alpha1.
VERSIONS = ("v1beta1", "v1alpha1")
PREFERRED_VERSION = "v1beta1"

FLUNDER_REFERENCE = "Flunder"
FISCHER_REFERENCE = "Fischer"

JSON = dict[str, Any]


@dataclass(frozen=True)
class FieldError:
    """One apimachinery `field.Error`: renders as `<path>: <Type>[: <value>][: <detail>]`."""

    path: str
    type: str  # "Invalid value", "Required value", ...
    detail: str
    value: Any = None
    has_value: bool = False
    quote: bool = True  # Go's %q for strings; False prints the value as given (e.g. `0x0`)

    @property
    def reason(self) -> str:
        return {
            "Invalid value": "FieldValueInvalid",
            "Required value": "FieldValueRequired",
            "Forbidden": "FieldValueForbidden",
            "Unsupported value": "FieldValueNotSupported",
            "Duplicate value": "FieldValueDuplicate",
            "Too long": "FieldValueTooLong",
        }.get(self.type, "FieldValueInvalid")

    @property
    def body(self) -> str:
        """`ErrorBody()`: the message without the field path."""
        text = self.type
        if self.has_value:
            if isinstance(self.value, str):
                value = go_quote(self.value) if self.quote else self.value
            else:
                value = str(self.value)
            text += f": {value}"
        if self.detail:
            text += f": {self.detail}"
        return text

    def __str__(self) -> str:
        return f"{self.path}: {self.body}"


def invalid(path: str, value: Any, detail: str) -> FieldError:
    return FieldError(path, "Invalid value", detail, value, True)


def required(path: str, detail: str = "") -> FieldError:
    return FieldError(path, "Required value", detail)


@dataclass(frozen=True)
class Column:
    """A Table column: header definition plus how to compute the cell from a versioned object."""

    name: str
    type: str
    description: str
    cell: Callable[[JSON], Any]
    format: str = ""
    priority: int = 0


@dataclass(frozen=True)
class ResourceType:
    """One resource of the group, with everything discovery, storage and Table output need."""

    plural: str
    singular: str
    kind: str
    namespaced: bool
    versions: tuple[str, ...]
    short_names: tuple[str, ...]
    categories: tuple[str, ...]
    verbs: tuple[str, ...] = (
        "create",
        "delete",
        "deletecollection",
        "get",
        "list",
        "patch",
        "update",
        "watch",
    )

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    @property
    def qualified(self) -> str:
        """`flunders.wardle.example.com`, as upstream error messages name a resource."""
        return f"{self.plural}.{GROUP}"

    def to_version(self, internal: JSON, version: str) -> JSON:
        """The stored object as the client of `version` sees it (kind and apiVersion first)."""
        out: JSON = {"kind": self.kind, "apiVersion": f"{GROUP}/{version}"}
        out["metadata"] = copy.deepcopy(internal.get("metadata", {}))
        if self.kind == "Flunder":
            out["spec"] = _flunder_spec_to_version(internal.get("spec", {}), version)
            out["status"] = copy.deepcopy(internal.get("status", {}))
        else:
            for key, value in internal.items():
                if key != "metadata":
                    out[key] = copy.deepcopy(value)
        return out

    def from_version(self, versioned: JSON, version: str) -> JSON:
        """Default and convert a client's object to the stored form (drops kind/apiVersion)."""
        internal: JSON = {"metadata": copy.deepcopy(versioned.get("metadata") or {})}
        if self.kind == "Flunder":
            internal["spec"] = _flunder_spec_from_version(versioned.get("spec") or {}, version)
            internal["status"] = copy.deepcopy(versioned.get("status") or {})
        else:
            disallowed = versioned.get("disallowedFlunders")
            if disallowed:
                internal["disallowedFlunders"] = list(disallowed)
        return internal

    def validate(self, internal: JSON) -> list[FieldError]:
        """The type's own validation (upstream `validation.ValidateFlunder`; Fischers have none)."""
        if self.kind == "Flunder":
            return validate_flunder_spec(internal.get("spec", {}), "spec")
        if self.kind == "Fischer":
            errors = []
            for i, name in enumerate(internal.get("disallowedFlunders", [])):
                if not isinstance(name, str):
                    errors.append(invalid(f"disallowedFlunders[{i}]", name, "must be a string"))
            return errors
        return []

    def columns(self) -> list[Column]:
        return [NAME_COLUMN, AGE_COLUMN, *EXTRA_COLUMNS.get(self.kind, [])]


def _flunder_spec_to_version(spec: JSON, version: str) -> JSON:
    if version == "v1beta1":
        return {k: spec[k] for k in ("flunderReference", "fischerReference", "referenceType") if spec.get(k)}
    # Upstream Convert_wardle_FlunderSpec_To_v1alpha1_FlunderSpec.
    out: JSON = {}
    ref_type = spec.get("referenceType")
    if ref_type == FLUNDER_REFERENCE:
        if spec.get("flunderReference"):
            out["reference"] = spec["flunderReference"]
        out["referenceType"] = FLUNDER_REFERENCE
    elif ref_type == FISCHER_REFERENCE:
        if spec.get("fischerReference"):
            out["reference"] = spec["fischerReference"]
        out["referenceType"] = FISCHER_REFERENCE
    return out


def _flunder_spec_from_version(spec: JSON, version: str) -> JSON:
    if version == "v1beta1":
        return {
            k: spec[k]
            for k in ("flunderReference", "fischerReference", "referenceType")
            if spec.get(k) not in (None, "")
        }
    # Upstream SetDefaults_FlunderSpec, then Convert_v1alpha1_FlunderSpec_To_wardle_FlunderSpec:
    # a referenceType other than Flunder/Fischer is dropped by the conversion.
    reference = spec.get("reference") or ""
    ref_type = spec.get("referenceType") or ""
    if not ref_type and reference:
        ref_type = FLUNDER_REFERENCE
    out: JSON = {}
    if ref_type == FLUNDER_REFERENCE:
        out["referenceType"] = FLUNDER_REFERENCE
        if reference:
            out["flunderReference"] = reference
    elif ref_type == FISCHER_REFERENCE:
        out["referenceType"] = FISCHER_REFERENCE
        if reference:
            out["fischerReference"] = reference
    return out


def validate_flunder_spec(spec: JSON, path: str) -> list[FieldError]:
    """Upstream `ValidateFlunderSpec`, same checks in the same order, same wording."""
    errors: list[FieldError] = []
    flunder_ref = spec.get("flunderReference") or ""
    fischer_ref = spec.get("fischerReference") or ""
    ref_type = spec.get("referenceType") or ""
    if flunder_ref and fischer_ref:
        errors.append(
            invalid(
                f"{path}.fischerReference",
                fischer_ref,
                "cannot be set with flunderReference at the same time",
            )
        )
    elif flunder_ref and ref_type != FLUNDER_REFERENCE:
        errors.append(
            invalid(f"{path}.flunderReference", flunder_ref, "cannot be set if referenceType is not Flunder")
        )
    elif fischer_ref and ref_type != FISCHER_REFERENCE:
        errors.append(
            invalid(f"{path}.fischerReference", fischer_ref, "cannot be set if referenceType is not Fischer")
        )
    elif not fischer_ref and ref_type == FISCHER_REFERENCE:
        errors.append(required(f"{path}.fischerReference", "cannot be empty if referenceType is Fischer"))
    elif not flunder_ref and ref_type == FLUNDER_REFERENCE:
        errors.append(required(f"{path}.flunderReference", "cannot be empty if referenceType is Flunder"))
    if ref_type and ref_type not in (FISCHER_REFERENCE, FLUNDER_REFERENCE):
        errors.append(invalid(f"{path}.referenceType", ref_type, "must be Flunder or Fischer"))
    return errors


# --- Table columns ---------------------------------------------------------------------------------

NAME_DESCRIPTION = (
    "Name must be unique within a namespace. Is required when creating resources, although some "
    "resources may allow a client to request the generation of an appropriate name automatically. "
    "Name is primarily intended for creation idempotence and configuration definition. Cannot be "
    "updated. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names"
)
CREATION_TIMESTAMP_DESCRIPTION = (
    "CreationTimestamp is a timestamp representing the server time when this object was created. "
    "It is not guaranteed to be set in happens-before order across separate operations. Clients may "
    "not set this value. It is represented in RFC3339 form and is in UTC.\n\nPopulated by the system. "
    "Read-only. Null for lists. More info: "
    "https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata"
)

# The age cell is computed when the Table is rendered (see table.py); this marker names the column.
AGE_CELL = "creationTimestamp"

NAME_COLUMN = Column(
    "Name", "string", NAME_DESCRIPTION, lambda obj: obj["metadata"].get("name", ""), format="name"
)
AGE_COLUMN = Column(
    "Age", "date", CREATION_TIMESTAMP_DESCRIPTION, lambda obj: obj["metadata"].get("creationTimestamp")
)


def _flunder_reference(obj: JSON) -> str | None:
    spec = obj.get("spec") or {}
    value = spec.get("reference") or spec.get("flunderReference") or spec.get("fischerReference")
    return str(value) if value else None


def _reference_type(obj: JSON) -> str | None:
    value = (obj.get("spec") or {}).get("referenceType")
    return str(value) if value else None


def _disallowed(obj: JSON) -> str | None:
    names = obj.get("disallowedFlunders") or []
    return ",".join(str(n) for n in names) if names else None


EXTRA_COLUMNS: dict[str, list[Column]] = {
    "Flunder": [
        Column(
            "Reference Type", "string", "The reference type: Flunder or Fischer.", _reference_type, priority=1
        ),
        Column(
            "Reference",
            "string",
            "The name of the referenced flunder or fischer.",
            _flunder_reference,
            priority=1,
        ),
    ],
    "Fischer": [
        Column(
            "Disallowed Flunders",
            "string",
            "Names of flunders that may not be created while this fischer exists.",
            _disallowed,
            priority=1,
        ),
    ],
}

# --- the group -------------------------------------------------------------------------------------

FLUNDERS = ResourceType(
    plural="flunders",
    singular="flunder",
    kind="Flunder",
    namespaced=True,
    versions=("v1alpha1", "v1beta1"),
    short_names=("fl",),
    categories=("all", "wardle"),
)
FISCHERS = ResourceType(
    plural="fischers",
    singular="fischer",
    kind="Fischer",
    namespaced=False,
    versions=("v1alpha1",),
    short_names=("fi",),
    categories=("wardle",),
)
RESOURCES: tuple[ResourceType, ...] = (FISCHERS, FLUNDERS)


def resources_in(version: str) -> list[ResourceType]:
    """Resources served by `version`, sorted by plural name as apiserver discovery lists them."""
    return sorted((r for r in RESOURCES if version in r.versions), key=lambda r: r.plural)


def resource_for(version: str, plural: str) -> ResourceType | None:
    for resource in RESOURCES:
        if resource.plural == plural and version in resource.versions:
            return resource
    return None
