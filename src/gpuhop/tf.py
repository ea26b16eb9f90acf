"""Runs inside the job: TensorFlow helpers. TensorFlow is imported on first use, not before.

import gpuhop.tf
model.fit(x, y, epochs=10, callbacks=gpuhop.tf.callbacks())
model.export(gpuhop.tf.artifacts_dir() / "model")
"""

from __future__ import annotations

import json
import os
from typing import Any

from gpuhop.runtime import artifacts_dir, checkpoint_dir, log_metrics

__all__ = ["artifacts_dir", "callbacks", "checkpoint_dir", "metrics_callback", "strategy"]


def _keras() -> Any:
    import tensorflow as tf

    # tf.keras follows TF_USE_LEGACY_KERAS: Keras 3 by default, tf-keras when asked.
    return tf.keras


def strategy(cpu_replicas: int | None = None) -> Any:
    """The `tf.distribute` strategy that fits this job's allocation.

    - several workers (gpuhop set `TF_CONFIG`): MultiWorkerMirroredStrategy;
    - several GPUs: MirroredStrategy over them;
    - one GPU: OneDeviceStrategy on it;
    - no GPU: OneDeviceStrategy on the CPU, or, with `cpu_replicas=N` (or the job's
      `GPUHOP_CPU_REPLICAS`), a MirroredStrategy over N logical CPUs, so the multi-replica
      path runs on a laptop. Splitting the CPU must happen before TensorFlow's first op.
    """
    import tensorflow as tf

    if _workers() > 1:
        return tf.distribute.MultiWorkerMirroredStrategy()
    gpus = tf.config.list_physical_devices("GPU")
    if len(gpus) > 1:
        return tf.distribute.MirroredStrategy([f"/gpu:{i}" for i in range(len(gpus))])
    if gpus:
        return tf.distribute.OneDeviceStrategy("/gpu:0")
    replicas = cpu_replicas or int(os.environ.get("GPUHOP_CPU_REPLICAS", "1"))
    if replicas <= 1:
        return tf.distribute.OneDeviceStrategy("/cpu:0")
    cpu = tf.config.list_physical_devices("CPU")[0]
    config = tf.config.get_logical_device_configuration(cpu)
    if config is None or len(config) != replicas:
        try:
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration()] * replicas
            )
        except RuntimeError:
            raise RuntimeError(
                f"gpuhop.tf.strategy(cpu_replicas={replicas}) must be called before"
                " TensorFlow runs its first op (the CPU cannot be split afterwards)"
            ) from None
    return tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(replicas)])


def _workers() -> int:
    try:
        cluster = json.loads(os.environ.get("TF_CONFIG", "{}")).get("cluster", {})
    except ValueError:
        return 1
    return sum(len(v) for k, v in cluster.items() if k in ("chief", "worker"))


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
