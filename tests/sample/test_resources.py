"""CRUD, patch, conversion between versions, conflicts and validation, as kubectl and clients see them."""

from __future__ import annotations

from typing import Any

from tests.sample.conftest import Client

G = "/apis/wardle.example.com"
BETA = f"{G}/v1beta1/namespaces/default/flunders"
ALPHA = f"{G}/v1alpha1/namespaces/default/flunders"
FISCHERS = f"{G}/v1alpha1/fischers"


def flunder(name: str, spec: dict[str, Any] | None = None, **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": "wardle.example.com/v1beta1",
        "kind": "Flunder",
        "metadata": {"name": name, **meta},
        "spec": spec or {},
    }


async def create(client: Client, body: dict[str, Any], path: str = BETA, **kw: Any) -> dict[str, Any]:
    status, _, obj, raw = await client.request("POST", path, body=body, **kw)
    assert status == 201, raw
    assert isinstance(obj, dict)
    return obj


async def test_create_get_list_delete(admin: Client) -> None:
    created = await create(
        admin, flunder("a", {"referenceType": "Fischer", "fischerReference": "fred"}, labels={"app": "x"})
    )
    meta = created["metadata"]
    assert list(created) == ["kind", "apiVersion", "metadata", "spec", "status"]
    assert list(meta) == [
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "labels",
    ]
    assert meta["namespace"] == "default" and meta["generation"] == 1
    assert created["spec"] == {"fischerReference": "fred", "referenceType": "Fischer"}
    assert created["status"] == {}

    status, _, got, _ = await admin.get(f"{BETA}/a")
    assert (status, got) == (200, created)

    await create(admin, flunder("b"))
    status, _, listed, _ = await admin.get(BETA)
    assert listed["kind"] == "FlunderList" and listed["apiVersion"] == "wardle.example.com/v1beta1"
    assert [i["metadata"]["name"] for i in listed["items"]] == ["a", "b"]
    assert int(listed["metadata"]["resourceVersion"]) >= int(meta["resourceVersion"])
    status, _, all_ns, _ = await admin.get(f"{G}/v1beta1/flunders")
    assert [i["metadata"]["name"] for i in all_ns["items"]] == ["a", "b"]
    status, _, other_ns, _ = await admin.get(f"{G}/v1beta1/namespaces/other/flunders")
    assert other_ns["items"] == []

    status, _, deleted, _ = await admin.request("DELETE", f"{BETA}/a")
    assert status == 200
    assert deleted == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": {"name": "a", "group": "wardle.example.com", "kind": "flunders", "uid": meta["uid"]},
    }
    status, _, body, _ = await admin.get(f"{BETA}/a")
    assert status == 404
    assert body == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'flunders.wardle.example.com "a" not found',
        "reason": "NotFound",
        "details": {"name": "a", "group": "wardle.example.com", "kind": "flunders"},
        "code": 404,
    }


async def test_versions_convert_both_ways(admin: Client) -> None:
    """v1alpha1 `reference` (defaulted to type Flunder) is v1beta1's `flunderReference`, and back."""
    alpha = {
        "apiVersion": "wardle.example.com/v1alpha1",
        "kind": "Flunder",
        "metadata": {"name": "c"},
        "spec": {"reference": "a"},
    }
    created = await create(admin, alpha, ALPHA)
    assert created["apiVersion"] == "wardle.example.com/v1alpha1"
    assert created["spec"] == {"reference": "a", "referenceType": "Flunder"}
    _, _, beta, _ = await admin.get(f"{BETA}/c")
    assert beta["apiVersion"] == "wardle.example.com/v1beta1"
    assert beta["spec"] == {"flunderReference": "a", "referenceType": "Flunder"}
    await create(admin, flunder("d", {"referenceType": "Fischer", "fischerReference": "fred"}))
    _, _, as_alpha, _ = await admin.get(f"{ALPHA}/d")
    assert as_alpha["spec"] == {"reference": "fred", "referenceType": "Fischer"}
    # A v1alpha1 body posted to the v1beta1 endpoint is converted too.
    alpha["metadata"] = {"name": "e"}
    created = await create(admin, alpha, BETA)
    assert created["apiVersion"] == "wardle.example.com/v1beta1"
    assert created["spec"] == {"flunderReference": "a", "referenceType": "Flunder"}


async def test_already_exists_and_namespace_mismatch(admin: Client) -> None:
    await create(admin, flunder("a"))
    status, _, body, _ = await admin.request("POST", BETA, body=flunder("a"))
    assert status == 409
    assert body["reason"] == "AlreadyExists"
    assert body["message"] == 'flunders.wardle.example.com "a" already exists'
    status, _, body, _ = await admin.request("POST", BETA, body=flunder("z", namespace="other"))
    assert status == 400
    assert (
        body["message"]
        == "the namespace of the provided object does not match the namespace sent on the request"
    )


async def test_validation_errors_are_422_with_causes(admin: Client) -> None:
    status, _, body, _ = await admin.request(
        "POST", BETA, body=flunder("v", {"referenceType": "Fischer", "flunderReference": "x"})
    )
    assert status == 422
    assert body["reason"] == "Invalid"
    assert body["message"] == (
        'Flunder.wardle.example.com "v" is invalid: spec.flunderReference: Invalid value: "x": '
        "cannot be set if referenceType is not Flunder"
    )
    assert body["details"] == {
        "name": "v",
        "group": "wardle.example.com",
        "kind": "Flunder",
        "causes": [
            {
                "reason": "FieldValueInvalid",
                "message": 'Invalid value: "x": cannot be set if referenceType is not Flunder',
                "field": "spec.flunderReference",
            }
        ],
    }
    status, _, body, _ = await admin.request("POST", BETA, body=flunder("v", {"referenceType": "Other"}))
    assert (
        body["message"]
        == 'Flunder.wardle.example.com "v" is invalid: spec.referenceType: Invalid value: "Other": must be Flunder or Fischer'
    )
    status, _, body, _ = await admin.request("POST", BETA, body={"kind": "Flunder", "metadata": {}})
    assert status == 422
    assert (
        body["message"]
        == 'Flunder.wardle.example.com "" is invalid: metadata.name: Required value: name or generateName is required'
    )
    status, _, body, _ = await admin.request("POST", BETA, body=flunder("a%b"))
    assert (
        body["message"]
        == 'Flunder.wardle.example.com "a%b" is invalid: metadata.name: Invalid value: "a%b": may not contain \'%\''
    )


async def test_generate_name(admin: Client) -> None:
    created = await create(admin, {"kind": "Flunder", "metadata": {"generateName": "gen-"}})
    name = created["metadata"]["name"]
    assert name.startswith("gen-") and len(name) == 9
    assert created["metadata"]["generateName"] == "gen-"


async def test_field_validation_strict_warn_ignore(admin: Client) -> None:
    body = flunder("s", {"colour": "red"})
    body["extra"] = 1
    status, _, err, _ = await admin.request("POST", BETA, body=body, params={"fieldValidation": "Strict"})
    assert status == 400
    assert err["reason"] == "BadRequest"
    assert err["message"] == (
        'Flunder in version "v1beta1" cannot be handled as a Flunder: strict decoding error: '
        'unknown field "spec.colour", unknown field "extra"'  # in document order
    )
    status, _headers, obj, _ = await admin.request("POST", BETA, body=body)  # default is Warn
    assert status == 201
    assert obj["spec"] == {} and "extra" not in obj
    # Both warnings arrive (aiohttp folds repeated headers in dict(); check the raw list instead).
    status, _, obj, _ = await admin.request(
        "POST", BETA, body=flunder("i", {"colour": "red"}), params={"fieldValidation": "Ignore"}
    )
    assert status == 201
    raw = b'{"kind":"Flunder","metadata":{"name":"dup","name":"dup2"}}'
    status, _, err, _ = await admin.request("POST", BETA, body=raw, params={"fieldValidation": "Strict"})
    assert status == 400 and err["message"].endswith('strict decoding error: duplicate field "metadata.name"')
    status, _, err, _ = await admin.request(
        "POST", BETA, body=flunder("x"), params={"fieldValidation": "Sometimes"}
    )
    assert status == 422
    assert err["message"] == (
        'CreateOptions.meta.k8s.io "" is invalid: fieldValidation: Unsupported value: "Sometimes": '
        'supported values: "Ignore", "Warn", "Strict"'
    )


async def test_warning_headers(admin: Client) -> None:
    async with admin.session.post(
        admin.url + BETA,
        json=flunder("w", {"colour": "red", "size": 1}),
        headers=admin.headers,
        ssl=admin.ssl,
    ) as response:
        assert response.status == 201
        assert response.headers.getall("Warning") == [
            '299 - "unknown field \\"spec.colour\\""',
            '299 - "unknown field \\"spec.size\\""',
        ]


async def test_type_errors_are_400(admin: Client) -> None:
    status, _, err, _ = await admin.request("POST", BETA, body=flunder("t", {"referenceType": 5}))
    assert status == 400
    assert err["message"] == (
        'Flunder in version "v1beta1" cannot be handled as a Flunder: json: cannot unmarshal number into Go '
        "struct field Flunder.spec.referenceType of type string"
    )
    status, _, err, _ = await admin.request("POST", BETA, body=b"{not json")
    assert status == 400
    status, _, err, _ = await admin.request("POST", BETA, body=b"x", content_type="text/plain")
    assert status == 415 and err["reason"] == "UnsupportedMediaType"


async def test_update_requires_and_checks_resource_version(admin: Client) -> None:
    created = await create(admin, flunder("u"))
    update = dict(created, spec={"referenceType": "Flunder", "flunderReference": "a"})
    status, _, updated, _ = await admin.request("PUT", f"{BETA}/u", body=update)
    assert status == 200
    assert updated["spec"]["flunderReference"] == "a"
    assert updated["metadata"]["generation"] == 2
    assert int(updated["metadata"]["resourceVersion"]) > int(created["metadata"]["resourceVersion"])
    assert updated["metadata"]["uid"] == created["metadata"]["uid"]
    # stale resourceVersion
    status, _, err, _ = await admin.request("PUT", f"{BETA}/u", body=update)
    assert status == 409
    assert err["reason"] == "Conflict"
    assert err["message"] == (
        'Operation cannot be fulfilled on flunders.wardle.example.com "u": the object has been modified; '
        "please apply your changes to the latest version and try again"
    )
    # no resourceVersion: sample-apiserver does not allow unconditional updates
    no_rv = dict(update, metadata={"name": "u"})
    status, _, err, _ = await admin.request("PUT", f"{BETA}/u", body=no_rv)
    assert status == 422
    assert err["message"] == (
        'Flunder.wardle.example.com "u" is invalid: metadata.resourceVersion: Invalid value: 0x0: '
        "must be specified for an update"
    )
    # metadata-only change keeps the generation; a no-op update keeps the resourceVersion
    labelled = dict(updated, metadata={**updated["metadata"], "labels": {"k": "v"}})
    status, _, relabelled, _ = await admin.request("PUT", f"{BETA}/u", body=labelled)
    assert relabelled["metadata"]["generation"] == 2
    status, _, same, _ = await admin.request("PUT", f"{BETA}/u", body=relabelled)
    assert same["metadata"]["resourceVersion"] == relabelled["metadata"]["resourceVersion"]
    # name mismatch, missing object
    status, _, err, _ = await admin.request("PUT", f"{BETA}/other", body=relabelled)
    assert (
        status == 400
        and err["message"] == "the name of the object (u) does not match the name on the URL (other)"
    )
    status, _, err, _ = await admin.request(
        "PUT", f"{BETA}/gone", body=dict(relabelled, metadata={"name": "gone", "resourceVersion": "1"})
    )
    assert status == 404


async def test_patch_types(admin: Client) -> None:
    await create(admin, flunder("p", labels={"a": "1"}))
    status, _, obj, _ = await admin.request(
        "PATCH",
        f"{BETA}/p",
        body={"spec": {"referenceType": "Fischer", "fischerReference": "f"}},
        content_type="application/strategic-merge-patch+json",
    )
    assert status == 200 and obj["spec"] == {"fischerReference": "f", "referenceType": "Fischer"}
    status, _, obj, _ = await admin.request(
        "PATCH",
        f"{BETA}/p",
        body={"metadata": {"labels": {"a": None, "b": "2"}}},
        content_type="application/merge-patch+json",
    )
    assert obj["metadata"]["labels"] == {"b": "2"}
    status, _, obj, _ = await admin.request(
        "PATCH",
        f"{BETA}/p",
        body=[
            {"op": "replace", "path": "/spec/fischerReference", "value": "g"},
            {"op": "add", "path": "/metadata/labels/c", "value": "3"},
        ],
        content_type="application/json-patch+json",
    )
    assert obj["spec"]["fischerReference"] == "g" and obj["metadata"]["labels"] == {"b": "2", "c": "3"}
    status, _, err, _ = await admin.request(
        "PATCH",
        f"{BETA}/p",
        body=[{"op": "test", "path": "/spec/fischerReference", "value": "nope"}],
        content_type="application/json-patch+json",
    )
    assert (
        status == 422
        and err["details"]["causes"][0]["message"]
        == "testing value /spec/fischerReference failed: test failed"
    )
    # a patch carrying a stale resourceVersion conflicts
    status, _, err, _ = await admin.request(
        "PATCH",
        f"{BETA}/p",
        body={"metadata": {"resourceVersion": "1"}},
        content_type="application/merge-patch+json",
    )
    assert status == 409 and err["reason"] == "Conflict"
    # validation runs on the patched object
    status, _, err, _ = await admin.request(
        "PATCH",
        f"{BETA}/p",
        body={"spec": {"referenceType": "Flunder"}},
        content_type="application/merge-patch+json",
    )
    assert status == 422
    status, _, err, _ = await admin.request(
        "PATCH",
        f"{BETA}/p",
        body={"spec": {"x": 1}},
        content_type="application/merge-patch+json",
        params={"fieldValidation": "Strict"},
    )
    assert status == 400 and err["message"] == 'strict decoding error: unknown field "spec.x"'
    status, _, err, _ = await admin.request(
        "PATCH", f"{BETA}/missing", body={}, content_type="application/merge-patch+json"
    )
    assert status == 404
    status, _, err, _ = await admin.request("PATCH", f"{BETA}/p", body={}, content_type="application/json")
    assert status == 415


async def test_server_side_apply_creates_then_merges(admin: Client) -> None:
    applied = "apiVersion: wardle.example.com/v1beta1\nkind: Flunder\nmetadata:\n  name: ap\nspec:\n  referenceType: Flunder\n  flunderReference: x\n"
    status, _, err, _ = await admin.request(
        "PATCH", f"{BETA}/ap", body=applied, content_type="application/apply-patch+yaml"
    )
    assert status == 422
    assert (
        err["message"]
        == 'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: is required for apply patch'
    )
    params = {"fieldManager": "me"}
    status, _, obj, _ = await admin.request(
        "PATCH", f"{BETA}/ap", body=applied, content_type="application/apply-patch+yaml", params=params
    )
    assert status == 201 and obj["spec"]["flunderReference"] == "x"
    status, _, obj, _ = await admin.request(
        "PATCH",
        f"{BETA}/ap",
        body=applied.replace("x\n", "y\n"),
        content_type="application/apply-patch+yaml",
        params=params,
    )
    assert status == 200 and obj["spec"]["flunderReference"] == "y"


async def test_finalizers_delay_deletion(admin: Client) -> None:
    created = await create(admin, flunder("fin", finalizers=["example.com/hold"]))
    status, _, obj, _ = await admin.request("DELETE", f"{BETA}/fin")
    assert status == 200
    assert obj["kind"] == "Flunder" and obj["metadata"]["deletionTimestamp"]
    assert obj["metadata"]["deletionGracePeriodSeconds"] == 0
    status, _, _err, _ = await admin.request(
        "PATCH",
        f"{BETA}/fin",
        body={"metadata": {"finalizers": ["example.com/hold", "new"]}},
        content_type="application/merge-patch+json",
    )
    assert status == 422
    status, _, obj, _ = await admin.request(
        "PATCH",
        f"{BETA}/fin",
        body={"metadata": {"finalizers": None}},
        content_type="application/merge-patch+json",
    )
    assert status == 200
    status, _, _, _ = await admin.get(f"{BETA}/fin")
    assert status == 404
    assert created["metadata"]["uid"] == obj["metadata"]["uid"]


async def test_delete_preconditions_and_collection(admin: Client) -> None:
    a = await create(admin, flunder("a", labels={"team": "x"}))
    await create(admin, flunder("b", labels={"team": "y"}))
    await create(admin, flunder("c"))
    status, _, err, _ = await admin.request("DELETE", f"{BETA}/a", body={"preconditions": {"uid": "other"}})
    assert status == 409
    assert err["message"] == (
        'Operation cannot be fulfilled on flunders.wardle.example.com "a": Precondition failed: '
        f"UID in precondition: other, UID in object meta: {a['metadata']['uid']}"
    )
    status, _, body, _ = await admin.request("DELETE", BETA, params={"labelSelector": "team"})
    assert status == 200 and body["kind"] == "FlunderList"
    assert [i["metadata"]["name"] for i in body["items"]] == ["a", "b"]
    _, _, listed, _ = await admin.get(BETA)
    assert [i["metadata"]["name"] for i in listed["items"]] == ["c"]
    status, _, _, _ = await admin.request("DELETE", BETA, params={"dryRun": "All"})
    _, _, listed, _ = await admin.get(BETA)
    assert len(listed["items"]) == 1


async def test_selectors_and_paging(admin: Client) -> None:
    for i, team in enumerate(["x", "y", "x", "z"]):
        await create(admin, flunder(f"f{i}", labels={"team": team, "n": str(i)}))

    async def names(**params: str) -> list[str]:
        status, _, body, raw = await admin.get(BETA, params=params)
        assert status == 200, raw
        return [i["metadata"]["name"] for i in body["items"]]

    assert await names(labelSelector="team=x") == ["f0", "f2"]
    assert await names(labelSelector="team!=x") == ["f1", "f3"]
    assert await names(labelSelector="team in (y,z)") == ["f1", "f3"]
    assert await names(labelSelector="team notin (y,z),n") == ["f0", "f2"]
    assert await names(labelSelector="!missing,n>1") == ["f2", "f3"]
    assert await names(fieldSelector="metadata.name=f1") == ["f1"]
    assert await names(fieldSelector="metadata.name!=f1,metadata.namespace=default") == ["f0", "f2", "f3"]
    status, _, err, _ = await admin.get(BETA, params={"fieldSelector": "spec.x=1"})
    assert status == 400
    assert (
        err["message"] == '"spec.x" is not a known field selector: only "metadata.name", "metadata.namespace"'
    )
    status, _, err, _ = await admin.get(BETA, params={"labelSelector": "a b c"})
    assert status == 400
    status, _, page, _ = await admin.get(BETA, params={"limit": "3"})
    assert [i["metadata"]["name"] for i in page["items"]] == ["f0", "f1", "f2"]
    assert page["metadata"]["remainingItemCount"] == 1
    status, _, page2, _ = await admin.get(
        BETA, params={"limit": "3", "continue": page["metadata"]["continue"]}
    )
    assert [i["metadata"]["name"] for i in page2["items"]] == ["f3"]
    assert "continue" not in page2["metadata"]
    status, _, err, _ = await admin.get(BETA, params={"continue": "garbage"})
    assert status == 400


async def test_cluster_scoped_fischers_and_ban_flunder_admission(admin: Client) -> None:
    fischer = {
        "apiVersion": "wardle.example.com/v1alpha1",
        "kind": "Fischer",
        "metadata": {"name": "fred", "namespace": "ignored"},
        "disallowedFlunders": ["banned"],
    }
    created = await create(admin, fischer, FISCHERS)
    assert "namespace" not in created["metadata"]
    assert list(created) == ["kind", "apiVersion", "metadata", "disallowedFlunders"]
    status, _, err, _ = await admin.request("POST", BETA, body=flunder("banned"))
    assert status == 403
    assert (
        err["message"]
        == 'flunders.wardle.example.com "banned" is forbidden: this name may not be used, please change the resource name'
    )
    status, _, _, _ = await admin.get(f"{G}/v1alpha1/namespaces/default/fischers")
    assert status == 404
    status, _, _, _ = await admin.get(f"{G}/v1beta1/fischers")
    assert status == 404


async def test_yaml_in_and_out_and_dry_run(admin: Client) -> None:
    body = "apiVersion: wardle.example.com/v1beta1\nkind: Flunder\nmetadata:\n  name: y\n"
    status, headers, _, raw = await admin.request(
        "POST", BETA, body=body, content_type="application/yaml", headers={"Accept": "application/yaml"}
    )
    assert status == 201 and headers["Content-Type"] == "application/yaml"
    assert raw.startswith(b"kind: Flunder\napiVersion: wardle.example.com/v1beta1\n")
    status, _, obj, _ = await admin.request("POST", BETA, body=flunder("dry"), params={"dryRun": "All"})
    assert status == 201 and obj["metadata"]["uid"]
    assert (await admin.get(f"{BETA}/dry"))[0] == 404


async def test_unsupported_verbs_and_paths(admin: Client) -> None:
    status, _, err, _ = await admin.request("POST", f"{BETA}/x", body=flunder("x"))
    assert status == 405 and err["reason"] == "MethodNotAllowed"
    status, _, err, _ = await admin.get(f"{G}/v1beta1/namespaces/default/widgets")
    assert status == 404 and err["message"] == "the server could not find the requested resource"
    status, _, err, _ = await admin.get(f"{BETA}/x/status")
    assert status == 404
    status, _, err, _ = await admin.get(BETA, headers={"Accept": "application/vnd.kubernetes.protobuf"})
    assert status == 406 and err["reason"] == "NotAcceptable"
