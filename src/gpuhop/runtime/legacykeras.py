"""Runs inside the job: recognises the failures of tf-keras-era code under Keras 3, and says
the fix where the job's own Python has tf-keras: `-e TF_USE_LEGACY_KERAS=1`.

Since TensorFlow 2.16, `tf.keras` is Keras 3, where tutorials written for Keras 2 fail on
renamed or removed APIs (`metric.reset_states()`, `model.save(dir, save_format="tf")`, ...).
With tf-keras installed, `TF_USE_LEGACY_KERAS=1` makes `tf.keras` tf-keras again and those
programs run unchanged. The list is small and exact on purpose: each message was seen from
Keras 3.15 and each program ran under tf-keras 2.21 with the variable set.

The start-up hook installs `excepthook` once Keras is imported: after the traceback it
prints `LINE`, which the agent finds in the log's tail and adds to the job's failure line.
The notebook runner does the same for a cell that fails. Standard library only.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from collections.abc import Callable, Mapping
from types import TracebackType

__all__ = ["HINT", "LINE", "hint_for", "install_excepthook"]

# What Keras 3 says where Keras 2 code calls an API it renamed or removed (all fixed by
# tf-keras); matched against "ErrorType: message".
KERAS3_ONLY = (
    # Metric.reset_states() is reset_state() in Keras 3 (and models have none).
    re.compile(r"AttributeError: '\w+' object has no attribute 'reset_states'"),
    # model.save / tf.keras.models.save_model(..., save_format="tf" or "h5")
    re.compile(r"ValueError: The `save_format` argument is deprecated in Keras 3"),
    # model.save("dir"): Keras 2 wrote a SavedModel there
    re.compile(r"ValueError: Invalid filepath extension for saving"),
    # tf.keras.models.load_model("dir") of a Keras 2 SavedModel
    re.compile(r"ValueError: File format not supported: .* Keras 3 only supports V3"),
    # model.save_weights("ckpt") and ModelCheckpoint("ckpt"): TensorFlow checkpoints
    re.compile(r"ValueError: The filename must end in `\.weights\.h5`"),
    re.compile(r"ValueError: The filepath provided must end in `\.keras`"),
    re.compile(r"ImportError: `keras\.optimizers\.legacy` is not supported in Keras 3"),
    # optimizer.lr is learning_rate only in Keras 3
    re.compile(
        r"AttributeError: '(?:Adam|AdamW|SGD|RMSprop|Adagrad|Adadelta|Adamax|Nadam|Ftrl)'"
        r" object has no attribute 'lr'"
    ),
    re.compile(r"AttributeError: module 'keras\.[\w.]*layers' has no attribute 'experimental'"),
)

HINT = (
    "this looks like tf-keras-era code under Keras 3, and tf-keras is installed:"
    " rerun with -e TF_USE_LEGACY_KERAS=1 (tf.keras is then tf-keras)"
)
# The line the job prints after such a traceback; the agent looks for it, whole.
LINE = f"gpuhop: {HINT}"


def _has_tf_keras() -> bool:
    return importlib.util.find_spec("tf_keras") is not None


def hint_for(
    error: str,
    environ: Mapping[str, str] = os.environ,
    has_tf_keras: Callable[[], bool] = _has_tf_keras,
) -> str | None:
    """`HINT` if `error` ("ErrorType: message") is one of Keras 3's own, the job does not
    use tf-keras already, and tf-keras is there to use; else None."""
    legacy = environ.get("TF_USE_LEGACY_KERAS", "").strip().lower()
    if legacy in ("1", "true", "yes", "on"):
        return None
    if not any(p.search(error) for p in KERAS3_ONLY):
        return None
    return HINT if has_tf_keras() else None


def install_excepthook() -> str:
    """Print `LINE` after the traceback of an uncaught exception that `hint_for` knows."""
    previous = sys.excepthook
    if getattr(previous, "gpuhop_hints", False):
        return "Keras 3 errors already get a hint"

    def excepthook(
        kind: type[BaseException], value: BaseException, tb: TracebackType | None
    ) -> None:
        previous(kind, value, tb)
        try:
            if hint_for(f"{kind.__name__}: {value}") is not None:
                print(LINE, file=sys.stderr, flush=True)
        except Exception:
            pass  # a hint is never worth a second traceback

    excepthook.gpuhop_hints = True  # type: ignore[attr-defined]
    sys.excepthook = excepthook
    return "an uncaught Keras 3 error with a tf-keras fix says so"
