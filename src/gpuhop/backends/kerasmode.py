"""Runs in the agent: which multi-worker mode a `--workers N` job gets, from the Keras and
backend it uses, or why it cannot run.

Two modes work (FACTS.md, keras-team/keras#20585):
- `tf`: one TensorFlow worker per process under MultiWorkerMirroredStrategy, with TF_CONFIG;
  Keras is tf-keras (`TF_USE_LEGACY_KERAS=1`), since Keras 3's `fit` fails under it.
- `keras-jax`: Keras 3 on JAX, `keras.distribution` across the processes; each gets
  KERAS_DISTRIBUTION_JOB_ADDRESSES (the coordinator), _NUM_PROCESSES and _PROCESS_ID, the
  variables `keras.distribution.initialize()` reads (the local backend's leader sets them:
  `backends/local/gangenv.py`).

What decides, first to last: `GPUHOP_KERAS` (`--keras tf-keras|keras3`), `KERAS_BACKEND`,
`TF_USE_LEGACY_KERAS` in the job's environment, then the packages the job's interpreter
finds, on the job's own PYTHONPATH too (tf-keras where it is there, else Keras 3 on JAX
where there is no TensorFlow).
Keras 3 `fit` on TensorFlow, and Keras 3 on PyTorch, are refused before the job starts, with
the fix. `TF_USE_LEGACY_KERAS=0` keeps Keras 3 on TensorFlow under the strategy, for custom
training loops, which work there.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from gpuhop.api import ErrorCode
from gpuhop.api.spec import JobSpec
from gpuhop.backends import procs
from gpuhop.backends.base import Refused

log = logging.getLogger("gpuhop.agent")

KERAS_CHOICES = ("tf-keras", "keras3")
TF, KERAS_JAX = "tf", "keras-jax"
FIX_TF_FIT = (
    "run with -e KERAS_BACKEND=jax (Keras 3's own keras.distribution across the workers),"
    " or --keras tf-keras (MultiWorkerMirroredStrategy)"
)


class KerasRefusal(ValueError):
    """The job's Keras cannot run across processes as asked; the message has the fix."""


@dataclass(frozen=True)
class WorkerMode:
    mode: str  # TF or KERAS_JAX
    env: dict[str, str] = field(default_factory=dict)  # what the job's environment gets


def _truthy(value: str | None) -> bool | None:
    if value is None:
        return None
    return value.strip().lower() in ("1", "true", "yes", "on")


def decide(
    env: Mapping[str, str], has: Callable[[str], bool], where: str = "on the host"
) -> WorkerMode:
    """The mode for a multi-worker job with environment `env`; `has(module)` says whether the
    job's interpreter can import it, and `where` where a package it lacks is installed (a job
    in an image: in the image). Raises KerasRefusal."""
    keras = env.get("GPUHOP_KERAS")
    if keras is not None and keras not in KERAS_CHOICES:
        raise KerasRefusal(f"--keras takes tf-keras or keras3, not {keras!r}")
    backend = env.get("KERAS_BACKEND", "").strip().lower() or None
    legacy = _truthy(env.get("TF_USE_LEGACY_KERAS"))
    if keras == "tf-keras" or (keras is None and backend is None and legacy is not False):
        if backend not in (None, "tensorflow"):
            raise KerasRefusal(
                f"tf-keras runs on TensorFlow only, and the job sets KERAS_BACKEND={backend};"
                " drop --keras tf-keras to use Keras 3 on it"
            )
        if has("tf_keras"):
            return WorkerMode(TF, {"TF_USE_LEGACY_KERAS": "1"})
        if keras is None and not has("tensorflow") and has("keras") and has("jax"):
            return WorkerMode(KERAS_JAX, {"KERAS_BACKEND": "jax"})  # the only Keras there
        raise KerasRefusal(
            "tf-keras is not installed for the job's Python, so Keras 3 would run this"
            " multi-worker job, and its fit does not work under MultiWorkerMirroredStrategy"
            f" (keras-team/keras#20585): `pip install tf-keras` {where}, or "
            + FIX_TF_FIT.removesuffix(", or --keras tf-keras (MultiWorkerMirroredStrategy)")
            + "; a custom training loop without fit: -e TF_USE_LEGACY_KERAS=0"
        )
    backend = backend or "tensorflow"
    if backend == "jax":
        missing = [m for m in ("keras", "jax") if not has(m)]
        if missing:
            raise KerasRefusal(
                f"Keras 3 on JAX across processes needs {' and '.join(missing)} for the job's"
                f" Python: `pip install {' '.join(missing)}` {where} (jax[cuda12] for GPUs)"
            )
        return WorkerMode(KERAS_JAX, {"KERAS_BACKEND": "jax"})
    if backend == "tensorflow":
        if keras is None and legacy is False:
            return WorkerMode(TF)  # Keras 3 under the strategy: a custom loop's choice
        raise KerasRefusal(
            "Keras 3 fit on the TensorFlow backend does not work under"
            f" MultiWorkerMirroredStrategy (keras-team/keras#20585): {FIX_TF_FIT}"
        )
    raise KerasRefusal(
        f"Keras 3 on the {backend} backend across processes is not supported by gpuhop:"
        f" {FIX_TF_FIT}"
    )


PROBED = ("tensorflow", "tf_keras", "keras", "jax")
# The answer is the line after the marker, in whatever else the interpreter prints.
PROBE_MARK = "gpuhop-packages:"
PROBE = (
    "import importlib.util as u, json;"
    f" print({PROBE_MARK!r} + json.dumps({{m: u.find_spec(m) is not None for m in {PROBED!r}}}))"
)


@functools.lru_cache(maxsize=16)
def packages(
    python: str, prefix: tuple[str, ...] = (), pythonpath: str | None = None
) -> dict[str, bool]:
    """Which of tensorflow, tf_keras, keras and jax `python` can import (found, not
    imported) with the job's PYTHONPATH `pythonpath` (`-e PYTHONPATH=...`; the agent's own
    is not the job's); run behind `prefix` (a sandbox that runs it as a job's identity)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    try:
        # Bounded: `python` may be any program a job named (`--python`).
        answer = procs.ask([*prefix, python, "-c", PROBE], env=env)
    except OSError as e:
        log.warning("asking %s for its packages failed: %s", python, e)
        return {}
    found = answer.marked(PROBE_MARK)
    if not isinstance(found, dict):
        why = answer.stopped or (f"exit code {answer.code}" if answer.code else None)
        log.warning(
            "asking %s for its packages failed: %s", python, why or answer.out.strip()[-300:]
        )
        return {}
    return {m: found.get(m) is True for m in PROBED}


def check_submit(spec: JobSpec, python: str) -> None:
    """Refuse a job whose Keras cannot run across its workers as asked, before it is queued.
    Its packages are checked where they are known: a job with requirements gets its own
    venv, and one with a PYTHONPATH of its own its user's files, checked when it starts."""
    if spec.workers <= 1:
        keras = spec.env.get("GPUHOP_KERAS")
        if keras is not None and keras not in KERAS_CHOICES:
            raise Refused(ErrorCode.bad_request, f"--keras takes tf-keras or keras3, not {keras!r}")
        return
    interpreter = spec.python or python
    try:
        if spec.requirements is not None or spec.env.get("PYTHONPATH"):
            # A job's own PYTHONPATH is its user's files (a sitecustomize.py there runs as
            # the interpreter starts): never run here, as the agent (root on a team agent),
            # but asked as the job starts, in its sandbox as its identity.
            decide(spec.env, lambda m: True)
        else:
            found = packages(interpreter)
            decide(spec.env, lambda m: found.get(m, False))
    except KerasRefusal as e:
        raise Refused(ErrorCode.bad_request, str(e)) from None
