"""TF Serving's REST JSON to arrays and back (gpuhop.serving.codec), without TensorFlow.

Conformance cases are taken from TF Serving's own tests and guide, cited per test:
  json_tensor_test.cc  tensorflow_serving/util/json_tensor_test.cc
  handler_test.cc      tensorflow_serving/model_servers/http_rest_api_handler_test.cc
  api_rest.md          tensorflow_serving/g3doc/api_rest.md
Where those tests match a substring, the full message is the one json_tensor.cc builds.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from gpuhop.serving.codec import ServingError, Signature, TensorSpec, answer, parse_predict

F32 = np.dtype("float32")
I32 = np.dtype("int32")
STR = np.dtype(object)


def sig(outputs: tuple[str, ...] = ("y",), **inputs: TensorSpec) -> dict[str, Signature]:
    return {"serving_default": Signature("serving_default", inputs, outputs)}


ONE = sig(("output_0",), pixels=TensorSpec(F32, (None, 4)))
TWO = sig(("p", "q"), a=TensorSpec(F32, (None, 2)), b=TensorSpec(STR, (None,)))
INT = sig(default=TensorSpec(I32, None))  # json_tensor_test's one input of DT_INT32
STRING = sig(default=TensorSpec(STR, None))
NAMED = sig(int_tensor=TensorSpec(I32, None), str_tensor=TensorSpec(STR, None))


def parse(body: object, signatures: dict[str, Signature] = ONE):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return parse_predict(raw, signatures)


def refused(body: bytes | object, signatures: dict[str, Signature] = ONE) -> ServingError:
    with pytest.raises(ServingError) as info:
        parse(body, signatures)
    return info.value


def answered(req, outputs: dict[str, np.ndarray]) -> object:
    return json.loads(answer(req, outputs))


# --- requests that TF Serving takes -------------------------------------------------


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
    # an empty signature_name is the default signature, as in TF Serving
    assert parse({"inputs": [[1, 2, 3, 4]], "signature_name": ""}).rows == 1


def test_json_tensor_test_requests():
    """json_tensor_test.cc: SingleUnnamedTensor, TensorFromNonNullTerminatedBuffer (text
    after the document is ignored), SingleUnnamedTensorBase64Scalars/Lists,
    SingleNamedTensorBase64, SingleUnnamedTensorColumnarFormat,
    MultipleNamedTensorColumnarFormat, FloatTensorThatExceedsMaxReturnsInf."""
    req = parse(b'{"instances": [[1,2],[3,4],[5,6]]}X', INT)
    assert req.inputs["default"].tolist() == [[1, 2], [3, 4], [5, 6]]
    b64 = parse({"instances": [{"b64": "aGVsbG8="}, {"b64": "d29ybGQ="}]}, STRING)
    assert b64.inputs["default"].tolist() == [b"hello", b"world"]
    lists = parse({"instances": [[{"b64": "aGVsbG8="}], [{"b64": "d29ybGQ="}]]}, STRING)
    assert lists.inputs["default"].shape == (2, 1)
    named = parse(
        {"instances": [{"default": [[{"b64": "aGVsbG8="}], [{"b64": "d29ybGQ="}]]}]}, STRING
    )
    assert named.inputs["default"].shape == (1, 2, 1)
    for body in ({"inputs": {"int_tensor": [[[1, 2], [3, 4], [5, 6]]]}},):
        assert parse(body, sig(int_tensor=TensorSpec(I32, None))).inputs["int_tensor"].shape == (
            1,
            3,
            2,
        )
    three = sig(
        int_tensor=TensorSpec(I32, None),
        str_tensor=TensorSpec(STR, None),
        bin_tensor=TensorSpec(STR, None),
    )
    cols = parse(
        {
            "inputs": {
                "int_tensor": [[[1, 2], [3, 4], [5, 6]]],
                "str_tensor": ["foo", "bar"],
                "bin_tensor": {"b64": "aGVsbG8="},
            }
        },
        three,
    )
    assert cols.inputs["str_tensor"].tolist() == [b"foo", b"bar"]
    assert cols.inputs["bin_tensor"].shape == () and cols.inputs["bin_tensor"].item() == b"hello"
    huge = parse(b'{"instances": [3.5e+38, 1e39]}', sig(default=TensorSpec(F32, None)))
    assert np.isinf(huge.inputs["default"][1])


def test_binary_inputs_as_api_rest_md_encodes_them():
    """api_rest.md, "Encoding binary values": {"b64": ...} for any string input, whatever
    its name; plain strings stay accepted."""
    image = sig(image_bytes=TensorSpec(STR, (None,)), caption=TensorSpec(STR, (None,)))
    req = parse(
        {
            "instances": [
                {"image_bytes": {"b64": "aW1hZ2UgYnl0ZXM="}, "caption": "seaside"},
                {"image_bytes": {"b64": "YXdlc29tZSBpbWFnZSBieXRlcw=="}, "caption": "mountains"},
            ]
        },
        image,
    )
    assert req.inputs["image_bytes"].tolist() == [b"image bytes", b"awesome image bytes"]
    assert req.inputs["caption"].tolist() == [b"seaside", b"mountains"]


# --- requests that TF Serving refuses, in its words ---------------------------------


@pytest.mark.parametrize(
    ("body", "signatures", "message"),
    [
        # handler_test.cc PredictRequestErrors
        (b"", ONE, "JSON Parse error: The document is empty"),
        (b"instances = [1, 2]", ONE, "JSON Parse error: Invalid value. at offset: 0"),
        (
            b'{ "instances": ["x", "y"] }',
            ONE,
            "Failed to process element: 0 of 'instances' list. Error: INVALID_ARGUMENT:"
            ' JSON Value: "x" Type: String is not of expected type: float',
        ),
        (
            b'{ "signature_name": 100 }',
            ONE,
            'JSON Value: {\n    "signature_name": 100\n} not formatted correctly.'
            " 'signature_name' key must be a string value.",
        ),
        # json_tensor_test.cc SingleUnnamedTensorErrors
        (
            b'{"instances": [[1,2],[3,4],[5,6,7]], "inputs": [[1,2],[3,4],[5,6,7]]}',
            INT,
            'JSON Value: {\n    "instances": [[1, 2], [3, 4], [5, 6, 7]],\n    "inputs":'
            " [[1, 2], [3, 4], [5, 6, 7]]\n} Not formatted correctly expecting only one of"
            " 'inputs' or 'instances' keys to exist ",
        ),
        (
            b'{"instances": [[1,2],[3,4],[5,6,7]]}',
            INT,
            "Failed to process element: 2 of 'instances' list. Error: INVALID_ARGUMENT:"
            " Expecting tensor size: 2 but got: 3",
        ),
        (
            b'{"instances": [[1,2],[3,4],[[5,6]]]}',
            INT,
            "Failed to process element: 2 of 'instances' list. Error: INVALID_ARGUMENT:"
            " Expecting shape [2] but got: [1,2]",
        ),
        (
            b'{"instances": [1, [1]]}',
            INT,
            "Failed to process element: 1 of 'instances' list. Error: INVALID_ARGUMENT:"
            " Expecting shape [] but got: [1]",
        ),
        (
            b'{"instances": [[1,2],["a", "b"]]}',
            INT,
            "Failed to process element: 1 of 'instances' list. Error: INVALID_ARGUMENT:"
            ' JSON Value: "a" Type: String is not of expected type: int32',
        ),
        # json_tensor_test.cc MultipleNamedTensorErrors
        (
            b'{"instances": [{"int_tensor": [[1,2],[3,4],[5,6]], "str_tensor": ["foo", "bar"]},'
            b' {"int_tensor": [[[7,8],[9,0],[1,2]]], "str_tensor": ["baz", "bat"]}]}',
            NAMED,
            "Failed to process element: 1 key: int_tensor of 'instances' list. Error:"
            " INVALID_ARGUMENT: Expecting shape [3,2] but got: [1,3,2]",
        ),
        (
            b'{"instances": [{"int_tensor": [[1,2],[3,4],[5,6],[7,8]], "str_tensor": ["foo",'
            b' "bar"]}, {"int_tensor": [[7,8],[9,0],[1,2]], "str_tensor": ["baz", "bat"]}]}',
            NAMED,
            "Failed to process element: 1 key: int_tensor of 'instances' list. Error:"
            " INVALID_ARGUMENT: Expecting tensor size: 8 but got: 6",
        ),
        (
            b'{"instances": [{"int_tensor": [[1,2],[3,4],[5,6]], "str_tensor": ["foo", "bar"]},'
            b" [1, 20, 30]]}",
            NAMED,
            "Expecting object but got list at item 1 of input list",
        ),
        (
            b'{"instances": [["baz", "bar"], {"str_tensor": ["baz", "bat"]}]}',
            sig(str_tensor=TensorSpec(STR, None)),
            "Expecting value/list but got object at item 1 of input list",
        ),
        # json_tensor.cc's other refusals
        (b"[1, 2]", ONE, "JSON Value: [1, 2] Is not object"),
        (b"   ", ONE, "JSON Parse error: The document is empty. at offset: 3"),
        (b'{"instances": [1,', ONE, "JSON Parse error: Invalid value. at offset: 17"),
        (
            b'{"instances": [1 2]}',
            ONE,
            "JSON Parse error: Missing a comma or ']' after an array element. at offset: 17",
        ),
        (b"{}", ONE, "Missing 'inputs' or 'instances' key"),
        (
            b'{"instances": 1}',
            ONE,
            "JSON Value: {\n    \"instances\": 1\n} Expecting 'instances' to be an list/array",
        ),
        (
            b'{"instances": []}',
            ONE,
            "JSON Value: {\n    \"instances\": []\n} No values in 'instances' array",
        ),
        (
            b'{"instances": [[1, 2]]}',
            TWO,
            "instances is a plain list, but expecting list of objects as multiple input"
            " tensors required as per tensorinfo_map",
        ),
        (
            b'{"instances": [{"a": [1, 2]}]}',
            TWO,
            "Failed to process element: 0 of 'instances' list. JSON object: {\n    \"a\":"
            " [1, 2]\n} keys must be equal to: a,b",
        ),
        (
            b'{"instances": [{"a": [1, 2], "c": "x"}]}',
            TWO,
            "Failed to process element: 0 key: c of 'instances' list. Error: INVALID_ARGUMENT:"
            " JSON object: does not have named input: c",
        ),
        (
            b'{"inputs": [[1, 2]]}',
            TWO,
            "inputs is a plain value/list, but expecting an object as multiple input tensors"
            " required as per tensorinfo_map",
        ),
        (b'{"inputs": {"a": [[1, 2]]}}', TWO, "Missing named input: b in 'inputs' object."),
        (
            b'{"inputs": [[1, 2], [3]]}',
            INT,
            "Encountered list at unexpected size: 1 at level: 1 expected size: 2",
        ),
        (
            b'{"inputs": [[1, 2], 3]}',
            INT,
            "JSON Value: 3 found at incorrect level: 2 in the JSON DOM. Expected at level: 2",
        ),
        (b'{"inputs": [1, [2]]}', INT, "Encountered list at unexpected level: 1 expected < 1"),
        (
            b'{"inputs": [1.5]}',
            INT,
            "JSON Value: 1.5 Type: Number is not of expected type: int32",
        ),
        (
            b'{"inputs": [true]}',
            sig(default=TensorSpec(F32, None)),
            "JSON Value: true Type: True is not of expected type: float",
        ),
        (
            b'{"inputs": [{"b64": "aGk=", "x": 1}]}',
            STRING,
            'JSON Value: {\n    "b64": "aGk=",\n    "x": 1\n} not formatted correctly for'
            " base64 data",
        ),
        (b'{"inputs": [{"b64": "!!"}]}', STRING, "Unable to base64 decode"),
        (
            b'{"signature_name": "nope", "instances": [1]}',
            ONE,
            'Serving signature name: "nope" not found in signature def',
        ),
    ],
)
def test_refusals_in_tf_servings_words(body, signatures, message):
    error = refused(body, signatures)
    assert (error.status, error.message) == (400, message)


TOO_BIG = "JSON Parse error: Number too big to be stored in double. at offset: "
DOUBLE = sig(default=TensorSpec(np.dtype("float64"), None))


@pytest.mark.parametrize(
    ("body", "offset"),
    [
        # rapidjson (reader.h ParseNumber) refuses a number past the largest double where it
        # starts; Python's parser read it as infinity (before: a 200 with Infinity).
        (b'{"inputs": [1e999]}', 12),
        (b'{"inputs": [1.0, -1E+999]}', 17),
        (b'{"inputs": [1.8e308]}', 12),
        (b'{"inputs": [17976931348623159e292]}', 12),
        # It looks at the exponent before the value: past 308 plus the fraction's digits.
        (b'{"inputs": [0e999]}', 12),
        (b'{"inputs": [0.5e310]}', 12),
        # Anywhere in the document, before a later error, and in a thread's big body alike.
        (b'{"x": {"y": [1e400]}, "inputs": [1.0]}', 13),
        (b'{"inputs": [1e999 2]}', 12),
        (b'{"inputs": [' + b"1.5, " * 5000 + b"1e999]}", 12 + 5 * 5000),
    ],
)
def test_a_number_too_big_for_a_double_is_refused_where_it_starts(body, offset):
    error = refused(body, DOUBLE)
    assert (error.status, error.message) == (400, f"{TOO_BIG}{offset}")


def test_big_numbers_a_double_holds_and_their_look_alikes_are_taken():
    body = b'{"note": "1e999 \\" 1E400", "inputs": [1.5e308, 0.05e309, 1e-999, Infinity]}'
    assert parse(body, DOUBLE).inputs["default"].tolist() == [1.5e308, 5e307, 0.0, np.inf]


def test_a_value_is_quoted_as_tf_serving_quotes_it_cut_at_256_characters():
    error = refused({"signature_name": 5, "instances": [list(range(200))]})
    quoted = error.message.removeprefix("JSON Value: ")
    quoted = quoted.removesuffix(
        " not formatted correctly. 'signature_name' key must be a string value."
    )
    assert quoted.startswith('{\n    "signature_name": 5,\n    "instances": [[0, 1, 2')
    assert 256 <= len(quoted) < 270 and not quoted.endswith("}")


def test_gpuhop_checks_shapes_against_the_signature_in_its_own_words():
    """TF Serving leaves this to the model's ops; gpuhop says it before the model runs."""
    assert refused({"instances": [[1, 2, 3]]}).message == (
        "input 'pixels' has shape (1, 3); the signature expects (-1, 4) (-1: any size)"
    )


# --- answers ------------------------------------------------------------------------


def test_answers_in_the_request_format():
    out = np.array([[0.5, 0.5], [1.0, 0.0]], dtype=F32)
    assert answered(parse({"instances": [[0] * 4] * 2}), {"output_0": out}) == {
        "predictions": [[0.5, 0.5], [1.0, 0.0]]
    }
    assert answered(parse({"inputs": [[0] * 4] * 2}), {"output_0": out}) == {
        "outputs": [[0.5, 0.5], [1.0, 0.0]]
    }
    two = {"p": np.array([1, 2]), "q": np.array([b"ok", b"\xff"], dtype=object)}
    rows = parse({"instances": [{"a": [1, 2], "b": "x"}] * 2}, TWO)
    # not UTF-8 and not named _bytes: TF Serving would write invalid JSON; gpuhop, base64
    assert answered(rows, two) == {
        "predictions": [{"p": 1, "q": "ok"}, {"p": 2, "q": {"b64": "/w=="}}]
    }
    cols = parse({"inputs": {"a": [[1, 2]] * 2, "b": ["x", "y"]}}, TWO)
    assert answered(cols, two) == {"outputs": {"p": [1, 2], "q": ["ok", {"b64": "/w=="}]}}


def test_json_tensor_test_answers():
    """json_tensor_test.cc: FromJsonSingleTensor, FromJsonSingleScalarTensor,
    FromJsonSingleBytesTensor, FromJsonMultipleNamedTensors, the zero-batch tests."""
    row, col = parse({"instances": [[0] * 4]}), parse({"inputs": [[0] * 4]})
    ints = np.array([1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2], dtype=I32).reshape(2, 3, 2)
    nested = [[[1, 2], [3, 4], [5, 6]], [[7, 8], [9, 0], [1, 2]]]
    assert answered(row, {"int_tensor": ints}) == {"predictions": nested}
    assert answered(col, {"int_tensor": ints}) == {"outputs": nested}
    five = np.arange(1, 6, dtype=I32)
    assert answered(row, {"int_tensor": five}) == {"predictions": [1, 2, 3, 4, 5]}
    assert answered(col, {"int_tensor": five}) == {"outputs": [1, 2, 3, 4, 5]}
    words = np.array([b"hello", b"world", b"tf", b"serving"], dtype=object).reshape(2, 2)
    assert answered(row, {"str_tensor_bytes": words}) == {
        "predictions": [
            [{"b64": "aGVsbG8="}, {"b64": "d29ybGQ="}],
            [{"b64": "dGY="}, {"b64": "c2VydmluZw=="}],
        ]
    }
    many = {
        "int_tensor": ints,
        "str_tensor": np.array([b"foo", b"bar", b"baz", b"bat"], dtype=object).reshape(2, 2),
        "float_tensor": np.array([[1.0], [2.0]], dtype=F32),
        "double_scalar_tensor": np.array([8.0, 9.0]),
        "str_tensor_bytes": words,
    }
    assert answered(row, many) == {
        "predictions": [
            {
                "double_scalar_tensor": 8.0,
                "float_tensor": [1.0],
                "int_tensor": [[1, 2], [3, 4], [5, 6]],
                "str_tensor": ["foo", "bar"],
                "str_tensor_bytes": [{"b64": "aGVsbG8="}, {"b64": "d29ybGQ="}],
            },
            {
                "double_scalar_tensor": 9.0,
                "float_tensor": [2.0],
                "int_tensor": [[7, 8], [9, 0], [1, 2]],
                "str_tensor": ["baz", "bat"],
                "str_tensor_bytes": [{"b64": "dGY="}, {"b64": "c2VydmluZw=="}],
            },
        ]
    }
    assert answered(col, many) == {
        "outputs": {
            "double_scalar_tensor": [8.0, 9.0],
            "float_tensor": [[1.0], [2.0]],
            "int_tensor": nested,
            "str_tensor": [["foo", "bar"], ["baz", "bat"]],
            "str_tensor_bytes": [
                [{"b64": "aGVsbG8="}, {"b64": "d29ybGQ="}],
                [{"b64": "dGY="}, {"b64": "c2VydmluZw=="}],
            ],
        }
    }
    empty = {"str_tensor": np.zeros((0, 1, 2), dtype=object), "float_tensor": np.zeros((0, 3, 4))}
    assert answered(row, empty) == {"predictions": []}


def test_bytes_outputs_are_always_base64_even_when_they_are_text():
    """api_rest.md "Output of binary values": a string tensor named ..._bytes is binary."""
    row, col = parse({"instances": [[0] * 4]}), parse({"inputs": [[0] * 4]})
    echo = np.array([b"hello"], dtype=object)
    assert answered(row, {"echo_bytes": echo}) == {"predictions": [{"b64": "aGVsbG8="}]}
    assert answered(col, {"echo_bytes": echo, "n": np.array([1])}) == {
        "outputs": {"echo_bytes": [{"b64": "aGVsbG8="}], "n": [1]}
    }
    assert answered(row, {"echo": echo}) == {"predictions": ["hello"]}


def test_floats_are_written_as_tf_serving_writes_them():
    """json_tensor_test.cc FromJsonSingleFloatTensorSixDigitPrecision and
    FromJsonSingleFloatTensorNonFinite: compared as text."""
    row = parse({"instances": [[0] * 4]})
    six = np.array([[9000000, 999999, 0.5], [0.0003, 0.00003, 555557.5]], dtype=F32)
    text = answer(row, {"float_tensor": six})
    assert text == '{"predictions": [[9e+06, 999999.0, 0.5], [0.0003, 3e-05, 555557.5]]}'
    odd = np.array([[np.nan, np.inf], [3, -np.inf]], dtype=F32)
    assert answer(row, {"f": odd}) == '{"predictions": [[NaN, Infinity], [3.0, -Infinity]]}'
    assert answer(row, {"f": np.array([0.1], dtype=F32)}) == '{"predictions": [0.1]}'


@pytest.mark.parametrize(
    ("outputs", "message"),
    [
        # json_tensor_test.cc FromJsonSingleTensorErrors, FromJsonMultipleNamedTensorsErrors,
        # FromJsonMultipleZeroBatchTensorsErrors
        ({}, "Cannot convert empty tensor map to JSON"),
        ({"tensor": np.array([1 + 2j], dtype=np.complex64)}, "tensor type: complex64"),
        ({"tensor": np.array(1, dtype=I32)}, "Tensor name: tensor has no shape information "),
        (
            {"int_tensor": np.zeros((2, 3), I32), "str_tensor": np.zeros((1, 3), object)},
            "Tensor name: str_tensor has inconsistent batch size: 1 expecting: 2",
        ),
        (
            {"int_tensor": np.zeros((0, 2), I32), "str_tensor": np.zeros((1, 2), object)},
            "Tensor name: str_tensor has inconsistent batch size: 1 expecting: 0",
        ),
    ],
)
def test_row_answers_tf_serving_refuses(outputs, message):
    with pytest.raises(ServingError) as info:
        answer(parse({"instances": [[0] * 4]}), outputs)
    assert info.value.status == 400 and message in info.value.message


def test_outputs_without_a_batch_dimension_pass_whole_in_the_columnar_format():
    col = parse({"inputs": [[0] * 4]})
    outputs = {"labels": np.array([b"a", b"b", b"c"], dtype=object), "y": np.array([0.5])}
    assert answered(col, outputs) == {"outputs": {"labels": ["a", "b", "c"], "y": [0.5]}}
    assert answered(col, {"total": np.array(2.5)}) == {"outputs": 2.5}


def test_batch_keys_tell_stackable_requests_apart():
    a = parse({"instances": [[1, 2, 3, 4]]})
    b = parse({"inputs": [[5, 6, 7, 8]] * 3})
    assert a.batch_key == b.batch_key
    wide = sig(x=TensorSpec(F32, None))
    assert (
        parse({"inputs": [[1, 2]]}, wide).batch_key
        != parse({"inputs": [[1, 2, 3]]}, wide).batch_key
    )
    assert parse({"inputs": 1.0}, wide).rows is None  # a scalar has no rows to batch
