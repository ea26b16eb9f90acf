"""Runs inside the job: TensorFlow helpers. TensorFlow is imported on first use, not before.

import gpuhop.tf
model.fit(x, y, epochs=10, callbacks=gpuhop.tf.callbacks())
model.export(gpuhop.tf.artifacts_dir() / "model")
"""

from __future__ import annotations

from typing import Any

from gpuhop.runtime import artifacts_dir, checkpoint_dir, log_metrics

__all__ = ["artifacts_dir", "callbacks", "checkpoint_dir", "metrics_callback"]


def _keras() -> Any:
    import tensorflow as tf

    # tf.keras follows TF_USE_LEGACY_KERAS: Keras 3 by default, tf-keras when asked.
    return tf.keras


def metrics_callback(every_n_steps: int = 0) -> Any:
    """A Keras callback that writes each epoch's logs (and optionally every N steps') to
    the job's metrics file, as `{"epoch": E, "step": S, "loss": ..., ...}` lines."""
    keras = _keras()

    class MetricsCallback(keras.callbacks.Callback):  # type: ignore[name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.step = 0
            self.epoch = 0

        def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
            self.epoch = epoch + 1

        def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
            self.step += 1
            if every_n_steps and self.step % every_n_steps == 0:
                log_metrics(step=self.step, epoch=self.epoch, **(logs or {}))

        def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
            log_metrics(step=self.step, epoch=epoch + 1, **(logs or {}))

    return MetricsCallback()


def callbacks(backup: bool = True, every_n_steps: int = 0) -> list[Any]:
    """The callbacks a gpuhop job wants: metrics, and (with `backup`) a BackupAndRestore in
    the job's checkpoint dir, so a retried job resumes at its last finished epoch."""
    keras = _keras()
    out = [metrics_callback(every_n_steps)]
    if backup:
        out.append(keras.callbacks.BackupAndRestore(str(checkpoint_dir() / "backup")))
    return out
