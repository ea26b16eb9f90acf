"""Runs in the job: the Keras callbacks a gpuhop job wants (metrics into the job's metrics
file, BackupAndRestore in its checkpoint dir, TensorBoard's logs in its TensorBoard dir).

Keras comes from TensorFlow (`tf.keras`: Keras 3, or tf-keras with `TF_USE_LEGACY_KERAS=1`),
imported when a callback is made, not before.
"""

from __future__ import annotations

from typing import Any

from gpuhop.runtime import checkpoint_dir, log_metrics, tensorboard_dir

__all__ = ["callbacks", "metrics_callback", "tensorboard_callback"]


def _keras() -> Any:
    import tensorflow as tf

    # tf.keras follows TF_USE_LEGACY_KERAS: Keras 3 by default, tf-keras when asked.
    return tf.keras


def metrics_callback(every_n_steps: int = 0) -> Any:
    """A Keras callback that writes each epoch's logs (and optionally every N steps') to
    the job's metrics file, as `{"epoch": E, "epochs": N, "step": S, "loss": ..., ...}` lines
    (N: the epochs `fit` was asked for)."""
    keras = _keras()

    class MetricsCallback(keras.callbacks.Callback):  # type: ignore[name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.step = 0
            self.epoch = 0

        def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
            self.epoch = epoch + 1

        def _total(self) -> dict[str, int]:
            # The number of epochs fit() was asked for: `gpuhop run` shows "epoch 3/10".
            epochs = (self.params or {}).get("epochs")
            return {"epochs": int(epochs)} if isinstance(epochs, int) else {}

        def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
            self.step += 1
            if every_n_steps and self.step % every_n_steps == 0:
                log_metrics(step=self.step, epoch=self.epoch, **self._total(), **(logs or {}))

        def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
            log_metrics(step=self.step, epoch=epoch + 1, **self._total(), **(logs or {}))

    return MetricsCallback()


def tensorboard_callback(**options: Any) -> Any:
    """Keras's TensorBoard callback writing to the job's TensorBoard dir (`tensorboard_dir()`),
    which `gpuhop tensorboard JOB` serves live. `options` go to
    `keras.callbacks.TensorBoard` (histogram_freq=1, update_freq="batch", ...).

    With the default `update_freq="epoch"`, Keras 3's callback still makes a (no-op)
    summary call per metric after every batch, about 0.8 ms a batch on a CPU: a large share
    of a fast GPU step. This one skips them; what it writes is the same.
    """
    keras = _keras()
    options.setdefault("log_dir", str(tensorboard_dir()))

    class TensorBoard(keras.callbacks.TensorBoard):  # type: ignore[name-defined]
        def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
            epochly = self.update_freq == "epoch"
            super().on_train_batch_end(batch, None if epochly else logs)

    return TensorBoard(**options)


def callbacks(backup: bool = True, every_n_steps: int = 0, tensorboard: bool = False) -> list[Any]:
    """The callbacks a gpuhop job wants: metrics, and (with `backup`) a BackupAndRestore in
    the job's checkpoint dir, so a retried job resumes at its last finished epoch.

    `tensorboard=True` adds `tensorboard_callback()`. It is off by default because it costs
    something every epoch (10-20 ms on a CPU: a few summary writes), and the metrics file
    already feeds `gpuhop show`.
    """
    keras = _keras()
    out = [metrics_callback(every_n_steps)]
    if backup:
        out.append(keras.callbacks.BackupAndRestore(str(checkpoint_dir() / "backup")))
    if tensorboard:
        out.append(tensorboard_callback())
    return out
