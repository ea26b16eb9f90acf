"""The supervisor's pure parts: how a command becomes an argv and what environment a job gets."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from gpuhop.api.spec import JobSpec
from gpuhop.backends.base import Attempt
from gpuhop.backends.local.commands import StartError, resolve_command
from gpuhop.backends.local.jobenv import job_environment
from gpuhop.home import JobPaths
from gpuhop.runtime import hook

PYTHON = "/opt/agent/python"


def make_executable(path: Path, text: str = "#!/bin/sh\nexit 0\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.chmod(path, 0o755)
    return path


# -- resolve_command --------------------------------------------------------------------------


def test_python_script_in_the_work_dir_runs_with_the_agent_python(tmp_path: Path):
    (tmp_path / "train.py").write_text("")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "eval.py").write_text("")

    assert resolve_command(["train.py", "--lr", "0.1"], tmp_path, "", PYTHON) == [
        PYTHON,
        "train.py",
        "--lr",
        "0.1",
    ]
    assert resolve_command(["pkg/eval.py"], tmp_path, "", PYTHON) == [PYTHON, "pkg/eval.py"]


def test_dash_m_runs_a_module_with_the_jobs_python(tmp_path: Path):
    assert resolve_command(
        ["-m", "gpuhop.runtime.notebook", "run", "a.ipynb"], tmp_path, "", PYTHON
    ) == [
        PYTHON,
        "-m",
        "gpuhop.runtime.notebook",
        "run",
        "a.ipynb",
    ]
    with pytest.raises(StartError, match=r"-m needs a module name"):
        resolve_command(["-m"], tmp_path, "", PYTHON)


def test_missing_script_is_a_start_error_naming_it(tmp_path: Path):
    with pytest.raises(StartError, match=r"script train\.py is not in the job's work dir"):
        resolve_command(["train.py"], tmp_path, "/usr/bin", PYTHON)


def test_directory_named_like_a_script_is_not_a_script(tmp_path: Path):
    (tmp_path / "odd.py").mkdir()
    with pytest.raises(StartError, match=r"odd\.py"):
        resolve_command(["odd.py"], tmp_path, "", PYTHON)


def test_relative_executable_in_the_work_dir_resolves_to_its_full_path(tmp_path: Path):
    tool = make_executable(tmp_path / "bin" / "run.sh")

    assert resolve_command(["bin/run.sh", "x"], tmp_path, "", PYTHON) == [str(tool), "x"]
    assert resolve_command(["./bin/run.sh"], tmp_path, "", PYTHON) == [
        str(tmp_path / "./bin/run.sh")
    ]


def test_absolute_executable_is_used_as_given(tmp_path: Path):
    assert resolve_command([sys.executable, "-c", "pass"], tmp_path, "", PYTHON) == [
        sys.executable,
        "-c",
        "pass",
    ]


@pytest.mark.parametrize("mode", [0o644, None], ids=["not-executable", "missing"])
def test_path_that_is_not_an_executable_file_is_a_start_error(tmp_path: Path, mode: int | None):
    target = tmp_path / "bin" / "tool"
    if mode is not None:
        target.parent.mkdir()
        target.write_text("")
        os.chmod(target, mode)

    with pytest.raises(StartError, match=r"bin/tool is not an executable file"):
        resolve_command(["bin/tool"], tmp_path, "", PYTHON)


def test_bare_program_is_looked_up_on_the_given_path(tmp_path: Path):
    first = make_executable(tmp_path / "first" / "mytool")
    make_executable(tmp_path / "second" / "mytool")
    path_env = os.pathsep.join(
        [str(tmp_path / "empty"), str(first.parent), str(tmp_path / "second")]
    )

    assert resolve_command(["mytool", "-v"], tmp_path / "work", path_env, PYTHON) == [
        str(first),
        "-v",
    ]


def test_unknown_program_is_a_start_error_naming_it(tmp_path: Path):
    with pytest.raises(StartError, match=r"command 'no-such-prog' was not found.*PATH=/nowhere"):
        resolve_command(["no-such-prog"], tmp_path, "/nowhere", PYTHON)


# -- job_environment --------------------------------------------------------------------------


def record(
    gpu_ids: list[int],
    env: dict[str, str] | None = None,
    attempt: int = 1,
    gpu_memory_mb: int | None = None,
) -> Attempt:
    spec = JobSpec(name="train", env=env or {}, gpus=len(gpu_ids), gpu_memory_mb=gpu_memory_mb)
    return Attempt("ab12cd34", attempt, ["train.py"], gpu_ids, spec)


JP = JobPaths(Path("/home/agent/jobs/ab12cd34"))
BASE = {
    "PATH": "/usr/bin:/bin",
    "HOME": "/home/agent",
    "TF_CONFIG": '{"cluster": {}}',
    "CUDA_VISIBLE_DEVICES": "3",
    "GPUHOP_HOME": "/home/agent",
    "GPUHOP_REMOTE": "1",
    "GPUHOP_STRAY": "leaked",
}


def test_contract_variables_for_a_cpu_job():
    env = job_environment(record([], attempt=2), JP, BASE)

    assert env["GPUHOP_JOB_ID"] == "ab12cd34"
    assert env["GPUHOP_ATTEMPT"] == "2"
    assert env["GPUHOP_ARTIFACTS_DIR"] == "/home/agent/jobs/ab12cd34/artifacts"
    assert env["GPUHOP_CHECKPOINT_DIR"] == "/home/agent/jobs/ab12cd34/checkpoints"
    assert env["GPUHOP_TENSORBOARD_DIR"] == "/home/agent/jobs/ab12cd34/artifacts/tensorboard"
    assert env["GPUHOP_METRICS_FILE"] == "/home/agent/jobs/ab12cd34/metrics.jsonl"
    assert env["GPUHOP_PROVENANCE_FILE"] == "/home/agent/jobs/ab12cd34/ran-on.txt"
    # Set but empty: TensorFlow then sees no GPU at all, rather than every GPU.
    assert env["CUDA_VISIBLE_DEVICES"] == ""


def test_gpu_job_sees_exactly_its_gpus():
    assert job_environment(record([0, 1]), JP, BASE)["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert job_environment(record([5]), JP, BASE)["CUDA_VISIBLE_DEVICES"] == "5"


def test_agent_only_variables_are_scrubbed_and_the_rest_kept():
    env = job_environment(record([]), JP, BASE)

    assert "TF_CONFIG" not in env
    assert not {k for k in env if k.startswith("GPUHOP_")} - {
        "GPUHOP_JOB_ID",
        "GPUHOP_ATTEMPT",
        "GPUHOP_ARTIFACTS_DIR",
        "GPUHOP_CHECKPOINT_DIR",
        "GPUHOP_METRICS_FILE",
        "GPUHOP_PROVENANCE_FILE",
        "GPUHOP_CONTROL_DIR",
        "GPUHOP_TENSORBOARD_DIR",
        "GPUHOP_RETRIES",
        "GPUHOP_AUTO",
    }
    assert (env["PATH"], env["HOME"]) == ("/usr/bin:/bin", "/home/agent")
    # The caller's dict is not modified.
    assert BASE["GPUHOP_STRAY"] == "leaked"


def test_defaults_apply_only_where_nothing_else_says_otherwise():
    assert job_environment(record([]), JP, {})["PYTHONUNBUFFERED"] == "1"
    assert job_environment(record([]), JP, {})["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"

    host_says = job_environment(record([]), JP, {"TF_FORCE_GPU_ALLOW_GROWTH": "false"})
    assert host_says["TF_FORCE_GPU_ALLOW_GROWTH"] == "false"

    job_says = job_environment(record([], env={"PYTHONUNBUFFERED": "0"}), JP, {})
    assert job_says["PYTHONUNBUFFERED"] == "0"


def test_tensorflow_is_quiet_and_keras_fit_automatic_unless_the_job_says_otherwise():
    env = job_environment(record([]), JP, {})
    assert (env["TF_CPP_MIN_LOG_LEVEL"], env["GPUHOP_AUTO"]) == ("2", "1")
    # The hook is on every job's path, for Keras's fit and TensorFlow's start-up lines.
    assert env["PYTHONPATH"].split(os.pathsep)[0] == hook.STARTUP_DIR

    job_says = job_environment(
        record([], env={"TF_CPP_MIN_LOG_LEVEL": "0", "GPUHOP_AUTO": "0"}), JP, {}
    )
    assert (job_says["TF_CPP_MIN_LOG_LEVEL"], job_says["GPUHOP_AUTO"]) == ("0", "0")
    assert "PYTHONPATH" not in job_says  # nothing left for the hook to do


def test_a_share_is_a_fraction_of_its_gpu_for_jax_and_pytorch():
    env = job_environment(record([0], gpu_memory_mb=20480), JP, {}, gpu_total_mb=81920)
    assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.2500"
    assert env["GPUHOP_GPU_MEMORY_FRACTION"] == "0.2500"
    # A job may ask JAX for less, or for other allocator settings.
    own = record([0], env={"XLA_PYTHON_CLIENT_MEM_FRACTION": ".1"}, gpu_memory_mb=20480)
    assert (
        job_environment(own, JP, {}, gpu_total_mb=81920)["XLA_PYTHON_CLIENT_MEM_FRACTION"] == ".1"
    )
    # Not a share job: no fraction.
    assert "XLA_PYTHON_CLIENT_MEM_FRACTION" not in job_environment(record([0]), JP, {}, 81920)


def test_user_variables_apply_but_cannot_override_the_contract():
    job = record([1], env={"SEED": "7", "PATH": "/custom", "GPUHOP_JOB_ID": "forged"})

    env = job_environment(job, JP, BASE)

    assert (env["SEED"], env["PATH"]) == ("7", "/custom")
    assert env["GPUHOP_JOB_ID"] == "ab12cd34"
    assert env["CUDA_VISIBLE_DEVICES"] == "1"


def test_without_a_base_the_agent_environment_is_used(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("FROM_THE_AGENT", "yes")
    monkeypatch.setenv("GPUHOP_HOME", "/secret")
    monkeypatch.setenv("TF_CONFIG", "{}")

    env = job_environment(record([]), JP)

    assert env["FROM_THE_AGENT"] == "yes"
    assert "GPUHOP_HOME" not in env
    assert "TF_CONFIG" not in env


def test_gpu_indices_mean_what_nvml_and_nvidia_smi_mean():
    assert job_environment(record([1]), JP, BASE)["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    host = job_environment(record([1]), JP, {**BASE, "CUDA_DEVICE_ORDER": "FASTEST_FIRST"})
    assert host["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


def test_a_share_job_gets_its_cap_and_the_start_up_hook_first_on_pythonpath():
    env = job_environment(record([1], gpu_memory_mb=4096), JP, BASE)

    assert env["GPUHOP_GPU_MEMORY_MB"] == "4096"
    assert env["CUDA_VISIBLE_DEVICES"] == "1"
    assert env["PYTHONPATH"] == hook.STARTUP_DIR
    assert Path(hook.STARTUP_DIR, "sitecustomize.py").is_file()


def test_the_hook_keeps_the_pythonpath_the_host_or_the_user_set_after_it():
    host = job_environment(record([0], gpu_memory_mb=1), JP, {**BASE, "PYTHONPATH": "/lib/a"})
    user = job_environment(record([0], env={"PYTHONPATH": "src:vendor"}, gpu_memory_mb=1), JP, BASE)

    assert host["PYTHONPATH"] == os.pathsep.join([hook.STARTUP_DIR, "/lib/a"])
    assert user["PYTHONPATH"] == os.pathsep.join([hook.STARTUP_DIR, "src:vendor"])


def test_jobs_that_need_no_hook_keep_their_pythonpath_untouched():
    # `run --no-auto` (no Keras callbacks added), and TensorFlow's chatter left in.
    manual = {"GPUHOP_AUTO": "0", "TF_CPP_MIN_LOG_LEVEL": "0"}
    whole = job_environment(record([0], env=manual), JP, {**BASE, "PYTHONPATH": "/lib/a"})

    assert "GPUHOP_GPU_MEMORY_MB" not in whole
    assert whole["PYTHONPATH"] == "/lib/a"
    assert "PYTHONPATH" not in job_environment(record([], env=manual), JP, BASE)
