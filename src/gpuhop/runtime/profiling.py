"""Runs inside the job: `gpuhop profile`'s half in a TensorFlow or JAX process. On the agent's
request it runs the framework's own profiler in this process for a few seconds, writing into
the job's TensorBoard dir (`plugins/profile/RUN/HOST.xplane.pb`), where TensorBoard's Profile
tab (the `tensorboard-plugin-profile`/xprof plugin) reads it.

The request channel is a FIFO, `profile-PID.fifo` in the job's control dir
($GPUHOP_CONTROL_DIR: one of the job's own dirs, which the agent reaches on its host and no
other job sees), made by this process once its framework is imported (the start-up hook's
after-import action; a process that never imports TensorFlow or JAX makes none). One daemon
thread waits in the kernel to open it for reading, which returns only when the agent opens it
to write a request: until then it takes no CPU time, holds no lock, opens no port and imports
nothing. Not a signal, because a user's program owns its signals (a handler of ours could be
replaced by its own, or run in the middle of its code; a signal nobody handles ends the
process); not a poll per training step, which only Keras's `fit` would run and which costs
every step of every job; not TensorFlow's profiler server, which listens on a TCP port for
the job's whole life (on every interface, with no authentication).

The capture itself runs in that thread: `tf.profiler.experimental.start(logdir)`, the
duration, `stop()` (or `jax.profiler.start_trace`/`stop_trace`), which profile the whole
process whichever thread calls them, as a TensorBoard `profile_batch` would. What it did is
written to `profile-PID-REQUEST.json` beside the FIFO (with `traced`: when the profiler
started and stopped tracing, which bench/profiling.py compares the job's steps in); the
agent reads no more from it than whether it worked and why not, and finds the files itself.

The profiler runs with TensorFlow's default options (host tracer level 2, Python tracer off):
op statistics are built from the TF op events that level 2 records. TensorFlow 2.21's
binding drops a `ProfilerOptions` given from Python anyway ("host_tracer_level expects an
i value": its options map takes every Python int for a bool).

Step markers: the profile plugin splits a trace into training steps (the overview's step
times, the input pipeline's analysis) only where the program marks them. tf-keras's `fit`
does; Keras 3's does not. While a capture runs, and only then, `step_marker` gives gpuhop's
Keras callback (`gpuhop.runtime.callbacks`) a marker to wrap each train batch in.

Standard library only; the framework is the one already imported.
"""

from __future__ import annotations

import _thread
import json
import os
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = ["CONTROL_ENV", "fifo_name", "listen", "listening", "result_name", "step_marker"]

CONTROL_ENV = "GPUHOP_CONTROL_DIR"
# A request is one short JSON line; more than this is not one of the agent's.
MAX_REQUEST = 4096
# The longest capture a request may ask for (the agent refuses more before asking).
MAX_SECONDS = 300.0

# (pid, framework) of the process that made its FIFO and thread; a forked child inherits this
# but neither the thread nor the FIFO, which are its parent's.
_listening: list[tuple[int, str]] = []
_listen_lock = _thread.allocate_lock()
# The framework whose capture runs in this process now, while one runs (for `step_marker`).
_capturing: list[str] = []


def fifo_name(pid: int) -> str:
    """The FIFO of the process `pid` (its pid as the job sees it)."""
    return f"profile-{pid}.fifo"


def result_name(pid: int, request: str) -> str:
    """What the process `pid` writes when it has done the request `request`."""
    return f"profile-{pid}-{request}.json"


def listen(framework: str) -> str:
    """Make this process's FIFO and start the thread that waits on it, once per process:
    the start-up hook asks after `import tensorflow` and after `import jax`, and a
    TensorFlow process imports both (TensorFlow 2.21 imports JAX where it is installed).
    `framework` names the import that asked; a capture uses the framework that runs the job
    by then."""
    control = os.environ.get(CONTROL_ENV, "")
    if not control or not os.path.isdir(control):
        return "no control dir: gpuhop profile cannot reach this process"
    with _listen_lock:
        if listening():
            return f"already waiting for profile requests (since import {_listening[0][1]})"
        import atexit

        pid = os.getpid()
        fifo = os.path.join(control, fifo_name(pid))
        try:  # noqa: SIM105 - contextlib costs milliseconds to import
            os.unlink(fifo)  # a process of an earlier attempt with this pid left it
        except FileNotFoundError:
            pass
        os.mkfifo(fifo, 0o600)
        _listening[:] = [(pid, framework)]
        atexit.register(_forget, fifo, pid)
        _thread.start_new_thread(_serve, (control, fifo))
    return f"waits for gpuhop profile requests (after import {framework}), idle until one comes"


def listening() -> bool:
    """Whether this process waits for profile requests (so a capture may start in it)."""
    return bool(_listening) and _listening[0][0] == os.getpid()


def step_marker(step: int) -> Any:
    """While a capture runs: a training step's marker in its trace, entered (the caller
    exits it when the step ends); None otherwise. TensorFlow's is a root `Trace` with the
    step's number (`_r=1` makes it a step marker, as tf-keras's own `fit` makes them);
    JAX's a `StepTraceAnnotation`."""
    if not _capturing:
        return None
    if _capturing[0] == "jax":
        marker = sys.modules["jax"].profiler.StepTraceAnnotation("train", step_num=step)
    else:
        trace = sys.modules["tensorflow"].profiler.experimental.Trace
        marker = trace("train", step_num=step, _r=1)
    marker.__enter__()
    return marker


def _forget(fifo: str, pid: int) -> None:
    if os.getpid() != pid:
        return  # a forked child exiting: the FIFO is its parent's, still in use
    try:  # noqa: SIM105 - contextlib costs milliseconds to import
        os.unlink(fifo)
    except OSError:
        pass


def _serve(control: str, fifo: str) -> None:
    while True:
        try:
            request = _next_request(fifo)
        except OSError:
            return  # the FIFO is gone (the job's files were removed): nothing more to do
        if request is None:
            continue
        _answer(control, request)


def _next_request(fifo: str) -> dict[str, Any] | None:
    # Blocks in the kernel until a writer opens the FIFO: the agent, with a request.
    fd = os.open(fifo, os.O_RDONLY)
    try:
        data = b""
        while len(data) <= MAX_REQUEST and (chunk := os.read(fd, MAX_REQUEST)):
            data += chunk
    finally:
        os.close(fd)
    try:
        request = json.loads(data)
        seconds = float(request["seconds"])
        name = str(request["id"])
    except (ValueError, KeyError, TypeError):
        return None
    if not (0 < seconds <= MAX_SECONDS) or not name.isalnum():
        return None
    return {"seconds": seconds, "id": name}


def _answer(control: str, request: dict[str, Any]) -> None:
    framework = _framework()
    started = time.time()
    try:
        logdir = os.environ.get("GPUHOP_TENSORBOARD_DIR") or ""
        if not logdir:
            raise RuntimeError("$GPUHOP_TENSORBOARD_DIR is not set in this process")
        os.makedirs(logdir, exist_ok=True)
        traced = _capture(framework, logdir, request["seconds"])
        result: dict[str, Any] = {"ok": True, "framework": framework, "traced": traced}
    except Exception as e:  # the job goes on; the agent says why there is no profile
        result = {"ok": False, "framework": framework, "error": f"{type(e).__name__}: {e}"}
    result["seconds"] = round(time.time() - started, 3)
    path = os.path.join(control, result_name(os.getpid(), request["id"]))
    with open(f"{path}.tmp", "w") as f:
        json.dump(result, f)
    os.replace(f"{path}.tmp", path)


def _framework() -> str:
    """The framework whose profiler sees this process's work: JAX where Keras runs on it
    (TensorFlow may be loaded beside it for tf.data), else TensorFlow if loaded, else JAX."""
    if "jax" in sys.modules:
        keras = sys.modules.get("keras")
        backend = getattr(getattr(keras, "backend", None), "backend", None)
        on_jax = backend is not None and backend() == "jax"
        if on_jax or "tensorflow" not in sys.modules:
            return "jax"
    return "tensorflow"


def _capture(framework: str, logdir: str, seconds: float) -> list[float]:
    """Run the profiler for `seconds` and write its trace. Returns when (epoch seconds) it
    started and when it stopped tracing, before the trace was written: the window a
    benchmark compares the job's steps in."""
    if framework == "jax":
        profiler: Any = sys.modules["jax"].profiler
        start, stop = profiler.start_trace, profiler.stop_trace
    else:
        experimental = sys.modules["tensorflow"].profiler.experimental
        start, stop = experimental.start, experimental.stop
    start(logdir)
    started = time.time()
    # Steps are marked only between start and stop: a marker made outside costs a step
    # something and shows nowhere.
    _capturing.append(framework)
    try:
        time.sleep(seconds)
    finally:
        _capturing.clear()
        stopped = time.time()
        stop()
    return [round(started, 3), round(stopped, 3)]
