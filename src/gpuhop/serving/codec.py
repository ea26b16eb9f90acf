"""Runs in the serving job: TensorFlow Serving's REST JSON to numpy arrays and back.

Both of TF Serving's request formats are taken (its REST API guide, "Request format"):

- row ("instances"): a list with one entry per example; with one input the entry is its
  value, with several a {input name: value} object. The answer is {"predictions": ...}.
- columnar ("inputs"): the value of the one input, or {input name: value}; each value
  holds the whole batch. The answer is {"outputs": ...}.

One output comes back as a plain list; several as {output name: ...} (columnar) or as
one {output name: ...} object per example (row). Strings are JSON strings, or
{"b64": "..."} for bytes that are not UTF-8, both ways. Failures are `ServingError`s,
answered as {"error": "..."} with TF Serving's status codes (400 for bad input, 404 for an
unknown model or version). No TensorFlow here: the signature is plain numpy dtypes.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

import numpy as np

DEFAULT_SIGNATURE = "serving_default"


class ServingError(Exception):
    """A request the server refuses: `status` and TF Serving's {"error": message}."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class TensorSpec:
    dtype: np.dtype  # np.dtype(object) for strings
    shape: tuple[int | None, ...] | None  # None: unknown rank

    def describe(self) -> str:
        if self.shape is None:
            return "any shape"
        return "(" + ", ".join("-1" if d is None else str(d) for d in self.shape) + ")"


@dataclass(frozen=True)
class Signature:
    name: str
    inputs: dict[str, TensorSpec]
    outputs: tuple[str, ...]


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


def parse_predict(body: bytes, signatures: dict[str, Signature]) -> Predict:
    """Parse and check a :predict body against the model's signatures, or raise 400."""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise ServingError(400, f"JSON Parse error: {e}") from None
    if not isinstance(doc, dict):
        raise ServingError(400, 'JSON Value is not an object: expected {"instances": ...}')
    name = doc.get("signature_name", DEFAULT_SIGNATURE)
    if not isinstance(name, str):
        raise ServingError(400, "'signature_name' must be a string")
    signature = signatures.get(name)
    if signature is None:
        # TF Serving's own words (and status: INVALID_ARGUMENT, 400).
        raise ServingError(400, f'Serving signature name: "{name}" not found in signature def')
    has_rows, has_columns = "instances" in doc, "inputs" in doc
    if has_rows == has_columns:
        raise ServingError(
            400,
            "JSON Value: the request must have exactly one of 'instances' (row format) or"
            f" 'inputs' (columnar format); it has {'both' if has_rows else 'neither'}",
        )
    if has_rows:
        return _rows(signature, doc["instances"])
    return _columns(signature, doc["inputs"])


def _rows(signature: Signature, instances: Any) -> Predict:
    if not isinstance(instances, list) or not instances:
        raise ServingError(400, "'instances' must be a non-empty list, one entry per example")
    names = list(signature.inputs)
    per_input: dict[str, list[Any]] = {n: [] for n in names}
    for i, instance in enumerate(instances):
        named = isinstance(instance, dict) and (len(names) > 1 or set(instance) == set(names))
        if len(names) > 1 and not named:
            raise ServingError(
                400,
                f"instance {i} must be an object with the signature's inputs"
                f" ({', '.join(names)}), as the signature has more than one",
            )
        if named:
            if set(instance) != set(names):
                raise ServingError(
                    400,
                    f"instance {i} has the inputs {sorted(instance)}; the signature"
                    f" {signature.name} takes {sorted(names)}",
                )
            for n in names:
                per_input[n].append(instance[n])
        else:
            per_input[names[0]].append(instance)
    arrays = {n: _array(n, v, signature.inputs[n]) for n, v in per_input.items()}
    return Predict(signature, arrays, len(instances), columnar=False)


def _columns(signature: Signature, inputs: Any) -> Predict:
    names = list(signature.inputs)
    if isinstance(inputs, dict) and (len(names) > 1 or set(inputs) == set(names)):
        if set(inputs) != set(names):
            raise ServingError(
                400,
                f"'inputs' has {sorted(inputs)}; the signature {signature.name} takes"
                f" {sorted(names)}",
            )
        values = inputs
    elif len(names) == 1:
        values = {names[0]: inputs}
    else:
        raise ServingError(
            400, f"'inputs' must be an object with the signature's inputs ({', '.join(names)})"
        )
    arrays = {n: _array(n, values[n], signature.inputs[n]) for n in names}
    firsts = {a.shape[0] if a.ndim else None for a in arrays.values()}
    rows = firsts.pop() if len(firsts) == 1 else None
    return Predict(signature, arrays, rows, columnar=True)


def _array(name: str, value: Any, spec: TensorSpec) -> np.ndarray:
    """One input as an array of the signature's dtype and a shape the signature takes."""
    try:
        if spec.dtype == np.dtype(object):
            array = np.array(_strings(value), dtype=object)
        else:
            array = np.asarray(value, dtype=spec.dtype)
    except (ValueError, TypeError, OverflowError) as e:
        kind = "string" if spec.dtype == np.dtype(object) else spec.dtype.name
        raise ServingError(
            400,
            f"input '{name}' is not of expected type: {kind}, or its rows do not all have"
            f" the same shape ({e})",
        ) from None
    if spec.shape is not None and not _fits(array.shape, spec.shape):
        raise ServingError(
            400,
            f"input '{name}' has shape {_shape(array.shape)}; the signature expects"
            f" {spec.describe()} (-1: any size)",
        )
    return array


def _fits(shape: tuple[int, ...], spec: tuple[int | None, ...]) -> bool:
    return len(shape) == len(spec) and all(
        want is None or want == got for want, got in zip(spec, shape, strict=True)
    )


def _strings(value: Any) -> Any:
    """Strings as bytes, as TensorFlow holds them; {"b64": ...} decoded."""
    if isinstance(value, list):
        return [_strings(v) for v in value]
    if isinstance(value, dict) and set(value) == {"b64"} and isinstance(value["b64"], str):
        try:
            return base64.b64decode(value["b64"], validate=True)
        except ValueError:
            raise ValueError("a 'b64' value is not valid base64") from None
    if isinstance(value, str):
        return value.encode()
    raise TypeError(f"{value!r} is not a string")


def _shape(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(map(str, shape)) + ")"


def answer(request: Predict, outputs: dict[str, np.ndarray]) -> dict[str, Any]:
    """The response body for `request`, in its format."""
    names = [n for n in request.signature.outputs if n in outputs] or sorted(outputs)
    if request.columnar:
        if len(names) == 1:
            return {"outputs": _json(outputs[names[0]])}
        return {"outputs": {n: _json(outputs[n]) for n in names}}
    if len(names) == 1:
        return {"predictions": _json(outputs[names[0]])}
    rows = request.rows or 0
    for n in names:
        if outputs[n].ndim == 0 or outputs[n].shape[0] != rows:
            raise ServingError(
                400,
                f"output '{n}' has shape {_shape(outputs[n].shape)}, not one row per instance;"
                " ask in the columnar format ('inputs') instead",
            )
    columns = {n: _json(outputs[n]) for n in names}
    return {"predictions": [{n: columns[n][i] for n in names} for i in range(rows)]}


def _json(array: np.ndarray) -> Any:
    if array.dtype == np.dtype(object) or array.dtype.kind in "SU":
        return _decode(array.tolist())
    return array.tolist()


def _decode(value: Any) -> Any:
    if isinstance(value, list):
        return [_decode(v) for v in value]
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            return {"b64": base64.b64encode(value).decode()}
    return value
