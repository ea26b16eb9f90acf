"""TensorFlow helpers. TensorFlow is imported on first use, not before.

Inside a job (on the GPU host):

    import gpuhop.tf
    model.fit(x, y, epochs=10, callbacks=gpuhop.tf.callbacks(tensorboard=True))
    model.export(gpuhop.tf.artifacts_dir() / "model")

On the user's machine, ops on the GPU host's TensorFlow server (`gpuhop tf-server start`;
the code is in `gpuhop.tf.remote`, loaded by `connect`):

    with gpuhop.tf.connect("lab"):
        with tf.device(gpuhop.tf.remote_device()):
            y = tf.matmul(x, x)
"""

from __future__ import annotations

import json
import os
from typing import Any

from gpuhop.runtime import artifacts_dir, checkpoint_dir, log_metrics, tensorboard_dir

# Also `RemoteError` (gpuhop.tf.remote's), loaded on first use by __getattr__ below.
__all__ = [
    "artifacts_dir",
    "bound_worker_wait",
    "callbacks",
    "checkpoint_dir",
    "connect",
    "metrics_callback",
    "remote_device",
    "strategy",
    "tensorboard_callback",
    "tensorboard_dir",
]


def connect(remote: str | None = None, job: str = "tf-server", **options: Any) -> Any:
    """Run this process's TensorFlow ops on a GPU host's TensorFlow server: see
    `gpuhop.tf.remote.connect` (options: client, ready_timeout, stall_timeout,
    probe_interval). Returns a `Remote`; use it as a context manager."""
    from gpuhop.tf import remote as tfremote

    return tfremote.connect(remote, job, **options)


def remote_device(kind: str | None = None, index: int = 0) -> str:
    """The connected server's device for `tf.device`: `kind` "GPU" or "CPU", or None for
    its GPU if it has one, else its CPU."""
    from gpuhop.tf import remote as tfremote

    return tfremote.remote_device(kind, index)


def __getattr__(name: str) -> Any:
    if name == "RemoteError":  # the client SDK is loaded only when asked for
        from gpuhop.tf.remote import RemoteError

        return RemoteError
    raise AttributeError(f"module 'gpuhop.tf' has no attribute {name!r}")


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
        bound_worker_wait()
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


def bound_worker_wait() -> None:
    """Make a multi-worker job's workers give up on peers that never join.

    Left alone, a worker whose peers never come waits in the strategy's constructor for an
    hour. gpuhop sets GPUHOP_WORKER_TIMEOUT (`gpuhop run --worker-timeout`); this applies
    it to TensorFlow's coordination service, which must happen before the strategy is made.
    """
    timeout = os.environ.get("GPUHOP_WORKER_TIMEOUT")
    if not timeout or _workers() <= 1:
        return
    import tensorflow as tf
    from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2
    from tensorflow.python.distribute import multi_worker_util
    from tensorflow.python.eager import context

    ctx = context.context()
    if ctx.coordination_service is not None:
        return  # already configured (by the job, or by an earlier call)
    cluster = tf.train.ClusterSpec(json.loads(os.environ["TF_CONFIG"])["cluster"])
    jobs = [
        coordination_config_pb2.CoordinatedJob(name=name, num_tasks=cluster.num_tasks(name))
        for name in ("chief", "worker")
        if name in cluster.jobs
    ]
    ctx.configure_coordination_service(
        service_type="standalone",
        service_leader=multi_worker_util.coordination_leader(cluster),
        coordinated_jobs=jobs,
        cluster_register_timeout_in_ms=int(timeout) * 1000,
    )
    # Without the barrier the register timeout bounds nothing (seen with TF 2.21: a lone
    # worker still waited 10 minutes); with it, registration fails with DeadlineExceeded.
    # The Python API has no argument for it, so set it on the config it just built.
    ctx._coordination_service_config.cluster_register_with_barrier = True


def _workers() -> int:
    try:
        cluster = json.loads(os.environ.get("TF_CONFIG", "{}")).get("cluster", {})
    except ValueError:
        return 1
    return sum(len(v) for k, v in cluster.items() if k in ("chief", "worker"))


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
