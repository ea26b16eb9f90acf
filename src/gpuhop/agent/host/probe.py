"""Runs on the GPU host, in a subprocess with the jobs' Python: what TensorFlow sees there.

Started by `gpuhop doctor` (agent/services/doctor.py) as `python probe.py`, with the
environment a job gets, so the answer is what a job would find. The agent itself never
imports TensorFlow. Standard library only, apart from TensorFlow, which is the point.
Prints one line, `MARK` followed by a JSON object; everything else it prints is TensorFlow's.
"""

import importlib.metadata
import importlib.util
import json
import os
import platform
import sys

MARK = "gpuhop-probe: "


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def probe() -> dict[str, object]:
    out: dict[str, object] = {
        "python": sys.executable,
        "python_version": platform.python_version(),
        # Where it ran (a cluster's node, by the scheduler's name for it), and the GPUs the
        # scheduler gave it there (None: not set, all of the host's).
        "node": os.environ.get("SLURMD_NODENAME")
        or os.environ.get("GPUHOP_PROBE_NODE")  # Ray's node: set by the task that runs it
        or platform.node(),
        "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
        # Found, not imported: importing tf_keras would take seconds for nothing.
        "tf_keras": _version("tf-keras") if importlib.util.find_spec("tf_keras") else None,
    }
    try:
        import tensorflow as tf
    except Exception as e:
        out["tf_error"] = f"{type(e).__name__}: {e}"
        return out
    out["tf_version"] = tf.__version__
    # Which wheel: tensorflow and tensorflow-cpu install the same module.
    out["tf_dists"] = {
        d: v
        for d in ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tf-nightly")
        if (v := _version(d))
    }
    try:
        info = dict(tf.sysconfig.get_build_info())
        out["cuda_build"] = bool(info.get("is_cuda_build"))
        out["cuda_version"] = info.get("cuda_version")
        out["cudnn_version"] = info.get("cudnn_version")
    except Exception as e:
        out["build_error"] = f"{type(e).__name__}: {e}"
    try:
        out["gpus"] = [d.name for d in tf.config.list_physical_devices("GPU")]
    except Exception as e:
        out["gpus_error"] = f"{type(e).__name__}: {e}"
    return out


if __name__ == "__main__":
    result = probe()
    print(MARK + json.dumps(result), flush=True)
