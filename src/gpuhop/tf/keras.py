"""Runs in the job: the Keras callbacks a gpuhop job wants (metrics into the job's metrics
file, BackupAndRestore in its checkpoint dir, TensorBoard's logs in its TensorBoard dir),
built on TensorFlow's Keras.

Keras comes from TensorFlow (`tf.keras`: Keras 3, or tf-keras with `TF_USE_LEGACY_KERAS=1`),
imported when a callback is made, not before. The callbacks themselves are gpuhop.keras's
(gpuhop.runtime.callbacks), which work on every Keras 3 backend.
"""

from __future__ import annotations

from typing import Any

from gpuhop.runtime import callbacks as _callbacks

__all__ = ["callbacks", "metrics_callback", "tensorboard_callback"]


def _keras() -> Any:
    import tensorflow as tf

    # tf.keras follows TF_USE_LEGACY_KERAS: Keras 3 by default, tf-keras when asked.
    return tf.keras


def metrics_callback(every_n_steps: int = 0) -> Any:
    """A Keras callback that writes each epoch's logs (and optionally every N steps') to
    the job's metrics file, as `{"epoch": E, "epochs": N, "step": S, "loss": ..., ...}` lines
    (N: the epochs `fit` was asked for)."""
    return _callbacks.metrics_callback(_keras(), every_n_steps)


def tensorboard_callback(**options: Any) -> Any:
    """Keras's TensorBoard callback writing to the job's TensorBoard dir (`tensorboard_dir()`),
    which `gpuhop tensorboard JOB` serves live. `options` go to
    `keras.callbacks.TensorBoard` (histogram_freq=1, update_freq="batch", ...)."""
    return _callbacks.tensorboard_callback(_keras(), **options)


def callbacks(backup: bool = True, every_n_steps: int = 0, tensorboard: bool = False) -> list[Any]:
    """The callbacks a gpuhop job wants: metrics, and (with `backup`) a BackupAndRestore in
    the job's checkpoint dir, so a retried job resumes at its last finished epoch.

    `tensorboard=True` adds `tensorboard_callback()`. It is off by default because it costs
    something every epoch (10-20 ms on a CPU: a few summary writes), and the metrics file
    already feeds `gpuhop show`.
    """
    return _callbacks.callbacks(_keras(), backup, every_n_steps, tensorboard)
