"""Runs on the GPU host, in the shim: what each worker of a multi-worker job is told of its
peers, by mode (see `gpuhop.backends.kerasmode`). Standard library only: the shim imports it.

- "tf": TF_CONFIG for MultiWorkerMirroredStrategy, every worker's address.
- "keras-jax": the variables `keras.distribution.initialize()` reads; worker 0's port is the
  JAX coordinator's (only its address is needed; the others pick their own ports).
"""

from __future__ import annotations

import json

MODES = ("tf", "keras-jax")


def worker_env(mode: str, ports: list, index: int) -> dict:
    """The variables worker `index` of `len(ports)` gets, its peers on loopback `ports`."""
    if mode == "keras-jax":
        return {
            "KERAS_DISTRIBUTION_JOB_ADDRESSES": f"127.0.0.1:{ports[0]}",
            "KERAS_DISTRIBUTION_NUM_PROCESSES": str(len(ports)),
            "KERAS_DISTRIBUTION_PROCESS_ID": str(index),
        }
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    return {
        "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})
    }
