"""Runs in the job: the `tf.distribute` strategy that fits the job's allocation, and the
bound on how long a multi-worker job's workers wait for their peers.

Both read only the environment gpuhop set (`TF_CONFIG`, `GPUHOP_CPU_REPLICAS`,
`GPUHOP_WORKER_TIMEOUT`) and import TensorFlow when called, not before.
"""

from __future__ import annotations

import json
import os
from typing import Any

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
