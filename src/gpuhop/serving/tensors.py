"""Runs in the serving job: one JSON value to one tensor (numpy) and back, by TF Serving's rules.

TF Serving's `util/json_tensor.cc` is the reference; its checks and words are kept, so a
client sees the message TF Serving would give (its `json_tensor_test.cc` names them):

- a value's shape is read from its first elements (`[[1, 2], [3, 4]]` is 2x2); every
  other element must agree ("Encountered list at unexpected size: ...", "... found at
  incorrect level: ...");
- a leaf must suit the dtype: any number for floats, a whole number in range for ints,
  true/false for bool, a string or {"b64": ...} for strings ("JSON Value: "x" Type:
  String is not of expected type: float");
- on the way out, a string tensor whose name ends in `_bytes` is always {"b64": ...};
  floats are written as TF Serving writes them (six significant digits when that reads
  back as the same number, else full precision; `1.0`, not `1`; NaN and Infinity).

No TensorFlow here; dtypes are numpy's (object for strings).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import functools
import json
from typing import Any

import numpy as np

from gpuhop.serving.errors import ServingError

STRING = np.dtype(object)
BYTES_SUFFIX = "_bytes"
# What TF Serving's JsonValueToDebugString keeps of a value in an error message.
DEBUG_LIMIT = 256
# The most dimensions a value may have: numpy 1.x's limit (2.x takes 64). TF Serving's
# tensors take up to 254; a client error all the same, not the server's fault (a 500).
MAX_RANK = 32
TOO_BIG = "JSON Parse error: Number too big to be stored in double."
_INDENT = "    "


def tf_name(dtype: np.dtype) -> str:
    """The dtype as TensorFlow's DataTypeString names it ("float", "string", "int64")."""
    if dtype == STRING:
        return "string"
    return {"float32": "float", "float64": "double", "float16": "half"}.get(dtype.name, dtype.name)


def invalid(message: str) -> ServingError:
    return ServingError(400, message)


# --- JSON -> tensor ------------------------------------------------------------------


def is_b64(value: Any) -> bool:
    """TF Serving's binary value: an object with the one key "b64", a string."""
    return isinstance(value, dict) and len(value) == 1 and isinstance(value.get("b64"), str)


def is_named(value: Any) -> bool:
    """An object of named inputs (an object that is not a binary value)."""
    return isinstance(value, dict) and not is_b64(value)


def dense_shape(value: Any) -> tuple[int, ...]:
    """The shape as TF Serving reads it: the length of each first element, down."""
    shape = []
    while isinstance(value, list):
        shape.append(len(value))
        if not value:
            break
        value = value[0]
    _check_rank(tuple(shape))
    return tuple(shape)


def _check_rank(shape: tuple[int, ...]) -> None:
    if len(shape) > MAX_RANK:
        raise invalid(
            f"a value of {len(shape)} dimensions (lists in lists); gpuhop's model server"
            f" takes at most {MAX_RANK}"
        )


def to_tensor(value: Any, dtype: np.dtype) -> np.ndarray:
    """One JSON value as an array of `dtype`, or raise TF Serving's 400."""
    shape = dense_shape(value)
    return array_of(_leaves(value, shape, dtype), shape, dtype)


def leaves(value: Any, dtype: np.dtype) -> tuple[list[Any], tuple[int, ...]]:
    """The values of one JSON value, in order, converted for `dtype`, and its shape."""
    shape = dense_shape(value)
    return _leaves(value, shape, dtype), shape


def _leaves(value: Any, shape: tuple[int, ...], dtype: np.dtype) -> list[Any]:
    convert = _converter(dtype)
    rank = len(shape)
    out: list[Any] = []

    def walk(v: Any, level: int) -> None:
        if not isinstance(v, list):
            if level != rank:
                raise invalid(
                    f"JSON Value: {debug(v)} found at incorrect level: {level + 1} in the"
                    f" JSON DOM. Expected at level: {rank}"
                )
            out.append(convert(v))
            return
        if level >= rank:
            raise invalid(f"Encountered list at unexpected level: {level} expected < {rank}")
        if len(v) != shape[level]:
            raise invalid(
                f"Encountered list at unexpected size: {len(v)} at level: {level}"
                f" expected size: {shape[level]}"
            )
        if level == rank - 1 and dtype != STRING:
            try:  # the common case, a list of numbers, without a call per number
                out.extend(map(convert, v))
                return
            except ServingError:
                pass  # walked one by one below, for the exact message
        for x in v:
            walk(x, level + 1)

    walk(value, 0)
    return out


def array_of(values: list[Any], shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    _check_rank(shape)
    if dtype == STRING:
        array = np.empty(len(values), dtype=object)
        array[:] = values
        return array.reshape(shape)
    if dtype.kind in "iu" and dtype.itemsize < 4:
        # TF Serving holds these as int32 and narrows them, as TensorFlow does.
        return np.array(values, dtype=np.int64).astype(dtype).reshape(shape)
    with np.errstate(over="ignore", under="ignore"):  # out of a float's range: inf, 0
        try:
            return np.array(values, dtype=dtype).reshape(shape)
        except OverflowError:
            # A whole number past a double's range, which rapidjson refuses as it parses
            # it (TF Serving's words; where it was is not known here).
            raise invalid(TOO_BIG) from None


@functools.cache  # one per dtype: building it (tf_name) costs more than a row's values
def _converter(dtype: np.dtype) -> Any:
    name = tf_name(dtype)

    def type_error(v: Any) -> ServingError:
        return invalid(
            f"JSON Value: {debug(v)} Type: {json_type(v)} is not of expected type: {name}"
        )

    if dtype == STRING:

        def string(v: Any) -> bytes:
            if isinstance(v, str):
                return v.encode()
            if isinstance(v, dict):
                return _b64decode(v)
            raise type_error(v)

        return string
    if dtype.kind == "b":

        def boolean(v: Any) -> bool:
            if type(v) is not bool:
                raise type_error(v)
            return v

        return boolean
    if dtype.kind == "f":

        def number(v: Any) -> float | int:
            if type(v) is not float and type(v) is not int:
                raise type_error(v)
            return v

        return number
    if dtype.kind in "iu":
        # rapidjson's IsInt / IsInt64 / IsUint / IsUint64, as TF Serving asks them.
        if dtype.kind == "i":
            bits = 64 if dtype.itemsize == 8 else 32
            low, high = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
        else:
            bits = 64 if dtype.itemsize == 8 else 32 if dtype.itemsize == 4 else 31
            low, high = 0, 2**bits - 1

        def whole(v: Any) -> int:
            if type(v) is not int or not low <= v <= high:
                raise type_error(v)
            return v

        return whole

    def unsupported(v: Any) -> Any:
        raise ServingError(501, f"Conversion of JSON Value: {debug(v)} to type: {name}")

    return unsupported


def _b64decode(v: dict[str, Any]) -> bytes:
    if not is_b64(v):
        raise invalid(f"JSON Value: {debug(v)} not formatted correctly for base64 data")
    text = v["b64"]
    try:
        return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise invalid("Unable to base64 decode") from None


def json_type(v: Any) -> str:
    if v is None:
        return "Null"
    if v is True or v is False:
        return str(v)
    return _JSON_TYPES.get(type(v), "Number")


_JSON_TYPES: dict[type, str] = {dict: "Object", list: "Array", str: "String"}


def debug(value: Any) -> str:
    """A JSON value as TF Serving quotes it in messages: rapidjson's pretty writer with
    arrays on one line, cut after about 256 characters."""
    out: list[str] = []
    size = 0

    def put(text: str) -> None:
        nonlocal size
        if size >= DEBUG_LIMIT:
            raise _Full
        out.append(text)
        size += len(text)

    def write(v: Any, depth: int, prefix: str) -> None:
        if isinstance(v, dict):
            put(prefix + "{")
            for i, (k, x) in enumerate(v.items()):
                put(("," if i else "") + "\n" + _INDENT * (depth + 1) + _scalar(str(k)))
                write(x, depth + 1, ": ")
            put(("\n" + _INDENT * depth if v else "") + "}")
        elif isinstance(v, list):
            put(prefix + "[")
            for i, x in enumerate(v):
                write(x, depth + 1, ", " if i else "")
            put("]")
        else:
            put(prefix + _scalar(v))

    with contextlib.suppress(_Full):
        write(value, 0, "")
    return "".join(out)


class _Full(Exception):
    pass


def _scalar(v: Any) -> str:
    if isinstance(v, float):
        return repr(v).replace("e+", "e").replace("inf", "Infinity").replace("nan", "NaN")
    return json.dumps(v, ensure_ascii=False)


# --- tensor -> JSON ------------------------------------------------------------------


def to_json(array: np.ndarray, name: str) -> str:
    """A whole tensor as JSON text, nested as its shape."""
    return join(tokens(array, name))


def tokens(array: np.ndarray, name: str) -> np.ndarray:
    """Each value of `array` as JSON text, in an object array of the same shape."""
    flat = array.reshape(-1)
    kind = array.dtype.kind
    if kind == "f":
        text = _decimals(flat)
    elif kind == "b":
        text = ["true" if v else "false" for v in flat.tolist()]
    elif kind in "iu":
        text = [str(v) for v in flat.tolist()]
    elif kind in "OSU":
        as_bytes = name.endswith(BYTES_SUFFIX)
        text = [_string(v, as_bytes) for v in flat.tolist()]
    else:
        raise invalid(f"Failed to write JSON value for tensor type: {array.dtype.name}")
    out = np.empty(len(text), dtype=object)
    out[:] = text
    return out.reshape(array.shape)


def join(tokens: np.ndarray | str) -> str:
    if isinstance(tokens, str):
        return tokens
    if tokens.ndim == 0:
        return str(tokens.item())
    if tokens.size == 0:
        return _nest(tokens.tolist())
    # Innermost lists first, a Python loop over them: an object array's tolist() makes
    # every nested list in one C call that holds the GIL (a second for 500,000 rows),
    # stopping the event loop even when the answer is written in a thread.
    parts = tokens.reshape(-1).tolist()
    for size in reversed(tokens.shape):
        parts = ["[" + ", ".join(parts[i : i + size]) + "]" for i in range(0, len(parts), size)]
    return str(parts[0])


def _nest(value: Any) -> str:
    if isinstance(value, str):
        return value
    return "[" + ", ".join(map(_nest, value)) + "]"


def _string(v: Any, as_bytes: bool) -> str:
    raw = v if isinstance(v, bytes) else str(v).encode()
    if not as_bytes:
        try:
            return json.dumps(raw.decode())
        except UnicodeDecodeError:
            pass  # not text: TF Serving would write invalid JSON; gpuhop sends base64
    return '{"b64": "' + base64.b64encode(raw).decode() + '"}'


def _decimals(flat: np.ndarray) -> list[str]:
    """TF Serving's WriteDecimal: "%g", or "%.9g" (float) / "%.17g" (double) when six
    digits do not read back as the same value; ".0" after whole numbers."""
    single = flat.dtype.itemsize <= 4
    values = flat.tolist()
    text = [format(v, "g") for v in values]
    finite = np.isfinite(flat)
    if text:
        with np.errstate(over="ignore"):
            back = np.array(text, dtype=np.float64).astype(flat.dtype)
        exact = ".9g" if single else ".17g"
        for i in np.flatnonzero(finite & (back != flat)).tolist():
            text[i] = format(values[i], exact)
    for i, (t, ok) in enumerate(zip(text, finite.tolist(), strict=True)):
        if not ok:
            text[i] = "NaN" if t == "nan" else "-Infinity" if t == "-inf" else "Infinity"
        elif "." not in t and "e" not in t:
            text[i] = t + ".0"
    return text
