"""The public surface: what `gpuhop` and `gpuhop.tf` export is the intended set, each name
imports, and importing them stays light (httpx's `test_exported_members`)."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpuhop.client import tfservers

# Spelled out here on purpose: a name added to or dropped from an `__all__` fails this test
# until it is added here too, which makes a change of the public surface a visible decision.
INTENDED = {
    "gpuhop": {"Client", "GpuhopError", "Job", "__version__"},
    "gpuhop.keras": {
        "artifacts_dir",
        "backup_callback",
        "callbacks",
        "checkpoint_dir",
        "metrics_callback",
        "tensorboard_callback",
        "tensorboard_dir",
    },
    "gpuhop.tf": {
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
    },
}


def _run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=120, cwd=cwd
    )


def _loaded_after(statement: str) -> set[str]:
    """The modules loaded in a fresh interpreter after running `statement`."""
    code = f"import json, sys\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    done = _run("-c", code)
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.splitlines()[-1]))


def _under(modules: set[str], *packages: str) -> set[str]:
    return {m for m in modules if any(m == p or m.startswith(p + ".") for p in packages)}


@pytest.mark.parametrize("module_name", sorted(INTENDED))
def test_all_lists_exactly_the_intended_names(module_name: str) -> None:
    module = importlib.import_module(module_name)
    assert len(module.__all__) == len(set(module.__all__)), "a name listed twice"
    assert set(module.__all__) == INTENDED[module_name]


@pytest.mark.parametrize("module_name", sorted(INTENDED))
def test_every_listed_name_imports(module_name: str) -> None:
    module = importlib.import_module(module_name)
    for name in module.__all__:
        assert getattr(module, name) is not None, name
    # `from M import *` too, which goes through the lazy names' __getattr__.
    namespace: dict[str, object] = {}
    exec(f"from {module_name} import *", namespace)
    assert set(namespace) - {"__builtins__"} == INTENDED[module_name]


def test_remote_error_is_a_gpuhop_error() -> None:
    import gpuhop
    import gpuhop.tf

    assert issubclass(gpuhop.tf.RemoteError, gpuhop.GpuhopError)


def test_importing_gpuhop_tf_loads_neither_tensorflow_nor_the_client() -> None:
    # A job imports gpuhop.tf (and the start-up hook does, with a worker timeout): it must
    # not pay for TensorFlow before the script asks for it, nor for the client SDK ever.
    loaded = _loaded_after("import gpuhop.tf")
    heavy = ("tensorflow", "keras", "tf_keras", "httpx", "pydantic", "fastapi")
    assert _under(loaded, *heavy) == set()
    assert _under(loaded, "gpuhop.client", "gpuhop.agent", "gpuhop.backends") == set()
    assert "gpuhop.tf.remote" not in loaded


def test_importing_gpuhop_keras_loads_no_framework() -> None:
    # Keras is imported when a callback is made, and TensorFlow only by Keras's own backend.
    loaded = _loaded_after("import gpuhop.keras")
    heavy = ("tensorflow", "keras", "tf_keras", "jax", "torch", "httpx", "pydantic")
    assert _under(loaded, *heavy) == set()
    assert _under(loaded, "gpuhop.client", "gpuhop.agent", "gpuhop.tf") == set()


def test_importing_gpuhop_loads_no_client() -> None:
    loaded = _loaded_after("import gpuhop")
    assert _under(loaded, "gpuhop") == {"gpuhop", "gpuhop.version"}
    assert _under(loaded, "httpx", "pydantic", "tensorflow") == set()


@pytest.mark.parametrize(
    "script",
    [
        tfservers.SCRIPT_TEXT,
        # What `gpuhop tf-server start` wrote before gpuhop.tf became a package: a server job
        # queued before the host's upgrade, or submitted by an older client, still runs it.
        "from gpuhop.tfserver import main\n\nraise SystemExit(main())\n",
    ],
    ids=["today", "before-the-package"],
)
def test_the_tf_server_script_finds_the_server(script: str, tmp_path: Path) -> None:
    (tmp_path / tfservers.SCRIPT).write_text(script)
    done = _run(tfservers.SCRIPT, "--help", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "usage: gpuhop tf-server" in done.stdout


@pytest.mark.parametrize("module_name", ["gpuhop.tf.server", "gpuhop.tf.tunnel"])
def test_the_tf_entry_points_run_as_modules(module_name: str) -> None:
    done = _run("-m", module_name, "--help")
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout


# A script as the README's "From Python" has it, each value's type spelled out: under
# `mypy --strict` it checks only where gpuhop ships its types (py.typed, PEP 561); without
# them every import is an error ("missing library stubs or py.typed marker").
USER_SCRIPT = """
from pathlib import Path

from gpuhop import Client, GpuhopError, Job
from gpuhop.api import JobInfo, JobState
from gpuhop.client import JobSpec


def main() -> None:
    with Client() as client:
        job: Job = client.submit(["train.py", "--epochs", "5"], workdir=".", gpus=1)
        for chunk in job.logs(follow=True):
            print(chunk.decode(), end="")
        info: JobInfo = job.wait()
        state: JobState = info.state
        code: int | None = info.exit_code
        pulled: list[Path] = job.pull("out/", workdir=".")
        spec = JobSpec(gpus=1, priority=5, time_limit=3600, retries=2)
        runs: list[Job] = [client.submit(["train.py", "--seed", str(s)], spec) for s in range(3)]
        with job.forward(6006) as fwd:
            url: str = fwd.url
        listed: list[JobInfo] = client.jobs()
        try:
            client.job("nosuch")
        except GpuhopError as e:
            print(e.code, e.status, state, code, pulled, runs, url, listed)
"""


def test_a_users_script_type_checks_against_gpuhop(tmp_path: Path) -> None:
    script = tmp_path / "user.py"
    script.write_text(USER_SCRIPT)
    # In tmp_path: this repository's own mypy settings (mypy_path = "src") stay out of it, so
    # gpuhop is found as a user's mypy finds it, installed.
    done = _run(
        "-m", "mypy", "--strict", "--no-error-summary", "--cache-dir", "cache", "user.py",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
