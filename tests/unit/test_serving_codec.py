"""TF Serving's REST JSON to arrays and back (gpuhop.serving.codec), without TensorFlow."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gpuhop.serving.codec import ServingError, Signature, TensorSpec, answer, parse_predict

F32 = np.dtype("float32")
ONE = {
    "serving_default": Signature(
        "serving_default", {"pixels": TensorSpec(F32, (None, 4))}, ("output_0",)
    )
}
TWO = {
    "serving_default": Signature(
        "serving_default",
        {"a": TensorSpec(F32, (None, 2)), "b": TensorSpec(np.dtype(object), (None,))},
        ("p", "q"),
    )
}


def parse(body: object, signatures: dict[str, Signature] = ONE):
    return parse_predict(json.dumps(body).encode(), signatures)


def refused(body: bytes | object, signatures: dict[str, Signature] = ONE) -> ServingError:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    with pytest.raises(ServingError) as info:
        parse_predict(raw, signatures)
    return info.value


def test_row_format_with_one_input_stacks_instances():
    req = parse({"instances": [[1, 2, 3, 4], [5, 6, 7, 8]]})
    assert (req.rows, req.columnar) == (2, False)
    assert req.inputs["pixels"].dtype == F32
    assert req.inputs["pixels"].tolist() == [[1, 2, 3, 4], [5, 6, 7, 8]]
    named = parse({"instances": [{"pixels": [1, 2, 3, 4]}]})
    assert named.inputs["pixels"].shape == (1, 4)


def test_columnar_format_takes_the_value_or_a_named_object():
    assert parse({"inputs": [[1, 2, 3, 4]] * 3}).rows == 3
    req = parse({"inputs": {"pixels": [[1, 2, 3, 4]]}, "signature_name": "serving_default"})
    assert (req.rows, req.columnar) == (1, True)


def test_several_inputs_by_name_and_strings_as_bytes():
    req = parse({"instances": [{"a": [1, 2], "b": "x"}, {"a": [3, 4], "b": {"b64": "/w=="}}]}, TWO)
    assert req.inputs["b"].tolist() == [b"x", b"\xff"]
    assert req.rows == 2
    cols = parse({"inputs": {"a": [[1, 2]], "b": ["y"]}}, TWO)
    assert cols.inputs["a"].shape == (1, 2)


def test_answers_in_the_request_format():
    out = np.array([[0.5, 0.5], [1.0, 0.0]], dtype=F32)
    assert answer(parse({"instances": [[0] * 4] * 2}), {"output_0": out}) == {
        "predictions": [[0.5, 0.5], [1.0, 0.0]]
    }
    assert answer(parse({"inputs": [[0] * 4] * 2}), {"output_0": out}) == {
        "outputs": [[0.5, 0.5], [1.0, 0.0]]
    }
    two = {"p": np.array([1, 2]), "q": np.array([b"ok", b"\xff"], dtype=object)}
    rows = parse({"instances": [{"a": [1, 2], "b": "x"}] * 2}, TWO)
    assert answer(rows, two) == {
        "predictions": [{"p": 1, "q": "ok"}, {"p": 2, "q": {"b64": "/w=="}}]
    }
    cols = parse({"inputs": {"a": [[1, 2]] * 2, "b": ["x", "y"]}}, TWO)
    assert answer(cols, two) == {"outputs": {"p": [1, 2], "q": ["ok", {"b64": "/w=="}]}}


def test_bad_requests_are_400s_that_say_what_is_wrong():
    assert "JSON Parse error" in refused(b'{"instances": [1,').message
    assert "exactly one of 'instances'" in refused({"instances": [], "inputs": []}).message
    assert "exactly one of 'instances'" in refused({"signature_name": "serving_default"}).message
    assert refused({"instances": [[1, 2, 3]]}).message == (
        "input 'pixels' has shape (1, 3); the signature expects (-1, 4) (-1: any size)"
    )
    assert "not of expected type: float32" in refused({"instances": [["a", 1, 2, 3]]}).message
    assert "same shape" in refused({"instances": [[1, 2, 3, 4], [1]]}).message
    assert "non-empty list" in refused({"instances": []}).message
    assert "takes ['a', 'b']" in refused({"instances": [{"a": [1, 2]}]}, TWO).message
    unknown = refused({"signature_name": "nope", "instances": [[1, 2, 3, 4]]})
    # TF Serving's words and status for an unknown signature (INVALID_ARGUMENT).
    assert (unknown.status, unknown.message) == (
        400,
        'Serving signature name: "nope" not found in signature def',
    )
    for body in ([1, 2], b"\xff\xfe"):
        assert refused(body).status == 400


def test_batch_keys_tell_stackable_requests_apart():
    a = parse({"instances": [[1, 2, 3, 4]]})
    b = parse({"inputs": [[5, 6, 7, 8]] * 3})
    assert a.batch_key == b.batch_key
    wide = {"serving_default": Signature("serving_default", {"x": TensorSpec(F32, None)}, ("y",))}
    assert (
        parse({"inputs": [[1, 2]]}, wide).batch_key
        != parse({"inputs": [[1, 2, 3]]}, wide).batch_key
    )
    assert parse({"inputs": 1.0}, wide).rows is None  # a scalar has no rows to batch
