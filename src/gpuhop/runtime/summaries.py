"""Runs inside the job: the scalars a program writes with `tf.summary.scalar` are recorded as
metrics too, without changing the program, and every metrics record says where it came from.

A record's `source` names its phase: `fit:MODEL` for a Keras `fit` (gpuhop's callback), and
`summary:LOGDIR` for a `tf.summary.scalar` written to a writer made for LOGDIR (relative to
the job's work dir where it lies in it), so that a program that fits, then trains on in a
custom GradientTape loop, shows which numbers are whose. The start-up hook calls `record` once
TensorFlow is imported: it wraps `tf.summary.create_file_writer` (to remember each writer's
logdir) and `tf.summary.scalar`, where TensorFlow defines them and where `tf.summary` has them.

What is recorded: each scalar written in eager code (a training loop's per-epoch summaries,
as TensorFlow's and TensorBoard's tutorials write them), one record per write, with its step;
the agent shows a source's writes of one step together. Not recorded: scalars written inside
a `tf.function` (their values exist only when the graph runs), and those written while a
Keras `fit` runs (its TensorBoard callback's `epoch_loss` and the like: the fit's own
metrics, already recorded under `fit:MODEL`).
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections.abc import Iterator
from typing import Any

from gpuhop.runtime import log_metrics

__all__ = ["SOURCE_KEY", "fit_source", "keras_fit", "record"]

# The key of a metrics record that names its source.
SOURCE_KEY = "source"
# Keys a scalar's name may not take: they describe the record (see runtime.log_metrics).
RESERVED = frozenset({"time", "step", "epoch", "epochs", SOURCE_KEY})

# The names TensorFlow's `tf.summary` module goes by in sys.modules.
API_MODULES = ("tensorflow._api.v2.summary", "tensorflow.summary", "tensorflow.compat.v2.summary")

_fits = 0  # Keras fits running in this process now


def fit_source(model: Any) -> str:
    """The source of a Keras fit's records: `fit:MODEL` (the model's name)."""
    return f"fit:{getattr(model, 'name', None) or 'model'}"


@contextlib.contextmanager
def keras_fit() -> Iterator[None]:
    """Around a Keras fit: the tf.summary scalars written meanwhile are the fit's own."""
    global _fits
    _fits += 1
    try:
        yield
    finally:
        _fits -= 1


def _source(logdir: object) -> str:
    path = os.fsdecode(logdir) if isinstance(logdir, (str, bytes, os.PathLike)) else str(logdir)
    try:
        relative = os.path.relpath(path)
    except ValueError:
        relative = path
    return f"summary:{path if relative.startswith('..') else relative}"


def record(tf: Any) -> str:
    """Wrap `create_file_writer` and `scalar` where TensorFlow defines them and in the
    `tf.summary` module made of them. Returns what it did, in words.

    Both places: `import tensorflow.summary` (Keras's TensorBoard callback does it) makes
    that module again, from the defining modules' names, and replaces `tf.summary`."""
    from tensorflow.python.ops import summary_ops_v2
    from tensorflow.python.summary import tb_summary

    if getattr(tb_summary.scalar, "gpuhop_recorded", False):
        return "tf.summary scalars are recorded already"
    create, scalar = summary_ops_v2.create_file_writer_v2, tb_summary.scalar
    summary_ops_v2.create_file_writer_v2 = _remembering(create)
    tb_summary.scalar = _recording(scalar, tf, summary_ops_v2)
    for module in (tf.summary, *(sys.modules.get(n) for n in API_MODULES)):
        if getattr(module, "create_file_writer", None) is create:
            module.create_file_writer = summary_ops_v2.create_file_writer_v2
        if getattr(module, "scalar", None) is scalar:
            module.scalar = tb_summary.scalar
    return "tf.summary scalars are recorded as metrics"


def _remembering(create: Any) -> Any:
    @functools.wraps(create)
    def create_file_writer(logdir: Any, *args: Any, **kwargs: Any) -> Any:
        writer = create(logdir, *args, **kwargs)
        with contextlib.suppress(Exception):  # a writer we cannot label is still a writer
            writer.gpuhop_source = _source(logdir)
        return writer

    return create_file_writer


def _recording(scalar: Any, tf: Any, summary_ops_v2: Any) -> Any:
    @functools.wraps(scalar)
    def recording_scalar(*args: Any, **kwargs: Any) -> Any:
        written = scalar(*args, **kwargs)
        if _fits or not tf.executing_eagerly():
            return written
        try:
            if bool(written):
                _log(args, kwargs, tf, summary_ops_v2)
        except Exception:
            pass  # recording a metric is never worth failing the program's write
        return written

    recording_scalar.gpuhop_recorded = True  # type: ignore[attr-defined]
    return recording_scalar


def _log(args: tuple[Any, ...], kwargs: dict[str, Any], tf: Any, summary_ops_v2: Any) -> None:
    named = dict(zip(("name", "data", "step"), args, strict=False)) | kwargs
    name, step = str(named["name"]), named.get("step")
    if name in RESERVED:
        return
    if step is None:
        step = tf.summary.experimental.get_step()
    writer = getattr(summary_ops_v2._summary_state, "writer", None)
    source = getattr(writer, "gpuhop_source", "summary")
    log_metrics(
        step=None if step is None else int(step), **{SOURCE_KEY: source, name: named["data"]}
    )
