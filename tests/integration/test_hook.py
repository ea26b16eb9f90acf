"""The start-up hook in real Python interpreters, started with a share job's environment.

A stand-in `tensorflow` package (a real module on the path, which records what is asked of
it and can pretend to have GPUs) shows what the hook does on a GPU host; the real
TensorFlow runs in tests/e2e/test_gpu_sharing.py and, on a GPU host, at the end here.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuhop.runtime import hook
from tests.conftest import REPO

# A stand-in for TensorFlow's parts the hook touches, shaped like the real ones: the
# public tf.config functions go through the one eager context, which refuses memory growth
# on a GPU that has a logical device configuration, as TensorFlow does.
FAKE_TF = """
from tensorflow.python.eager import context as _context

print("fake tf: module body ran", flush=True)
__version__ = "0.0-fake"
calls = _context.context().calls


class _Experimental:
    def set_memory_growth(self, device, enable):
        _context.context().set_memory_growth(device, enable)


class _Config:
    experimental = _Experimental()

    class LogicalDeviceConfiguration:
        def __init__(self, memory_limit=None):
            self.memory_limit = memory_limit

    def list_physical_devices(self, kind):
        return _context.context().list_physical_devices(kind)

    def set_logical_device_configuration(self, device, configs):
        _context.context().set_logical_device_configuration(device, configs)


config = _Config()
"""

FAKE_CONTEXT = """
import json
import os


class Context:
    def __init__(self):
        self.calls = []
        self.virtual = {}

    def list_physical_devices(self, kind):
        n = int(os.environ.get("FAKE_TF_GPUS", "0")) if kind == "GPU" else 0
        return [f"GPU:{i}" for i in range(n)]

    def set_logical_device_configuration(self, device, configs):
        if os.environ.get("FAKE_TF_FAIL"):
            raise RuntimeError("Virtual devices cannot be modified after being initialized")
        limits = [c.memory_limit for c in configs]
        self.virtual[device] = limits
        self.calls.append((device, limits))
        print(f"fake tf: {device} capped at {limits}", flush=True)

    def set_memory_growth(self, device, enable):
        if device in self.virtual:
            raise ValueError("Cannot set memory growth on device when virtual devices configured")
        print(f"fake tf: growth on {device}: {enable}", flush=True)


_context = None


def context():
    global _context
    if _context is None:
        _context = Context()
    return _context
"""

USER_SCRIPT = """
import sys
print("user: before import", flush=True)
import tensorflow as tf
print("user: first line after import; calls:", tf.calls, flush=True)
import gpuhop.runtime.hook as hook
print("user: applied:", hook.applied, flush=True)
"""


@pytest.fixture
def fake_tf(tmp_path: Path) -> Path:
    root = tmp_path / "fake-tf"
    eager = root / "tensorflow" / "python" / "eager"
    eager.mkdir(parents=True)
    (root / "tensorflow" / "__init__.py").write_text(FAKE_TF)
    (root / "tensorflow" / "python" / "__init__.py").write_text("")
    (eager / "__init__.py").write_text("")
    (eager / "context.py").write_text(FAKE_CONTEXT)
    return root


def run_python(
    code: str, *paths: Path | str, cwd: Path, **env: str
) -> subprocess.CompletedProcess[str]:
    """`python -c CODE` with a job's environment: the hook's dir first on PYTHONPATH."""
    # Without the quiet start (TF_CPP_MIN_LOG_LEVEL), unless a test asks for it.
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("GPUHOP_", "PYTHON", "TF_CPP_MIN_LOG_LEVEL"))
    }
    pythonpath = os.pathsep.join([hook.STARTUP_DIR, *map(str, paths), str(REPO / "src")])
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        env={**base, "PYTHONPATH": pythonpath, "PYTHONUNBUFFERED": "1", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


SHARE_JOB = {"GPUHOP_JOB_ID": "ab12cd34", "GPUHOP_GPU_MEMORY_MB": "4096"}


def test_the_cap_is_set_right_after_import_and_before_the_scripts_next_line(fake_tf, tmp_path):
    run = run_python(USER_SCRIPT, fake_tf, cwd=tmp_path, FAKE_TF_GPUS="2", **SHARE_JOB)

    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == [
        "user: before import",
        "fake tf: module body ran",
        "fake tf: GPU:0 capped at [4096]",
        "fake tf: GPU:1 capped at [4096]",
        "user: first line after import; calls: [('GPU:0', [4096]), ('GPU:1', [4096])]",
        "user: applied: {'gpu_memory_limit': 'capped 2 GPU(s) at 4096 MB;"
        " set_memory_growth on them is a no-op'}",
    ]
    assert run.stderr == ""


def test_a_script_that_turns_on_memory_growth_still_runs_under_the_cap(fake_tf, tmp_path):
    # The usual first lines of a TensorFlow script; TensorFlow would refuse them on a GPU
    # with a memory limit.
    code = (
        "import tensorflow as tf\n"
        "for gpu in tf.config.list_physical_devices('GPU'):\n"
        "    tf.config.experimental.set_memory_growth(gpu, True)\n"
        "print('user: growth set')\n"
    )
    capped = run_python(code, fake_tf, cwd=tmp_path, FAKE_TF_GPUS="1", **SHARE_JOB)
    plain = run_python(code, fake_tf, cwd=tmp_path, FAKE_TF_GPUS="1", GPUHOP_JOB_ID="x")

    assert capped.returncode == 0, capped.stderr
    assert capped.stdout.splitlines()[-2:] == [
        "fake tf: GPU:0 capped at [4096]",
        "user: growth set",
    ]
    # Without a cap the call reaches TensorFlow as before.
    assert plain.stdout.splitlines()[-2:] == ["fake tf: growth on GPU:0: True", "user: growth set"]


def test_without_gpus_the_cap_does_nothing_and_says_so_when_asked(fake_tf, tmp_path):
    run = run_python(USER_SCRIPT, fake_tf, cwd=tmp_path, GPUHOP_HOOK_VERBOSE="1", **SHARE_JOB)

    assert run.returncode == 0, run.stderr
    assert "calls: []" in run.stdout
    assert run.stderr == (
        "gpuhop: after import tensorflow (0.0-fake): gpu_memory_limit:"
        " no GPU visible to TensorFlow; nothing to cap at 4096 MB\n"
    )


@pytest.mark.parametrize(
    ("env", "error"),
    [
        ({"FAKE_TF_FAIL": "1", "FAKE_TF_GPUS": "1"}, "RuntimeError: Virtual devices cannot"),
        ({"GPUHOP_GPU_MEMORY_MB": "lots"}, "ValueError: invalid literal"),
    ],
)
def test_a_failing_action_prints_one_line_and_the_script_goes_on(fake_tf, tmp_path, env, error):
    run = run_python(USER_SCRIPT, fake_tf, cwd=tmp_path, **{**SHARE_JOB, **env})

    assert run.returncode == 0, run.stderr
    assert "user: applied: {}" in run.stdout
    [line] = run.stderr.splitlines()
    assert line.startswith("gpuhop: could not cap TensorFlow's GPU memory at ")
    assert error in line and line.endswith("the job goes on without it")


def test_the_users_own_sitecustomize_still_runs_after_ours(fake_tf, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "sitecustomize.py").write_text("print('user sitecustomize ran', flush=True)\n")
    code = USER_SCRIPT + "import sitecustomize; print('sitecustomize is', sitecustomize.__file__)\n"

    run = run_python(code, mine, fake_tf, cwd=tmp_path, FAKE_TF_GPUS="1", **SHARE_JOB)

    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0] == "user sitecustomize ran"  # once, before the script
    assert lines.count("user sitecustomize ran") == 1
    assert "fake tf: GPU:0 capped at [4096]" in lines
    # `import sitecustomize` finds the user's, as it would without gpuhop.
    assert lines[-1] == f"sitecustomize is {mine / 'sitecustomize.py'}"


def test_an_error_in_the_users_sitecustomize_is_reported_as_python_reports_it(fake_tf, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "sitecustomize.py").write_text("raise KeyError('oops')\n")

    run = run_python(USER_SCRIPT, mine, fake_tf, cwd=tmp_path, FAKE_TF_GPUS="1", **SHARE_JOB)

    assert run.returncode == 0
    assert "Error in sitecustomize; set PYTHONVERBOSE for traceback:\nKeyError: 'oops'" in (
        run.stderr
    )
    assert "fake tf: GPU:0 capped at [4096]" in run.stdout  # the hook was in place first


LOADED = (
    "import sys; print(sorted(m for m in ('_gpuhop_hook', 'gpuhop', 'tensorflow')"
    " if m in sys.modules),"
    " [i for i, f in enumerate(sys.meta_path) if hasattr(f, 'gpuhop_watcher')])"
)


def test_outside_a_gpuhop_job_it_loads_nothing(tmp_path):
    run = run_python(LOADED, cwd=tmp_path, GPUHOP_GPU_MEMORY_MB="4096")

    assert (run.returncode, run.stdout, run.stderr) == (0, "[] []\n", "")


def test_in_a_job_it_never_imports_tensorflow_itself(tmp_path):
    run = run_python(LOADED, cwd=tmp_path, **SHARE_JOB)

    # Only the hook's own module (not even the gpuhop package), and its finder waiting first
    # in line.
    assert (run.returncode, run.stdout, run.stderr) == (
        0,
        "['_gpuhop_hook'] [0]\n",
        "",
    )


def test_a_job_that_wants_no_action_installs_no_finder(tmp_path):
    run = run_python(LOADED, cwd=tmp_path, GPUHOP_JOB_ID="ab12cd34")

    assert (run.returncode, run.stdout) == (0, "['_gpuhop_hook'] []\n")


@pytest.mark.gpu
@pytest.mark.tf
def test_on_a_real_gpu_tensorflow_gets_the_cap(tmp_path):
    if importlib.util.find_spec("tensorflow") is None:
        pytest.skip("TensorFlow is not installed")
    code = (
        "import tensorflow as tf\n"
        "gpus = tf.config.list_physical_devices('GPU')\n"
        "if not gpus:  # a CPU build, or one without its CUDA libraries (tensorflow[and-cuda])\n"
        "    print('skip: TensorFlow', tf.__version__, 'sees no GPU here (CUDA build:',\n"
        "          f'{tf.test.is_built_with_cuda()}; `gpuhop doctor` says why)')\n"
        "    raise SystemExit\n"
        "tf.config.experimental.set_memory_growth(gpus[0], True)  # tolerated under the cap\n"
        "conf = [tf.config.get_logical_device_configuration(g) for g in gpus]\n"
        "print([c.memory_limit for cs in conf for c in cs])\n"
        "print(len(tf.config.list_logical_devices('GPU')))\n"
    )
    run = run_python(code, cwd=tmp_path, CUDA_VISIBLE_DEVICES="0", **SHARE_JOB)

    assert run.returncode == 0, run.stderr
    skip_as_the_job_says(run)
    assert run.stdout.splitlines()[-2:] == ["[4096]", "1"]


def skip_as_the_job_says(run: subprocess.CompletedProcess[str]) -> None:
    """Skip where the job's last line says why it could not test (`skip: ...`): a framework
    that cannot use this GPU host's GPUs (its CPU build; `gpuhop doctor`'s GPU test, which
    runs here too, says what is wrong with TensorFlow)."""
    last = (run.stdout.splitlines() or [""])[-1]
    if last.startswith("skip: "):
        pytest.skip(last.removeprefix("skip: "))


# A stand-in for PyTorch's parts the hook touches: torch.cuda's availability, device count
# and per-process memory fraction, which the real one applies to its caching allocator.
FAKE_TORCH = """
import json
import os


class _Cuda:
    fractions = []

    def is_available(self):
        return int(os.environ.get("FAKE_TORCH_GPUS", "0")) > 0

    def device_count(self):
        return int(os.environ.get("FAKE_TORCH_GPUS", "0"))

    def set_per_process_memory_fraction(self, fraction, device):
        self.fractions.append((device, fraction))


cuda = _Cuda()
__version__ = "0.0-fake"
"""

TORCH_SCRIPT = """
import torch
print("user: first line after import; fractions:", torch.cuda.fractions, flush=True)
"""


@pytest.fixture
def fake_torch(tmp_path: Path) -> Path:
    root = tmp_path / "fake-torch"
    (root / "torch").mkdir(parents=True)
    (root / "torch" / "__init__.py").write_text(FAKE_TORCH)
    return root


def test_pytorch_is_capped_at_the_share_right_after_import(fake_torch, tmp_path):
    share = {"GPUHOP_JOB_ID": "ab12cd34", "GPUHOP_GPU_MEMORY_FRACTION": "0.2500"}
    run = run_python(TORCH_SCRIPT, fake_torch, cwd=tmp_path, FAKE_TORCH_GPUS="1", **share)
    assert run.returncode == 0, run.stderr
    assert run.stdout == "user: first line after import; fractions: [(0, 0.25)]\n"

    # No GPU: nothing to cap, said when asked; a bad fraction: one line, and the job goes on.
    cpu = run_python(TORCH_SCRIPT, fake_torch, cwd=tmp_path, GPUHOP_HOOK_VERBOSE="1", **share)
    assert cpu.stderr == (
        "gpuhop: after import torch (0.0-fake): torch_memory_fraction:"
        " no GPU visible to PyTorch; nothing to cap at 0.250 of one\n"
    )
    bad = {**share, "GPUHOP_GPU_MEMORY_FRACTION": "2"}
    wrong = run_python(TORCH_SCRIPT, fake_torch, cwd=tmp_path, FAKE_TORCH_GPUS="1", **bad)
    assert wrong.returncode == 0
    assert "fractions: []" in wrong.stdout
    assert wrong.stderr.startswith("gpuhop: could not cap PyTorch's GPU memory at 2 of the GPU")


@pytest.mark.gpu
def test_on_a_real_gpu_pytorch_fails_past_its_share(tmp_path):
    # find_spec, not importorskip: PyTorch is imported by the job, not by pytest.
    if importlib.util.find_spec("torch") is None:
        pytest.skip("PyTorch is not installed")
    code = (
        "import torch\n"
        "if torch.version.cuda is None:\n"
        "    print('skip: PyTorch', torch.__version__, 'is a CPU build')\n"
        "    raise SystemExit\n"
        "total = torch.cuda.get_device_properties(0).total_memory\n"
        "torch.empty(int(total * 0.05), dtype=torch.uint8, device='cuda')  # within the share\n"
        "try:\n"
        "    torch.empty(int(total * 0.2), dtype=torch.uint8, device='cuda')\n"
        "except torch.cuda.OutOfMemoryError:\n"
        "    print('out of memory past the share')\n"
    )
    share = {"GPUHOP_JOB_ID": "ab12cd34", "GPUHOP_GPU_MEMORY_FRACTION": "0.1"}
    run = run_python(code, cwd=tmp_path, CUDA_VISIBLE_DEVICES="0", **share)

    assert run.returncode == 0, run.stderr
    skip_as_the_job_says(run)
    assert run.stdout.splitlines()[-1:] == ["out of memory past the share"]


# A stand-in for what JAX does at import and exit: an exit handler, registered while it
# loads, drops its backends; asked after that, it starts a new one with nothing in use.
FAKE_JAX = """
import atexit


class _Device:
    def __init__(self):
        self.in_use = self.peak = 0

    def memory_stats(self):
        return {"bytes_in_use": self.in_use, "peak_bytes_in_use": self.peak}


_backend = None


def local_devices():
    global _backend
    if _backend is None:
        _backend = [_Device()]
    return _backend


@atexit.register
def _clean_up():
    global _backend
    _backend = None
"""


def test_the_exit_report_reads_jax_before_jax_drops_its_backends(tmp_path):
    (tmp_path / "fake-jax" / "jax").mkdir(parents=True)
    (tmp_path / "fake-jax" / "jax" / "__init__.py").write_text(FAKE_JAX)
    metrics = tmp_path / "metrics.jsonl"
    code = (
        "import jax\n"
        "jax.local_devices()[0].peak = 3 << 30\n"
        "jax.local_devices()[0].in_use = 1 << 30\n"
    )
    job = {"GPUHOP_JOB_ID": "ab12cd34", "GPUHOP_AUTO": "1", "GPUHOP_METRICS_FILE": str(metrics)}
    run = run_python(code, tmp_path / "fake-jax", cwd=tmp_path, **job)

    assert run.returncode == 0, run.stderr
    [record] = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert (record["memory_mb"], record["memory_peak_mb"]) == (1024.0, 3072.0)


# `gpuhop profile`'s FIFO: TensorFlow 2.21 imports JAX (where it is installed) while it is
# imported itself, so both after-import actions run in one process.
FAKE_TF_WITH_JAX = "import jax\n__version__ = '2.21.0'\n"
PROFILE_REQUESTS = """\
import json, os, sys
import tensorflow
from gpuhop.runtime import profiling

control = os.environ["GPUHOP_CONTROL_DIR"]
print("fifos", json.dumps(sorted(os.listdir(control))), flush=True)
child = os.fork()
if child == 0:  # exits as a script does, running its atexit handlers
    print("child listening", profiling.listening(), flush=True)
    sys.exit(0)
os.waitpid(child, 0)
print("after the child", sorted(os.listdir(control)), flush=True)
"""


def test_a_tensorflow_process_that_imports_jax_makes_one_fifo_and_a_fork_leaves_it(tmp_path):
    fakes = tmp_path / "fakes"
    for name, code in (("tensorflow", FAKE_TF_WITH_JAX), ("jax", "__version__ = '0.10.2'\n")):
        (fakes / name).mkdir(parents=True)
        (fakes / name / "__init__.py").write_text(code)
    control = tmp_path / "control"
    control.mkdir()
    env = {"GPUHOP_JOB_ID": "ab12cd34", "GPUHOP_CONTROL_DIR": str(control)}
    run = run_python(PROFILE_REQUESTS, fakes, cwd=tmp_path, GPUHOP_HOOK_VERBOSE="1", **env)
    assert run.returncode == 0, run.stderr
    fifo = next(line for line in run.stdout.splitlines() if line.startswith("fifos"))
    [name] = json.loads(fifo.removeprefix("fifos "))
    assert name.startswith("profile-") and name.endswith(".fifo")
    said = [line for line in run.stderr.splitlines() if "_profile_requests" in line]
    assert len(said) == 2 and "already waiting for profile requests" in said[1], run.stderr
    # A forked child does not wait for requests (the thread is its parent's), and its exit
    # leaves its parent's FIFO; the parent's own exit removes it.
    assert "child listening False" in run.stdout
    assert f"after the child ['{name}']" in run.stdout
    assert list(control.iterdir()) == []
