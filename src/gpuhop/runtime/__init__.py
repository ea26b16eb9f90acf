"""Runs inside the job: the environment contract gpuhop sets, and metric logging.

No heavy imports (no TensorFlow, no client). Outside gpuhop the same calls work too:
`artifacts_dir()` is then `./gpuhop-artifacts/local` (and `tensorboard_dir()` its
`tensorboard/`) and metrics are not recorded, so one script runs unchanged on a laptop and
under `gpuhop run`.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
import time
from pathlib import Path

__all__ = [
    "artifacts_dir",
    "attempt",
    "checkpoint_dir",
    "in_job",
    "is_chief",
    "job_id",
    "log_metrics",
    "metrics_file",
    "tensorboard_dir",
    "worker_index",
]

LOCAL_ARTIFACTS = Path("gpuhop-artifacts") / "local"


def in_job() -> bool:
    """True when this process runs as a gpuhop job."""
    return "GPUHOP_JOB_ID" in os.environ


def job_id() -> str | None:
    return os.environ.get("GPUHOP_JOB_ID")


def attempt() -> int:
    """Which try of the job this is, 1-based."""
    return int(os.environ.get("GPUHOP_ATTEMPT", "1"))


def _dir(var: str, fallback: Path) -> Path:
    path = Path(os.environ.get(var) or fallback)
    path.mkdir(parents=True, exist_ok=True)
    return path


def artifacts_dir() -> Path:
    """Files written here come back with `gpuhop pull` (or `gpuhop run --pull DIR`)."""
    return _dir("GPUHOP_ARTIFACTS_DIR", LOCAL_ARTIFACTS)


def checkpoint_dir() -> Path:
    """A directory kept across retries of the same job: put resumable state here."""
    return _dir("GPUHOP_CHECKPOINT_DIR", LOCAL_ARTIFACTS / "checkpoints")


def tensorboard_dir() -> Path:
    """Where TensorBoard event files go: `gpuhop tensorboard JOB` serves this directory
    (`$GPUHOP_TENSORBOARD_DIR`, the `tensorboard/` dir in the job's artifacts), and it comes
    back with `gpuhop pull`. Workers other than the chief of a multi-worker job get a scratch
    dir of their own: they log the same values, and two writers in one run dir confuse
    TensorBoard."""
    if not is_chief():
        scratch = f"gpuhop-{job_id() or 'local'}-tensorboard-worker-{worker_index()}"
        path = Path(tempfile.gettempdir()) / scratch
        path.mkdir(parents=True, exist_ok=True)
        return path
    if "GPUHOP_TENSORBOARD_DIR" in os.environ:
        return _dir("GPUHOP_TENSORBOARD_DIR", LOCAL_ARTIFACTS / "tensorboard")
    # Outside gpuhop, or under an older agent that does not set it: the same convention.
    path = artifacts_dir() / "tensorboard"
    path.mkdir(exist_ok=True)
    return path


def worker_index() -> int:
    """This process's worker in a multi-worker job (0, the chief, otherwise)."""
    return int(os.environ.get("GPUHOP_WORKER_INDEX", "0"))


def is_chief() -> bool:
    """True in single-worker jobs and on worker 0: the one that writes metrics and models."""
    return worker_index() == 0


def metrics_file() -> Path | None:
    value = os.environ.get("GPUHOP_METRICS_FILE")
    return Path(value) if value else None


def _plain(value: object) -> object:
    """A JSON-friendly number: numpy and tensor scalars become floats; NaN and infinity
    (a diverged loss) become the strings "nan", "inf" and "-inf", which `show` and `ps`
    print as such (JSON has no NaN; None read as a missing metric, hiding the divergence).

    A scalar that has `item()` (numpy, PyTorch, JAX) is read through it: `float()` of a
    PyTorch loss that requires grad warns (a UserWarning, an error under `-W error`)."""
    if isinstance(value, (bool, int, str)) or value is None:
        return value
    item = getattr(value, "item", None)
    if callable(item):
        # Not a one-element array: float() below says what it is.
        with contextlib.suppress(TypeError, ValueError, RuntimeError):
            value = item()
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return str(value)
    return number if math.isfinite(number) else str(number)


def log_metrics(*, step: int | None = None, epoch: int | None = None, **values: object) -> None:
    """Append one record to the job's metrics file (`gpuhop show` prints the latest).

    For custom training loops; the Keras callback in `gpuhop.tf` calls this for you.
    `time`, `step`, `epoch` and `epochs` (the planned number of epochs, for "epoch 3/10"
    displays) describe the record; every other key is a metric.
    """
    path = metrics_file()
    if path is None or not is_chief():
        return  # every worker of a gang sees the same metrics; the chief records them
    record: dict[str, object] = {"time": round(time.time(), 3)}
    if step is not None:
        record["step"] = int(step)
    if epoch is not None:
        record["epoch"] = int(epoch)
    record.update({k: _plain(v) for k, v in values.items()})
    # One write of a whole line in append mode: readers never see half a record.
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
