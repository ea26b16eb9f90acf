"""Overhead: training speed of examples/digits/train.py (real TensorFlow on the CPU) under
`gpuhop run`, next to the same script run directly with `python train.py`.

Both run from a private copy of the example (so the direct run's artifacts land in a temp
dir) with the same environment, output to a file. Reports the whole command's wall time and
Keras's own step time over epochs 2..N (epoch 1 includes tracing: a warm-up).
"""

from __future__ import annotations

import re
import shutil
import statistics
import tempfile
from pathlib import Path

from harness import PYTHON, REPO, BenchError, Row, Settings, private_agent, run_checked, timed_run

NAME = "overhead"
EPOCHS = 3
# Keras `verbose=2` epoch lines: "45/45 - 1s - 13ms/step - accuracy: ...".
STEP_TIME = re.compile(rb" - (\d+(?:\.\d+)?)(s|ms|us)/step")
TO_MS = {b"s": 1000.0, b"ms": 1.0, b"us": 0.001}


def steps_per_second(log: bytes) -> float:
    """Training steps per second over epochs 2..N, from Keras's per-epoch step times."""
    times = [float(value) * TO_MS[unit] for value, unit in STEP_TIME.findall(log)]
    if len(times) != EPOCHS:
        raise BenchError(f"expected {EPOCHS} epoch lines with a step time, found {len(times)}")
    return 1000.0 / statistics.mean(times[1:])


def run(settings: Settings) -> list[Row]:
    repeats = settings.repeats(default=2, quick=1)
    script_args = ["train.py", "--epochs", str(EPOCHS)]
    commands = {
        "gpuhop": [PYTHON, "-m", "gpuhop", "run", *script_args],
        "python": [PYTHON, *script_args],
    }
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
    with tempfile.TemporaryDirectory(prefix="gpuhop-bench-") as tmp:
        root = Path(tmp)
        project = root / "project"
        project.mkdir()
        for name in ("train.py", "drawn_digits.py"):
            shutil.copy(REPO / "examples" / "digits" / name, project)
        with private_agent(root / "agent") as agent:
            # Read TensorFlow's libraries into the page cache, so neither side pays the disk.
            run_checked([PYTHON, "-c", "import tensorflow"], env=agent.env)
            for _ in range(repeats):
                for name, argv in commands.items():
                    log = root / f"{name}.log"
                    with open(log, "wb") as out:
                        wall = timed_run(argv, project, agent.env, stdout=out)
                    samples[name].append((wall, steps_per_second(log.read_bytes())))

    def column(name: str, index: int) -> list[float]:
        return [sample[index] for sample in samples[name]]

    what = f"digits train.py --epochs {EPOCHS}"
    return [
        Row(
            NAME,
            f"{what}: wall time",
            "s",
            column("gpuhop", 0),
            "python train.py",
            column("python", 0),
            "whole command: start, import TensorFlow, train, evaluate, export",
        ),
        Row(
            NAME,
            f"{what}: training speed, epochs 2..{EPOCHS}",
            "steps/s",
            column("gpuhop", 1),
            "python train.py",
            column("python", 1),
            "from Keras's ms/step (whole milliseconds: coarse)",
        ),
    ]
