"""Runs in the job: the `tf.distribute` strategy that fits the job's allocation, and the
bound on how long a multi-worker job's workers wait for their peers (which the job's
start-up hook also applies, so it lives in gpuhop.runtime).

Both read only the environment gpuhop set (`TF_CONFIG`, `GPUHOP_CPU_REPLICAS`,
`GPUHOP_WORKER_TIMEOUT`) and import TensorFlow when called, not before.
"""

from __future__ import annotations

import os
from typing import Any

from gpuhop.runtime.coordination import bound_worker_wait, workers

__all__ = ["bound_worker_wait", "strategy"]


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

    if workers() > 1:
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
