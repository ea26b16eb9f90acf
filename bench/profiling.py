"""Profiling: what `gpuhop profile` costs a Keras `fit` (real TensorFlow on the CPU): two small
fits of Dense layers, and keras-io's MNIST convnet.

- While a 5 s capture runs: the fit's step time then (the steps wholly between the
  profiler's `start()` and `stop()`, as the job's process answers them), next to the same
  job's steps in the 5 s before the request; and while the trace is written after it
  (TensorFlow's `stop()`, to the answer). A gpuhop job, profiled through the SDK
  (`Job.profile(5)`).
- When never asked: the same script run directly with gpuhop's start-up hook and a job's
  environment, once with `$GPUHOP_CONTROL_DIR` (a gpuhop job's: the process makes its FIFO
  and its waiting thread after `import keras`, and `fit` gets the idle step-marker callback)
  and once without (what a job had before `gpuhop profile`): launch → "ready" (after
  `import keras`) and the fit's step time. Only that variable differs.

The script times each train batch itself (a callback's clock, batch end to batch end).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import PYTHON, BenchError, Row, Settings, private_agent, run_checked, time_first_line

from gpuhop.api import JobState
from gpuhop.home import AgentPaths
from gpuhop.runtime import hook

NAME = "profiling"
CAPTURE = 5.0
# Steps the direct runs time (after 20 of warm-up, which include tracing).
STEPS = 400
WARMUP = 20

# A Keras fit that times its batches: `steps.py UNTIL MODEL BATCH`, MODEL a number (64
# inputs, a hidden Dense layer of that many units, 10 outputs) or "convnet" (keras-io's MNIST
# convnet, on random 28x28 images), batches of BATCH; until it has UNTIL of them, or, with
# UNTIL "stop", until the file `stop` appears in $GPUHOP_ARTIFACTS_DIR; then writes
# [[end, seconds], ...] to steps.json there. Prints "ready" once Keras is imported,
# "training" once warm.
SCRIPT = """\
import json, os, sys, time
import keras
import numpy as np

print("ready", flush=True)
base = os.environ["GPUHOP_ARTIFACTS_DIR"]
until, shape, batch = sys.argv[1], sys.argv[2], int(sys.argv[3])
layers = keras.layers
if shape == "convnet":  # keras-io's "Simple MNIST convnet"
    x = np.random.rand(16 * batch, 28, 28, 1).astype("float32")
    model = keras.Sequential([
        keras.Input((28, 28, 1)),
        layers.Conv2D(32, 3, activation="relu"), layers.MaxPooling2D(2),
        layers.Conv2D(64, 3, activation="relu"), layers.MaxPooling2D(2),
        layers.Flatten(), layers.Dropout(0.5), layers.Dense(10),
    ])
else:
    x = np.random.rand(64 * batch, 64).astype("float32")
    model = keras.Sequential(
        [keras.Input((64,)), layers.Dense(int(shape), activation="relu"), layers.Dense(10)]
    )
y = np.random.randint(0, 10, len(x))
model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
steps = []

class Clock(keras.callbacks.Callback):
    last = None

    def on_train_batch_end(self, batch, logs=None):
        now = time.time()
        if self.last is not None:
            steps.append((now, now - self.last))
        self.last = now
        if len(steps) == {warmup}:
            print("training", flush=True)
        done = len(steps) >= int(until) if until.isdigit() else (
            len(steps) % 50 == 0 and os.path.exists(os.path.join(base, "stop")))
        if done:
            self.model.stop_training = True

model.fit(x, y, epochs=10**6, batch_size=batch, verbose=0, callbacks=[Clock()])
with open(os.path.join(base, "steps.json"), "w") as f:
    json.dump(steps, f)
""".replace("{warmup}", str(WARMUP))


def _ms(steps: list[list[float]], start: float, end: float, wholly: bool = False) -> float:
    """Median time (ms) of the steps that ran during [start, end): wholly, or (by default)
    wholly or in part (a window short next to a step still has the one that spans it)."""
    if wholly:
        inside = [seconds for at, seconds in steps if at - seconds >= start and at <= end]
    else:
        inside = [seconds for at, seconds in steps if at > start and at - seconds < end]
    if not inside:
        raise BenchError(f"no step ran between {start:.2f} and {end:.2f}")
    return 1000 * statistics.median(inside)


# The fits the captures run on: (model, batch size). A small one (steps of a few ms on a
# CPU: a trace of every op is then a large share of a step), a larger one, and a tutorial's
# (keras-io's MNIST convnet, at its batch size).
SIZES = [("256", 64), ("2048", 512), ("convnet", 128)]
# The fit the runs never profiled use.
DIRECT_SIZE = SIZES[0]


def _fit(size: tuple[str, int]) -> str:
    model = "keras-io's MNIST convnet" if size[0] == "convnet" else f"Dense 64→{size[0]}→10"
    return f"Keras fit ({model}, batch {size[1]}, CPU)"


def _while_capturing(
    root: Path, project: Path, repeats: int
) -> dict[tuple[str, int], dict[str, list[float]]]:
    """For each of SIZES, median step times (ms) per capture: in the 5 s before it, during
    it, while its trace is written; and the seconds from the request to the answer."""
    found: dict[tuple[str, int], dict[str, list[float]]] = {}
    with private_agent(root / "agent") as agent, agent.client() as client:
        # Read TensorFlow's libraries into the page cache first.
        run_checked([PYTHON, "-c", "import tensorflow"], env=agent.env)
        for size in SIZES:
            found[size] = _captures(
                agent.home,
                client.submit(["steps.py", "stop", size[0], str(size[1])], workdir=project),
                repeats,
            )
    return found


def _captures(home: Path, job: Any, repeats: int) -> dict[str, list[float]]:
    found: dict[str, list[float]] = {
        k: [] for k in ("before", "during", "writing", "answer", "late")
    }
    deadline = time.monotonic() + 300
    while b"training" not in b"".join(job.logs()):
        if job.refresh().state.finished or time.monotonic() > deadline:
            raise BenchError(f"job {job.id} did not start training: {job.info.reason}")
        time.sleep(0.1)
    windows = []
    for _ in range(repeats):
        time.sleep(CAPTURE + 1)  # the window before, clear of the last capture's writing
        started = time.time()
        profile = job.profile(CAPTURE)
        if profile.profiler != "tensorflow":
            raise BenchError(f"job {job.id} was profiled by {profile.profiler}")
        windows.append((started, time.time()))
    artifacts = AgentPaths(home).jobs / job.id / "artifacts"
    (artifacts / "stop").touch()
    if job.wait(timeout=120).state != JobState.succeeded:
        raise BenchError(f"job {job.id} {job.info.state.value}: {job.info.reason}")
    steps = json.loads((artifacts / "steps.json").read_text())
    for (started, answered), (on, off) in zip(windows, _traced(home, job.id), strict=True):
        found["before"].append(_ms(steps, started - CAPTURE, started))
        found["during"].append(_ms(steps, on, off, wholly=True))
        found["writing"].append(_ms(steps, off, answered))
        found["answer"].append(answered - started)
        found["late"].append(on - started)
    return found


def _traced(home: Path, job_id: str) -> list[tuple[float, float]]:
    """When each capture of the job traced (epoch seconds, from and to), in order: what
    its process answered the agent (gpuhop.runtime.profiling)."""
    answers = (AgentPaths(home).jobs / job_id / "control").glob("profile-*-*.json")
    return sorted(tuple(json.loads(path.read_text())["traced"]) for path in answers)


def _idle_marker_us() -> float:
    """Microseconds a train batch costs the step-marker callback when no capture runs."""
    code = (
        "import timeit, keras\n"
        "from gpuhop.runtime.callbacks import step_markers_callback\n"
        "cb = step_markers_callback(keras)\n"
        "batch = lambda: (cb.on_train_batch_begin(0), cb.on_train_batch_end(0))\n"
        "print(min(timeit.repeat(batch, number=100_000, repeat=5)) * 10)\n"
    )
    out = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.split()[-1])


def _direct(root: Path, project: Path, repeats: int) -> dict[str, list[tuple[float, float]]]:
    """(launch → "ready" seconds, median step ms) per run, listening or not."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("GPUHOP_")}
    base.update(
        PYTHONPATH=hook.STARTUP_DIR,
        GPUHOP_JOB_ID="bench",
        GPUHOP_AUTO="1",
        GPUHOP_ARTIFACTS_DIR=str(root / "artifacts"),
        GPUHOP_TENSORBOARD_DIR=str(root / "artifacts" / "tensorboard"),
        GPUHOP_METRICS_FILE=str(root / "artifacts" / "metrics.jsonl"),
        TF_CPP_MIN_LOG_LEVEL="2",
    )
    (root / "artifacts").mkdir(parents=True)
    (root / "control").mkdir()
    envs = {"listening": {**base, "GPUHOP_CONTROL_DIR": str(root / "control")}, "not": base}
    found: dict[str, list[tuple[float, float]]] = {name: [] for name in envs}
    argv = [PYTHON, "steps.py", str(STEPS), DIRECT_SIZE[0], str(DIRECT_SIZE[1])]
    time_first_line(argv, project, envs["not"])  # warm up: the page cache
    for _ in range(repeats):
        for name, env in envs.items():
            ready, _exit = time_first_line(argv, project, env, b"ready")
            steps = json.loads((root / "artifacts" / "steps.json").read_text())
            step = 1000 * statistics.median(seconds for _, seconds in steps[WARMUP:])
            found[name].append((ready, step))
    if os.listdir(root / "control"):
        raise BenchError(f"a process left files in {root / 'control'}")  # its FIFO, at exit
    return found


def run(settings: Settings) -> list[Row]:
    repeats = settings.repeats(default=3, quick=1)
    with tempfile.TemporaryDirectory(prefix="gpuhop-bench-") as tmp:
        root = Path(tmp)
        project = root / "project"
        project.mkdir()
        (project / "steps.py").write_text(SCRIPT)
        capturing = _while_capturing(root, project, repeats)
        direct = _direct(root / "direct", project, repeats)
    idle = _idle_marker_us()

    def column(name: str, index: int) -> list[float]:
        return [sample[index] for sample in direct[name]]

    rows = []
    for size, found in capturing.items():
        answer = statistics.median(found["answer"])
        late = statistics.median(found["late"])
        rows += [
            Row(
                NAME,
                f"{_fit(size)}: step time while a {CAPTURE:.0f} s capture runs",
                "ms",
                found["during"],
                f"the {CAPTURE:.0f} s before it",
                found["before"],
                "the steps wholly between the profiler's start() and stop() (which began"
                f" {late:.2f} s after the request): TensorFlow's profiler tracing every op,"
                " and gpuhop's step markers",
            ),
            Row(
                NAME,
                f"{_fit(size)}: step time while the capture's trace is written",
                "ms",
                found["writing"],
                f"the {CAPTURE:.0f} s before it",
                found["before"],
                f"stop(): request → answer took {answer:.1f} s in all (median)",
            ),
        ]
    return [
        *rows,
        Row(
            NAME,
            "python steps.py with gpuhop's hook: launch → 'ready' (import keras)",
            "s",
            column("listening", 0),
            "the same without $GPUHOP_CONTROL_DIR",
            column("not", 0),
            "never profiled: the FIFO and its idle thread (wanted: 1.00x)",
        ),
        Row(
            NAME,
            f"{_fit(DIRECT_SIZE)}: step time, never profiled",
            "ms",
            column("listening", 1),
            "the same without $GPUHOP_CONTROL_DIR",
            column("not", 1),
            f"median of {STEPS} steps; the idle step-marker callback costs {idle:.2f} µs a"
            " batch (timeit) (wanted: 1.00x)",
        ),
    ]
