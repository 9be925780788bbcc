"""Table output for `kubectl get`, and apimachinery's HumanDuration."""

from __future__ import annotations

from tests.sample.conftest import Client
from tests.sample.test_resources import BETA, FISCHERS, create, flunder

KUBECTL_ACCEPT = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"


async def test_list_as_table_with_partial_metadata_rows(admin: Client) -> None:
    created = await create(admin, flunder("a", {"referenceType": "Fischer", "fischerReference": "fred"}))
    await create(admin, flunder("b"))
    status, headers, table, _ = await admin.get(
        BETA, params={"limit": "500"}, headers={"Accept": KUBECTL_ACCEPT}
    )
    assert status == 200
    assert headers["Content-Type"] == "application/json"
    assert list(table) == ["kind", "apiVersion", "metadata", "columnDefinitions", "rows"]
    assert (table["kind"], table["apiVersion"]) == ("Table", "meta.k8s.io/v1")
    columns = table["columnDefinitions"]
    assert [(c["name"], c["type"], c["format"], c["priority"]) for c in columns] == [
        ("Name", "string", "name", 0),
        ("Age", "date", "", 0),
        ("Reference Type", "string", "", 1),
        ("Reference", "string", "", 1),
    ]
    assert list(columns[0]) == ["name", "type", "format", "description", "priority"]
    first, second = table["rows"]
    assert (
        first["cells"][0] == "a"
        and first["cells"][1].endswith("s")
        and first["cells"][2:] == ["Fischer", "fred"]
    )
    assert second["cells"][2:] == [None, None]
    assert first["object"] == {
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": created["metadata"],
    }


async def test_include_object_and_table_versions(admin: Client) -> None:
    await create(admin, flunder("a"))
    _, _, table, _ = await admin.get(
        BETA, params={"includeObject": "Object"}, headers={"Accept": KUBECTL_ACCEPT}
    )
    assert table["rows"][0]["object"]["kind"] == "Flunder"
    _, _, table, _ = await admin.get(
        BETA, params={"includeObject": "None"}, headers={"Accept": KUBECTL_ACCEPT}
    )
    assert "object" not in table["rows"][0]
    status, _, err, _ = await admin.get(
        BETA, params={"includeObject": "All"}, headers={"Accept": KUBECTL_ACCEPT}
    )
    assert status == 400 and err["message"] == 'unrecognized includeObject value: "All"'
    accept = "application/json;as=Table;v=v1beta1;g=meta.k8s.io"
    _, _, table, _ = await admin.get(f"{BETA}/a", headers={"Accept": accept})
    assert table["apiVersion"] == "meta.k8s.io/v1beta1"
    assert table["rows"][0]["object"]["apiVersion"] == "meta.k8s.io/v1beta1"
    assert table["metadata"]["resourceVersion"] == table["rows"][0]["object"]["metadata"]["resourceVersion"]
    # an unknown transformation is skipped in favour of the next acceptable clause
    _, _, plain, _ = await admin.get(
        BETA, headers={"Accept": "application/json;as=Other;v=v1;g=meta.k8s.io, application/json"}
    )
    assert plain["kind"] == "FlunderList"


async def test_fischer_table(admin: Client) -> None:
    fischer = {"kind": "Fischer", "metadata": {"name": "fred"}, "disallowedFlunders": ["x", "y"]}
    await create(admin, fischer, FISCHERS)
    _, _, table, _ = await admin.get(FISCHERS, headers={"Accept": KUBECTL_ACCEPT})
    assert [c["name"] for c in table["columnDefinitions"]] == ["Name", "Age", "Disallowed Flunders"]
    assert table["rows"][0]["cells"][2] == "x,y"
