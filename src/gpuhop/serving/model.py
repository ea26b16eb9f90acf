"""Runs in the serving job: one SavedModel, loaded with TensorFlow, and its signatures.

`tf.saved_model.load` gives the callable signatures; their SignatureDefs for /metadata are
read from `saved_model.pb` itself, so the answer is the protobuf TF Serving would print.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from gpuhop.serving.codec import Signature, TensorSpec
from gpuhop.serving.errors import HTTP_OF_CODE, ServingError

SERVE_TAG = "serve"


class ServedModel:
    def __init__(self, path: Path):
        import tensorflow as tf

        self._tf = tf
        self.path = path
        self._loaded = tf.saved_model.load(str(path))
        self._functions = dict(self._loaded.signatures)
        if not self._functions:
            raise ValueError(f"the SavedModel in {path} has no serving signatures")
        self.signatures = {name: _signature(name, fn) for name, fn in self._functions.items()}

    def run(self, signature: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Call one signature. TensorFlow's errors keep their words and get TF Serving's
        status for their code (400 for a bad value); Python's complaints about the
        arguments are 400s."""
        tf = self._tf
        fn = self._functions[signature]
        try:
            outputs = fn(**{k: tf.constant(v) for k, v in inputs.items()})
        except tf.errors.OpError as e:
            raise ServingError(HTTP_OF_CODE.get(e.error_code, 500), e.message) from None
        except (ValueError, TypeError) as e:
            raise ServingError(400, str(e)) from None
        return {k: v.numpy() for k, v in outputs.items()}

    def metadata(self) -> dict[str, Any]:
        """The model's SignatureDefs as TF Serving's /metadata gives them."""
        from google.protobuf import json_format
        from tensorflow.core.protobuf import saved_model_pb2

        saved = saved_model_pb2.SavedModel()
        saved.ParseFromString((self.path / "saved_model.pb").read_bytes())
        graphs = [g for g in saved.meta_graphs if SERVE_TAG in g.meta_info_def.tags]
        graph = graphs[0] if graphs else saved.meta_graphs[0]
        defs = {}
        for name, sig in graph.signature_def.items():
            defs[name] = json_format.MessageToDict(
                sig, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
            )
        return {"signature_def": {"signature_def": defs}}


def _signature(name: str, fn: Any) -> Signature:
    _, kwargs = fn.structured_input_signature
    inputs = {key: _spec(spec) for key, spec in sorted(kwargs.items())}
    outputs = {key: _spec(spec) for key, spec in sorted(fn.structured_outputs.items())}
    # Requests share a model call only when that cannot change an answer: every output
    # is one row per example (a scalar, a fixed first dimension such as a [3] list of
    # labels, or an unknown shape is not), and every input may have any number of rows.
    batchable = all(o.batched for o in outputs.values()) and all(
        i.shape is None or i.batched for i in inputs.values()
    )
    return Signature(name, inputs, tuple(outputs), batchable)


def _spec(spec: Any) -> TensorSpec:
    string = spec.dtype.name == "string"
    dtype = np.dtype(object) if string else np.dtype(spec.dtype.as_numpy_dtype)
    dims = spec.shape.as_list() if spec.shape.rank is not None else None
    return TensorSpec(dtype, None if dims is None else tuple(dims))
