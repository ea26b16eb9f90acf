"""Runs in the job: bounds how long a multi-worker TensorFlow job's workers wait for peers.

Used by `gpuhop.tf.strategy()` and by the job's start-up hook (after the script imports
TensorFlow), so a script that never imports gpuhop gets the bound too. TensorFlow is
imported when called, not before.
"""

from __future__ import annotations

import json
import os


def bound_worker_wait() -> None:
    """Make a multi-worker job's workers give up on peers that never join.

    Left alone, a worker whose peers never come waits in the strategy's constructor for an
    hour. gpuhop sets GPUHOP_WORKER_TIMEOUT (`gpuhop run --worker-timeout`); this applies
    it to TensorFlow's coordination service, which must happen before the strategy is made.
    """
    timeout = os.environ.get("GPUHOP_WORKER_TIMEOUT")
    if not timeout or workers() <= 1:
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


def workers() -> int:
    """How many workers `TF_CONFIG` names (chief included); 1 without a cluster."""
    try:
        cluster = json.loads(os.environ.get("TF_CONFIG", "{}")).get("cluster", {})
    except ValueError:
        return 1
    return sum(len(v) for k, v in cluster.items() if k in ("chief", "worker"))
