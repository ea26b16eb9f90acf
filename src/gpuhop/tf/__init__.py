"""Runs in the job, and on the user's machine for remote ops: gpuhop's TensorFlow helpers.

Inside a job (on the GPU host):

    import gpuhop.tf
    strategy = gpuhop.tf.strategy()
    model.fit(x, y, epochs=10, callbacks=gpuhop.tf.callbacks(tensorboard=True))
    model.export(gpuhop.tf.artifacts_dir() / "model")

On the user's machine, ops on the GPU host's TensorFlow server (`gpuhop tf-server start`):

    with gpuhop.tf.connect("lab"):
        with tf.device(gpuhop.tf.remote_device()):
            y = tf.matmul(x, x)

The public surface is what `__all__` lists; the modules behind it may change. `distribute`
(the strategy) and `keras` (the callbacks) run in the job; `remote` (connect) and `tunnel`
(its helper process) on the user's machine; `server` is the TensorFlow server job.
Importing `gpuhop.tf` is light: TensorFlow is imported on first use, and the client SDK
only by `connect`, `remote_device` or `RemoteError`, which a job never needs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpuhop.runtime import artifacts_dir, checkpoint_dir, tensorboard_dir
from gpuhop.tf.distribute import bound_worker_wait, strategy
from gpuhop.tf.keras import callbacks, metrics_callback, tensorboard_callback

if TYPE_CHECKING:
    from gpuhop.tf.remote import RemoteError

__all__ = [
    "RemoteError",
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
    `gpuhop.tf.remote.connect` (options: home, ready_timeout, stall_timeout,
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
