"""Runs in the serving job: a TF Serving :predict body to numpy arrays, and the answer back.

Both of TF Serving's request formats are taken (its REST API guide, "Request format"):

- row ("instances"): a list with one entry per example; with one input the entry is its
  value, with several a {input name: value} object. The answer is {"predictions": ...}.
- columnar ("inputs"): the value of the one input, or {input name: value}; each value
  holds the whole batch. The answer is {"outputs": ...}.

Requests are read as TF Serving's `util/json_tensor.cc` reads them, in the same order and
with the same words for what is wrong; `tensors` turns each value into an array. Strings
are JSON strings or {"b64": "..."}; outputs named `..._bytes` always answer as
{"b64": ...}. An answer in the row format needs every output to share its first
dimension (as in TF Serving); the columnar format gives each output whole. No TensorFlow
here: the signature is plain numpy dtypes.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpuhop.serving import tensors
from gpuhop.serving.errors import ServingError
from gpuhop.serving.tensors import debug, invalid, is_named

__all__ = ["DEFAULT_SIGNATURE", "Predict", "ServingError", "Signature", "TensorSpec"]

DEFAULT_SIGNATURE = "serving_default"


@dataclass(frozen=True)
class TensorSpec:
    dtype: np.dtype  # np.dtype(object) for strings
    shape: tuple[int | None, ...] | None  # None: unknown rank

    def describe(self) -> str:
        if self.shape is None:
            return "any shape"
        return "(" + ", ".join("-1" if d is None else str(d) for d in self.shape) + ")"

    @property
    def batched(self) -> bool:
        """Known to hold one row per example: a first dimension of any size."""
        return self.shape is not None and len(self.shape) > 0 and self.shape[0] is None


@dataclass(frozen=True)
class Signature:
    name: str
    inputs: dict[str, TensorSpec]
    outputs: tuple[str, ...]
    # Every output one row per example (so requests can share a model call); False when
    # some output is a scalar, has a fixed first dimension or an unknown shape.
    batchable: bool = True


@dataclass
class Predict:
    """A parsed predict request. `rows` is the batch size shared by every input (the
    length of "instances", or every columnar input's first dimension); None when the
    inputs have none in common, and such a request cannot be batched with others."""

    signature: Signature
    inputs: dict[str, np.ndarray]
    rows: int | None
    columnar: bool

    @property
    def batch_key(self) -> tuple[object, ...]:
        """Requests with equal keys can be stacked along the first dimension."""
        return (
            self.signature.name,
            *((k, v.dtype.str, v.shape[1:]) for k, v in sorted(self.inputs.items())),
        )


def parse_predict(
    body: bytes, signatures: dict[str, Signature], servable: ServingError | None = None
) -> Predict:
    """Parse and check a :predict body against the model's signatures, or raise TF
    Serving's error. `servable`, when given, is raised where TF Serving looks the model up
    (after reading the body and its signature_name): the request names another model."""
    doc = load_json(body)
    name = doc.get("signature_name", "")
    if not isinstance(name, str):
        raise invalid(
            f"JSON Value: {debug(doc)} not formatted correctly. 'signature_name' key must"
            " be a string value."
        )
    if servable is not None:
        raise servable
    name = name or DEFAULT_SIGNATURE
    signature = signatures.get(name)
    if signature is None:
        raise invalid(f'Serving signature name: "{name}" not found in signature def')
    if not signature.inputs:
        raise invalid(f"Failed to get input map for signature: {name}")
    if "instances" in doc and "inputs" in doc:
        raise invalid(
            f"JSON Value: {debug(doc)} Not formatted correctly expecting only one of"
            " 'inputs' or 'instances' keys to exist "
        )
    if "instances" in doc:
        instances = doc["instances"]
        if not isinstance(instances, list):
            raise invalid(f"JSON Value: {debug(doc)} Expecting 'instances' to be an list/array")
        if not instances:
            raise invalid(f"JSON Value: {debug(doc)} No values in 'instances' array")
        return _rows(signature, instances)
    if "inputs" in doc:
        return _columns(signature, doc["inputs"])
    raise invalid("Missing 'inputs' or 'instances' key")


def load_json(body: bytes) -> dict[str, Any]:
    """The body as a JSON object, or TF Serving's "JSON Parse error: ..." (its parser,
    rapidjson, names the problem in its own words; text after the document is ignored)."""
    if not body:
        raise invalid("JSON Parse error: The document is empty")
    try:
        text = body.decode()
    except UnicodeDecodeError as e:
        message = f"JSON Parse error: Invalid encoding in string. at offset: {e.start}"
        raise invalid(message) from None
    start = len(text) - len(text.lstrip(" \t\n\r"))
    if start == len(text):
        raise invalid(f"JSON Parse error: The document is empty. at offset: {len(body)}")
    try:
        doc, _ = json.JSONDecoder().raw_decode(text, start)
    except json.JSONDecodeError as e:
        _refuse_too_big(text[: e.pos])  # rapidjson stops at such a number before the error
        offset = len(text[: e.pos].encode())
        raise invalid(f"JSON Parse error: {_parse_error(e, text)} at offset: {offset}") from None
    except RecursionError:
        # rapidjson has no depth limit; Python's parser has one.
        raise invalid("JSON Parse error: the document is nested too deeply") from None
    except ValueError:
        # Python's limit on an integer's digits (4300): such a number is too big for
        # rapidjson, which may have stopped at another before it.
        _refuse_too_big(text)
        raise invalid(f"{tensors.TOO_BIG} at offset: 0") from None
    if any(exponent.search(body) for exponent in _BIG_EXPONENTS):
        # Python reads 1e999 as infinity, where rapidjson refuses it. (A whole number of
        # more than 308 digits is refused as it is made a float input: `tensors.array_of`.)
        _refuse_too_big(text)
    if not isinstance(doc, dict):
        raise invalid(f"JSON Value: {debug(doc)} Is not object")
    return doc


# A number with an exponent of 3 digits or more may be too big for a double: looked for in
# the body first (strings too, a superset), one search for each letter, where one regex for
# both takes two to three times as long. The two take a tenth as long as the parse of a
# body of floats; a search for 200 digits in a row too (the other numbers past 1e308)
# would take longer than the parse.
_BIG_EXPONENTS = (re.compile(rb"e\+?[0-9]{3}"), re.compile(rb"E\+?[0-9]{3}"))
# Strings, to skip (to the end of the text if one is not closed there), and the numbers that
# may be too big, matched from where each starts.
_STRING_OR_BIG = re.compile(
    r'"[^"\\]*(?:\\.[^"\\]*)*"?'
    r"|(?<![0-9.eE+-])-?[0-9]+(?:\.[0-9]+)?[eE]\+?[0-9]{3,}"
    r"|(?<![0-9.eE+-])-?[0-9]{200,}(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?"
)
_NUMBER = re.compile(r"-?(?P<whole>[0-9]+)(?:\.(?P<fraction>[0-9]+))?(?:[eE](?P<exp>[+-]?[0-9]+))?")


def _refuse_too_big(text: str) -> None:
    """TF Serving's 400 for the first number in `text` that rapidjson finds too big for a
    double, at the offset where it starts, if there is one."""
    for m in _STRING_OR_BIG.finditer(text):
        if not m[0].startswith('"') and _too_big(m[0]):
            offset = len(text[: m.start()].encode())
            raise invalid(f"{tensors.TOO_BIG} at offset: {offset}")


def _too_big(number: str) -> bool:
    """rapidjson's ParseNumber (as TF Serving calls it: not at full precision) refuses a
    number whose value is past the largest double, and, before it looks at the value, one
    whose exponent is more than 308 plus the digits of its fraction that it counts (up to
    17 significant digits in all): 0e999 too."""
    m = _NUMBER.fullmatch(number)
    if m is None:
        return False
    whole, fraction, exp = m["whole"], m["fraction"] or "", m["exp"]
    if exp is not None and not exp.startswith("-"):
        digits = exp.lstrip("+").lstrip("0")
        significant = len(whole.lstrip("0"))
        zeros = 0 if significant else len(fraction) - len(fraction.lstrip("0"))
        counted = min(len(fraction), zeros + max(0, 17 - significant))
        if len(digits) > 4000 or int(digits or "0") > 308 + counted:
            return True
    return math.isinf(float(number))


def _parse_error(e: json.JSONDecodeError, text: str) -> str:
    """rapidjson's words (GetParseError_En) for what Python's parser found."""
    if e.msg == "Expecting ',' delimiter":
        return (
            "Missing a comma or ']' after an array element."
            if _innermost(text[: e.pos]) == "["
            else "Missing a comma or '}' after an object member."
        )
    for python, rapidjson in (
        ("Expecting value", "Invalid value."),
        ("Expecting property name", "Missing a name for object member."),
        ("Expecting ':' delimiter", "Missing a colon after a name of object member."),
        ("Unterminated string", "Missing a closing quotation mark in string."),
        ("Invalid control character", "Invalid encoding in string."),
        ("Invalid \\uXXXX escape", "Incorrect hex digit after \\u escape in string."),
        ("Invalid \\escape", "Invalid escape character in string."),
    ):
        if e.msg.startswith(python):
            return rapidjson
    return e.msg


def _innermost(text: str) -> str:
    """The bracket of the innermost list or object still open at the end of `text`."""
    stack, in_string, escaped = [], False, False
    for c in text:
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "[{":
            stack.append(c)
        elif c in "]}" and stack:
            stack.pop()
    return stack[-1] if stack else ""


def _rows(signature: Signature, instances: list[Any]) -> Predict:
    """TF Serving's FillTensorMapFromInstancesList."""
    names = sorted(signature.inputs)
    if not isinstance(instances[0], dict) and len(names) > 1:
        raise invalid(
            "instances is a plain list, but expecting list of objects as multiple input"
            " tensors required as per tensorinfo_map"
        )
    named = is_named(instances[0])
    values: dict[str, list[Any]] = {}
    shapes: dict[str, tuple[int, ...]] = {}

    def add(name: str, value: Any) -> None:
        if name not in signature.inputs:
            raise invalid(f"JSON object: does not have named input: {name}")
        got, shape = tensors.leaves(value, signature.inputs[name].dtype)
        if name not in shapes:
            shapes[name], values[name] = shape, got
            return
        want = shapes[name]
        if math.prod(want) != len(got):
            raise invalid(f"Expecting tensor size: {math.prod(want)} but got: {len(got)}")
        if want != shape:
            raise invalid(f"Expecting shape {_dims(want)} but got: {_dims(shape)}")
        values[name].extend(got)

    for i, instance in enumerate(instances):
        if named:
            if not is_named(instance):
                raise invalid(f"Expecting object but got list at item {i} of input list")
            for key, value in instance.items():
                try:
                    add(key, value)
                except ServingError as e:
                    raise _element(e, f"{i} key: {key}") from None
            if set(instance) != set(names):
                raise invalid(
                    f"Failed to process element: {i} of 'instances' list. JSON object:"
                    f" {debug(instance)} keys must be equal to: {','.join(names)}"
                )
        else:
            if is_named(instance):
                raise invalid(f"Expecting value/list but got object at item {i} of input list")
            try:
                add(names[0], instance)
            except ServingError as e:
                raise _element(e, str(i)) from None
    rows = len(instances)
    arrays = {
        n: _checked(n, tensors.array_of(values[n], (rows, *shapes[n]), spec.dtype), spec)
        for n, spec in signature.inputs.items()
    }
    return Predict(signature, arrays, rows, columnar=False)


def _element(e: ServingError, which: str) -> ServingError:
    code = "UNIMPLEMENTED" if e.status == 501 else "INVALID_ARGUMENT"
    message = f"Failed to process element: {which} of 'instances' list. Error: {code}: {e.message}"
    return ServingError(e.status, message)


def _dims(shape: tuple[int, ...]) -> str:
    return "[" + ",".join(map(str, shape)) + "]"


def _columns(signature: Signature, inputs: Any) -> Predict:
    """TF Serving's FillTensorMapFromInputsMap: extra names in the object are ignored."""
    names = sorted(signature.inputs)
    if not is_named(inputs):
        if len(names) > 1:
            raise invalid(
                "inputs is a plain value/list, but expecting an object as multiple input"
                " tensors required as per tensorinfo_map"
            )
        inputs = {names[0]: inputs}
    arrays = {}
    for n in names:
        if n not in inputs:
            raise invalid(f"Missing named input: {n} in 'inputs' object.")
        spec = signature.inputs[n]
        arrays[n] = _checked(n, tensors.to_tensor(inputs[n], spec.dtype), spec)
    firsts = {a.shape[0] if a.ndim else None for a in arrays.values()}
    rows = firsts.pop() if len(firsts) == 1 else None
    return Predict(signature, arrays, rows, columnar=True)


def _checked(name: str, array: np.ndarray, spec: TensorSpec) -> np.ndarray:
    # TF Serving leaves this to the model, whose words depend on its ops; gpuhop says it
    # before the model runs, in its own words.
    if spec.shape is not None and not _fits(array.shape, spec.shape):
        raise invalid(
            f"input '{name}' has shape {_shape(array.shape)}; the signature expects"
            f" {spec.describe()} (-1: any size)"
        )
    return array


def _fits(shape: tuple[int, ...], spec: tuple[int | None, ...]) -> bool:
    return len(shape) == len(spec) and all(
        want is None or want == got for want, got in zip(spec, shape, strict=True)
    )


def _shape(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(map(str, shape)) + ")"


def answer(request: Predict, outputs: dict[str, np.ndarray]) -> str:
    """The response body (JSON text) for `request`, in its format: TF Serving's
    MakeJsonFromTensors, with its checks and words."""
    names = sorted(outputs)
    if not names:
        raise invalid("Cannot convert empty tensor map to JSON")
    if request.columnar:
        if len(names) == 1:
            return '{"outputs": ' + tensors.to_json(outputs[names[0]], names[0]) + "}"
        parts = (json.dumps(n) + ": " + tensors.to_json(outputs[n], n) for n in names)
        return '{"outputs": {' + ", ".join(parts) + "}}"
    batch = -1
    for n in names:
        if outputs[n].ndim == 0:
            raise invalid(f"Tensor name: {n} has no shape information ")
        size = outputs[n].shape[0]
        if batch >= 0 and size != batch:
            raise invalid(
                f"Tensor name: {n} has inconsistent batch size: {size} expecting: {batch}"
            )
        batch = size
    if len(names) == 1:
        return '{"predictions": ' + tensors.to_json(outputs[names[0]], names[0]) + "}"
    columns = {n: tensors.tokens(outputs[n], n) for n in names}
    keys = {n: json.dumps(n) + ": " for n in names}
    rows = (
        "{" + ", ".join(keys[n] + tensors.join(columns[n][i]) for n in names) + "}"
        for i in range(batch)
    )
    return '{"predictions": [' + ", ".join(rows) + "]}"
