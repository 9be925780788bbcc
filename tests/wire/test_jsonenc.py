from aggregator.model.status import status_body
from aggregator.wire.jsonenc import encode_object, go_marshal, go_marshal_indent


def test_go_html_escaping_and_unicode() -> None:
    assert (
        go_marshal({"a": "<b>&</b>", "é": "\u2028"})
        == '{"a":"\\u003cb\\u003e\\u0026\\u003c/b\\u003e","é":"\\u2028"}'.encode()
    )


def test_indent_matches_marshal_indent() -> None:
    assert (
        go_marshal_indent({"a": [], "b": {}, "c": [1]})
        == b'{\n  "a": [],\n  "b": {},\n  "c": [\n    1\n  ]\n}'
    )


def test_status_field_order() -> None:
    assert encode_object(status_body(401, "Unauthorized")) == (
        b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Unauthorized",'
        b'"reason":"Unauthorized","code":401}\n'
    )


def test_pretty_has_no_trailing_newline_like_marshal_indent() -> None:
    assert encode_object({"a": 1}, pretty=True) == b'{\n  "a": 1\n}'
    assert encode_object({"a": 1}) == b'{"a":1}\n'
