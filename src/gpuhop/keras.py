"""Runs in the job: gpuhop's Keras callbacks, on every Keras 3 backend.

    import gpuhop.keras
    model.fit(x, y, epochs=10, callbacks=gpuhop.keras.callbacks())

`metrics_callback()` writes each epoch's logs (and the framework's own view of device
memory) to the job's metrics file, which `gpuhop show`, `ps` and the dashboard read;
`backup_callback()` is Keras's BackupAndRestore in the job's checkpoint dir, so a retried job
resumes at its last finished epoch; `tensorboard_callback()` logs where `gpuhop tensorboard
JOB` serves from.

A job needs none of this for `fit`: the start-up hook adds the metrics callback (and, with
`--retries`, BackupAndRestore) to every `Model.fit` unless the script passes its own. Use
these to choose yourself, or outside `fit`'s defaults.

It imports `keras` (when a callback is made, not before), never TensorFlow: Keras 3 on
TensorFlow, JAX or PyTorch alike. Each function also takes the Keras module to build on
(`keras=tf_keras`). Outside gpuhop the same calls work: metrics are then not recorded and
backups go to `./gpuhop-artifacts/local/checkpoints`.
"""

from __future__ import annotations

from typing import Any

from gpuhop.runtime import artifacts_dir, checkpoint_dir, tensorboard_dir
from gpuhop.runtime import callbacks as _callbacks

__all__ = [
    "artifacts_dir",
    "backup_callback",
    "callbacks",
    "checkpoint_dir",
    "metrics_callback",
    "tensorboard_callback",
    "tensorboard_dir",
]


def _keras(module: Any) -> Any:
    if module is not None:
        return module
    import keras

    return keras


def metrics_callback(every_n_steps: int = 0, keras: Any = None) -> Any:
    """A callback that writes each epoch's logs (with `every_n_steps`, every N steps' too)
    and device memory to the job's metrics file."""
    return _callbacks.metrics_callback(_keras(keras), every_n_steps)


def backup_callback(keras: Any = None) -> Any:
    """BackupAndRestore in the job's checkpoint dir: a retry resumes at the last epoch."""
    return _callbacks.backup_callback(_keras(keras))


def tensorboard_callback(keras: Any = None, **options: Any) -> Any:
    """TensorBoard logging to the job's TensorBoard dir; `options` go to
    `keras.callbacks.TensorBoard`."""
    return _callbacks.tensorboard_callback(_keras(keras), **options)


def callbacks(
    backup: bool = True, every_n_steps: int = 0, tensorboard: bool = False, keras: Any = None
) -> list[Any]:
    """Metrics, and (with `backup`) BackupAndRestore; `tensorboard=True` adds TensorBoard."""
    return _callbacks.callbacks(_keras(keras), backup, every_n_steps, tensorboard)
