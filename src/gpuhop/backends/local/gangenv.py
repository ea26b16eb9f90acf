"""Runs on the GPU host, in the leader: what each worker of a multi-worker job is told of its
peers, by mode (see `gpuhop.backends.kerasmode`). Standard library only: the leader imports it.

- "tf": TF_CONFIG for MultiWorkerMirroredStrategy, every worker's address.
- "keras-jax": the variables `keras.distribution.initialize()` reads; worker 0's port is the
  JAX coordinator's (only its address is needed; the others pick their own ports).

Every mode also gets what PyTorch's `init_process_group()` reads (its env:// method, as
torchrun sets it): MASTER_ADDR and MASTER_PORT (worker 0's address and port: the rendezvous
of a script that uses no TensorFlow server there), RANK and WORLD_SIZE; LOCAL_RANK is 0, as
each worker sees only its own GPUs (CUDA_VISIBLE_DEVICES), `cuda:0` first.
"""

from __future__ import annotations

import json

MODES = ("tf", "keras-jax")


def worker_env(mode: str, ports: list, index: int, hosts: list | None = None) -> dict:
    """The variables worker `index` of `len(ports)` gets, its peers on loopback `ports` (or
    each on its own host of `hosts`: the Slurm backend's workers)."""
    hosts = hosts or ["127.0.0.1"] * len(ports)
    torch = {
        "MASTER_ADDR": hosts[0],
        "MASTER_PORT": str(ports[0]),
        "RANK": str(index),
        "WORLD_SIZE": str(len(ports)),
        "LOCAL_RANK": "0",
    }
    if mode == "keras-jax":
        return {
            "KERAS_DISTRIBUTION_JOB_ADDRESSES": f"{hosts[0]}:{ports[0]}",
            "KERAS_DISTRIBUTION_NUM_PROCESSES": str(len(ports)),
            "KERAS_DISTRIBUTION_PROCESS_ID": str(index),
            **torch,
        }
    cluster = {"worker": [f"{h}:{p}" for h, p in zip(hosts, ports, strict=True)]}
    return {
        "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}}),
        **torch,
    }
