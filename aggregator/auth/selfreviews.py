"""Local mode's `authorization.k8s.io/v1` self reviews, so `kubectl auth can-i` asks the gateway.

kubectl answers `auth can-i VERB RESOURCE` with a POST of a SelfSubjectAccessReview and
`auth can-i --list` with a SelfSubjectRulesReview (`kubectl/pkg/cmd/auth/cani.go`). In kube mode
both go to kube-apiserver like every path the gateway does not serve. In local mode nothing else
could answer them, so the gateway does, from the authorizer that decides its own requests: the
answer is the gateway's decision for those attributes, as the caller (or the user it
impersonates), always-allowed groups and paths included.

kubectl sends them as Kubernetes protobuf (its typed clients do for built-in kinds) and accepts
JSON back; JSON and YAML bodies are read too. Ported from
`pkg/registry/authorization/selfsubjectaccessreview/rest.go` and
`selfsubjectrulesreview/rest.go` with their validation (`ValidateSelfSubjectAccessReview`): a
201 with the review echoed and its `status` filled in; a spec with neither or both attribute
kinds is a 422; a rules review without a namespace is a 400. Not listed in `/apis` discovery:
kubectl calls these paths directly. Field and label selectors in a review are echoed but play no
part in the decision (RBAC ignores them).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import yaml

from aggregator.auth.authz import Authorizer
from aggregator.auth.rbac import PolicyRule, RuleSet
from aggregator.auth.verdict import Decision, Verdict
from aggregator.auth.webhook import ReviewFailed
from aggregator.model import fielderrors as fe
from aggregator.web.context import RequestContext
from aggregator.web.requestinfo import RequestInfo
from aggregator.web.responses import json_response, status_response
from aggregator.web.routing import Route, RouteKind, Router
from aggregator.web.serverrequest import Response
from aggregator.wire import protobuf as pb

GROUP = "authorization.k8s.io"
API_VERSION = f"{GROUP}/v1"
ACCESS_KIND = "SelfSubjectAccessReview"
RULES_KIND = "SelfSubjectRulesReview"
ACCESS_PATH = f"/apis/{API_VERSION}/selfsubjectaccessreviews"
RULES_PATH = f"/apis/{API_VERSION}/selfsubjectrulesreviews"
# kube-apiserver's request body limit (`MaxRequestBodyBytes`, 3 MB).
MAX_BODY = 3 * 1024 * 1024

_RESOURCE_FIELDS = ("namespace", "verb", "group", "version", "resource", "subresource", "name")
_SELECTOR_FIELDS = ("fieldSelector", "labelSelector")
_NON_RESOURCE_FIELDS = ("path", "verb")
_MEDIA_TYPES = ("application/json", "application/yaml", pb.MEDIA_TYPE)


class BadReview(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def _strings_of(attributes: Mapping[str, Any], names: tuple[str, ...], path: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for name in names:
        value = attributes.get(name)
        if value is None:
            continue
        if not isinstance(value, str):
            raise BadReview(400, f"{path}.{name}: expected string")
        if value:
            out[name] = value
    return out


def _go_struct(type_name: str, fields: dict[str, str], order: tuple[str, ...]) -> str:
    """Go's `%#v` of a small attributes struct, as `field.Invalid` prints it."""
    inner = ", ".join(f"{name[0].upper()}{name[1:]}:{fe.go_quote(fields.get(name, ''))}" for name in order)
    return f"authorization.{type_name}{{{inner}}}"


_RESOURCE_PB = dict(enumerate(_RESOURCE_FIELDS, start=1))
_NON_RESOURCE_PB = dict(enumerate(_NON_RESOURCE_FIELDS, start=1))
_SELECTORS_PB = {8: "fieldSelector", 9: "labelSelector"}
_META_PB = {1: "name", 2: "generateName", 3: "namespace", 4: "selfLink", 5: "uid", 6: "resourceVersion"}
_CREATION_TIMESTAMP_PB, _MANAGED_FIELDS_PB = 8, 17


def _metadata_from_protobuf(data: bytes) -> dict[str, Any]:
    """The ObjectMeta fields that are set (Go writes empty strings, a zero generation and an empty
    creationTimestamp for an empty ObjectMeta)."""
    metadata: dict[str, Any] = {}
    for number, _wire, value in pb.fields(data):
        if number == _MANAGED_FIELDS_PB or value in (b"", 0):
            continue  # Go writes every scalar of ObjectMeta, set or not
        name = _META_PB.get(
            number, "creationTimestamp" if number == _CREATION_TIMESTAMP_PB else f"field{number}"
        )
        metadata[name] = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
    return metadata


def _from_protobuf(body: bytes, kind: str) -> dict[str, Any]:
    """A self review in kubectl's encoding, as the JSON document it stands for."""
    api_version, got_kind, raw = pb.unwrap(body)
    top = pb.messages(raw)
    doc: dict[str, Any] = {"kind": got_kind or None, "apiVersion": api_version or None}
    doc["metadata"] = _metadata_from_protobuf(top.get(1, [b""])[-1])
    spec_bytes = top.get(2, [b""])[-1]
    if kind == RULES_KIND:
        doc["spec"] = pb.strings(spec_bytes, {1: "namespace"})
        return doc
    spec: dict[str, Any] = {}
    parts = pb.messages(spec_bytes)
    if 1 in parts:
        resource: dict[str, Any] = pb.strings(parts[1][-1], _RESOURCE_PB)
        selectors = pb.messages(parts[1][-1])
        for number, name in _SELECTORS_PB.items():
            if number in selectors:
                resource[name] = pb.strings(selectors[number][-1], {1: "rawSelector"})
        spec["resourceAttributes"] = resource
    if 2 in parts:
        spec["nonResourceAttributes"] = pb.strings(parts[2][-1], _NON_RESOURCE_PB)
    doc["spec"] = spec
    return doc


def _decode(body: bytes, content_type: str, kind: str) -> Mapping[str, Any]:
    media = content_type.split(";", 1)[0].strip().lower() or "application/json"
    if media not in _MEDIA_TYPES:
        raise BadReview(
            415,
            "the body of the request was in an unknown format - accepted media types include: "
            + ", ".join(_MEDIA_TYPES),
        )
    try:
        if media == pb.MEDIA_TYPE:
            doc = _from_protobuf(body, kind)
        else:
            doc = json.loads(body) if media == "application/json" else yaml.safe_load(body)
    except (ValueError, yaml.YAMLError) as err:
        raise BadReview(400, f"the body of the request could not be decoded: {err}") from err
    if not isinstance(doc, Mapping):
        raise BadReview(400, f"not a {kind}: the body is not an object")
    if doc.get("kind") not in (None, kind) or doc.get("apiVersion") not in (None, API_VERSION):
        raise BadReview(400, f"not a {kind}: {doc.get('apiVersion')}, Kind={doc.get('kind')}")
    return doc


def _empty_metadata(doc: Mapping[str, Any]) -> bool:
    metadata = doc.get("metadata") or {}
    return isinstance(metadata, Mapping) and not any(
        v not in (None, "", {}, []) for k, v in metadata.items() if k != "managedFields"
    )


def _invalid(kind: str, errors: list[str]) -> BadReview:
    return BadReview(422, fe.invalid_object(f"{kind}.{GROUP}", "", errors))


def access_attributes(doc: Mapping[str, Any]) -> tuple[RequestInfo, dict[str, Any]]:
    """The attributes to authorize (`ResourceAttributesFrom` / `NonResourceAttributesFrom`) and
    the spec as it is echoed. Raises BadReview."""
    spec = doc.get("spec") or {}
    if not isinstance(spec, Mapping):
        raise BadReview(400, "spec: expected object")
    resource, non_resource = spec.get("resourceAttributes"), spec.get("nonResourceAttributes")
    for name, value in (("resourceAttributes", resource), ("nonResourceAttributes", non_resource)):
        if value is not None and not isinstance(value, Mapping):
            raise BadReview(400, f"spec.{name}: expected object")
    errors: list[str] = []
    if resource is not None and non_resource is not None:
        shown = _go_struct(
            "NonResourceAttributes", _strings_of(non_resource, _NON_RESOURCE_FIELDS, ""), ("path", "verb")
        )
        errors.append(
            f"spec.nonResourceAttributes: {fe.INVALID}: {shown}: cannot be specified in combination with resourceAttributes"
        )
    if resource is None and non_resource is None:
        errors.append(
            fe.invalid(
                "spec.resourceAttributes",
                "null",
                "exactly one of nonResourceAttributes or resourceAttributes must be specified",
            )
        )
    if not _empty_metadata(doc):
        errors.append(f"metadata: {fe.INVALID}: {json.dumps(doc.get('metadata'))}: must be empty")
    if errors:
        raise _invalid(ACCESS_KIND, errors)
    if resource is not None:
        fields = _strings_of(resource, _RESOURCE_FIELDS, "spec.resourceAttributes")
        echoed: dict[str, Any] = dict(fields)
        echoed.update({k: resource[k] for k in _SELECTOR_FIELDS if resource.get(k)})
        info = RequestInfo(
            is_resource_request=True,
            path="",
            verb=fields.get("verb", ""),
            api_group=fields.get("group", ""),
            api_version=fields.get("version", ""),
            namespace=fields.get("namespace", ""),
            resource=fields.get("resource", ""),
            subresource=fields.get("subresource", ""),
            name=fields.get("name", ""),
        )
        return info, {"resourceAttributes": echoed}
    assert non_resource is not None
    fields = _strings_of(non_resource, _NON_RESOURCE_FIELDS, "spec.nonResourceAttributes")
    info = RequestInfo(is_resource_request=False, path=fields.get("path", ""), verb=fields.get("verb", ""))
    return info, {"nonResourceAttributes": fields}


def _status(verdict: Verdict, evaluation_error: str = "") -> dict[str, Any]:
    """`SubjectAccessReviewStatus`: allowed always, the rest when set."""
    status: dict[str, Any] = {"allowed": verdict.decision is Decision.ALLOW}
    if verdict.decision is Decision.DENY:
        status["denied"] = True
    if verdict.reason:
        status["reason"] = verdict.reason
    error = evaluation_error or verdict.error
    if error:
        status["evaluationError"] = error
    return status


def _rules(rule_set: RuleSet) -> dict[str, Any]:
    """`SubjectRulesReviewStatus`, rules split as `RBACAuthorizer.RulesFor` splits them."""

    def resource_rule(rule: PolicyRule) -> dict[str, Any]:
        out: dict[str, Any] = {"verbs": list(rule.verbs)}
        for key, values in (
            ("apiGroups", rule.api_groups),
            ("resources", rule.resources),
            ("resourceNames", rule.resource_names),
        ):
            if values:
                out[key] = list(values)
        return out

    status: dict[str, Any] = {
        "resourceRules": [resource_rule(r) for r in rule_set.rules if r.resources],
        "nonResourceRules": [
            {"verbs": list(r.verbs), "nonResourceURLs": list(r.non_resource_urls)}
            for r in rule_set.rules
            if r.non_resource_urls
        ],
        "incomplete": rule_set.incomplete,
    }
    if rule_set.error:
        status["evaluationError"] = rule_set.error
    return status


class SelfReviews:
    """The two `authorization.k8s.io/v1` self reviews, answered by `authorizer`."""

    def __init__(self, authorizer: Authorizer) -> None:
        self.authorizer = authorizer

    def install(self, router: Router) -> None:
        router.add_exact(
            ACCESS_PATH, Route(self.serve_access_review, RouteKind.OWN, "selfsubjectaccessreviews")
        )
        router.add_exact(RULES_PATH, Route(self.serve_rules_review, RouteKind.OWN, "selfsubjectrulesreviews"))

    async def _document(self, ctx: RequestContext, kind: str) -> Mapping[str, Any]:
        if ctx.method != "POST":
            raise BadReview(405, "the server does not allow this method on the requested resource")
        length = ctx.headers.get("Content-Length", "")
        if length.isdigit() and int(length) > MAX_BODY:
            raise BadReview(413, "the request body is too large")
        body = bytearray()
        source = ctx.request.body
        while source is not None and (chunk := await source.readany()):
            body += chunk
            if len(body) > MAX_BODY:
                raise BadReview(413, "the request body is too large")
        return _decode(bytes(body), ctx.headers.get("Content-Type", ""), kind)

    async def serve_access_review(self, ctx: RequestContext) -> Response:
        user = ctx.user
        if user is None:
            return status_response(ctx, 400, "no user present on request")
        try:
            info, spec = access_attributes(await self._document(ctx, ACCESS_KIND))
        except BadReview as err:
            return status_response(ctx, err.code, str(err))
        verdict = self.authorizer.decide_now(user, info)
        error = ""
        if verdict is None:
            try:
                verdict = await self.authorizer.review(user, info)
            except ReviewFailed as err:
                verdict, error = Verdict(Decision.NO_OPINION), str(err)
        return json_response(ctx, self._review(ACCESS_KIND, spec, _status(verdict, error)), status=201)

    async def serve_rules_review(self, ctx: RequestContext) -> Response:
        user = ctx.user
        if user is None:
            return status_response(ctx, 400, "no user present on request")
        try:
            doc = await self._document(ctx, RULES_KIND)
        except BadReview as err:
            return status_response(ctx, err.code, str(err))
        spec = doc.get("spec")
        namespace = spec.get("namespace") if isinstance(spec, Mapping) else None
        if not isinstance(namespace, str) or not namespace:
            return status_response(ctx, 400, "no namespace on request")
        rule_set = self.authorizer.rules_for(user, namespace)
        return json_response(ctx, self._review(RULES_KIND, {}, _rules(rule_set)), status=201)

    @staticmethod
    def _review(kind: str, spec: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
        return {
            "kind": kind,
            "apiVersion": API_VERSION,
            "metadata": {"creationTimestamp": None},
            "spec": spec,
            "status": status,
        }
