"""On a GPU host: a job's start and a PyTorch training run's speed through `gpuhop run
--gpus 1`, next to the same script run directly with `python`.

TensorFlow is what gpuhop is for, but the GPU hosts this project is lent have PyTorch and
no TensorFlow (FACTS.md); what this measures is the framework's own: the GPU job's start
(the scheduler's pick of a GPU, NVML, the sandbox) and whether anything of gpuhop's sits on
a training step's path (it should not: the job is the script, with CUDA_VISIBLE_DEVICES).
Skipped where PyTorch or a CUDA GPU is missing.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

from harness import PYTHON, BenchError, Row, Settings, private_agent, time_first_line, timed_run

NAME = "gpu_training"
STEPS = 300
# A small convolutional net on synthetic images, on the first visible GPU; prints its own
# step rate (timed between CUDA synchronisations, after a warm-up).
TRAIN = """
import sys, time
import torch

steps = int(sys.argv[1])
torch.manual_seed(0)
device = torch.device("cuda")
model = torch.nn.Sequential(
    torch.nn.Conv2d(3, 64, 3, padding=1), torch.nn.ReLU(),
    torch.nn.Conv2d(64, 128, 3, padding=1, stride=2), torch.nn.ReLU(),
    torch.nn.Conv2d(128, 256, 3, padding=1, stride=2), torch.nn.ReLU(),
    torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(256, 10),
).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
images = torch.randn(256, 3, 64, 64, device=device)
labels = torch.randint(0, 10, (256,), device=device)


def step():
    optimizer.zero_grad(set_to_none=True)
    loss = torch.nn.functional.cross_entropy(model(images), labels)
    loss.backward()
    optimizer.step()
    return loss


for _ in range(30):
    step()
torch.cuda.synchronize()
start = time.perf_counter()
for _ in range(steps):
    loss = step()
torch.cuda.synchronize()
seconds = time.perf_counter() - start
print(f"{torch.cuda.get_device_name(0)}: {steps / seconds:.2f} steps/s, loss {loss.item():.3f}")
"""
RATE = re.compile(rb": (\d+(?:\.\d+)?) steps/s")


def unavailable() -> str | None:
    """None where PyTorch sees a CUDA GPU here, else why not."""
    probe = subprocess.run(
        [PYTHON, "-c", "import torch; print(torch.cuda.device_count())"],
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        return "PyTorch is not installed"
    if probe.stdout.strip() in ("", "0"):
        return "PyTorch sees no CUDA GPU here"
    return None


def rate(log: Path) -> float:
    found = RATE.search(log.read_bytes())
    if found is None:
        raise BenchError(f"no step rate in the training log:\n{log.read_text()[-2000:]}")
    return float(found.group(1))


def run(settings: Settings) -> list[Row]:
    why = unavailable()
    if why is not None:
        return [Row(NAME, "PyTorch training on the GPU", "s", [], "python train.py", None,
                    f"skipped: {why}")]  # fmt: skip
    repeats = settings.repeats(default=3, quick=1)
    hello = {
        "gpuhop": [PYTHON, "-m", "gpuhop", "run", "--gpus", "1", "hello.py"],
        "python": [PYTHON, "hello.py"],
    }
    train = {
        "gpuhop": [PYTHON, "-m", "gpuhop", "run", "--gpus", "1", "train.py", str(STEPS)],
        "python": [PYTHON, "train.py", str(STEPS)],
    }
    starts: dict[str, list[float]] = {name: [] for name in hello}
    walls: dict[str, list[float]] = {name: [] for name in train}
    rates: dict[str, list[float]] = {name: [] for name in train}
    gpu = "the GPU"
    with tempfile.TemporaryDirectory(prefix="gpuhop-bench-") as tmp:
        root = Path(tmp)
        project = root / "project"
        project.mkdir()
        (project / "hello.py").write_text('print("hello")\n')
        (project / "train.py").write_text(TRAIN)
        with private_agent(root / "agent") as agent:
            env = {**agent.env, "CUDA_VISIBLE_DEVICES": "0"}  # the direct run's one GPU
            for argv in hello.values():  # warm up: first sync, page cache
                time_first_line(argv, project, env)
            for _ in range(max(repeats, 5)):
                for name, argv in hello.items():
                    starts[name].append(time_first_line(argv, project, env)[0])
            for _ in range(repeats):
                for name, argv in train.items():
                    log = root / f"{name}.log"
                    with open(log, "wb") as out:
                        walls[name].append(timed_run(argv, project, env, stdout=out))
                    rates[name].append(rate(log))
                    gpu = log.read_text().split(":")[0]
    what = f"PyTorch convnet, {STEPS} steps of 256 64x64 images on {gpu}"
    return [
        Row(NAME, "hello.py with --gpus 1: launch → first stdout line", "s", starts["gpuhop"],
            "python hello.py", starts["python"], "the GPU job's start: the floor is Python's"),
        Row(NAME, f"{what}: wall time", "s", walls["gpuhop"], "python train.py",
            walls["python"], "whole command: start, import torch, CUDA init, train"),
        Row(NAME, f"{what}: training speed", "steps/s", rates["gpuhop"], "python train.py",
            rates["python"], "timed in the script, between CUDA synchronisations"),
    ]  # fmt: skip
