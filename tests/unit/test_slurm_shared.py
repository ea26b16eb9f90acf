"""What the Slurm backend's shared-filesystem probe makes of its output, and what doctor says
of it (the probe itself runs on the real test cluster: tests/slurm_backend/test_slurm_files.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from gpuhop.agent.services.hostchecks import Facts, shared_files
from gpuhop.api import CheckStatus
from gpuhop.backends.slurm.shared import MARK, PROBE_SECONDS, PYTHON_OK, verdict
from gpuhop.home import AgentError

JOBS = Path("/shared/me/.gpuhop/jobs")
PY = "/shared/me/venv/bin/python"


def test_a_node_that_read_and_wrote_the_nonce_passes():
    seen = verdict(JOBS, "n0nce", f"{MARK}node7\nn0nce\n{PYTHON_OK}\n", "", "n0nce", PY)
    assert seen.ok and seen.detail == f"jobs' files are under {JOBS}, which node node7 sees"


def test_a_node_without_the_agents_python_is_refused():
    with pytest.raises(AgentError, match=f"the agent's Python {PY} does not exist on node node7"):
        verdict(JOBS, "n0nce", f"{MARK}node7\nn0nce\n", "", "n0nce", PY)


def test_a_probe_slurm_did_not_run_decides_nothing():
    said = "srun: error: Unable to allocate resources: Requested nodes are busy"
    seen = verdict(JOBS, "n0nce", "", said, None, PY)
    assert seen.ok is None
    assert (
        seen.detail == f"not checked: Slurm did not run the check within {PROBE_SECONDS}s ({said})"
    )


def test_a_node_that_read_another_file_is_refused():
    with pytest.raises(AgentError, match="node node7 does not see the agent's file in") as e:
        verdict(JOBS, "n0nce", f"{MARK}node7\nsomething else\n", "", None, PY)
    assert "it read other contents there" in str(e.value)


def test_a_node_whose_reply_the_agent_cannot_read_is_refused():
    with pytest.raises(AgentError, match="the agent cannot read what the node wrote there"):
        verdict(JOBS, "n0nce", f"{MARK}node7\nn0nce\n", "", None, PY)


def test_the_nodes_own_words_are_kept_and_sruns_dropped():
    stderr = "srun: error: node7: task 0: Exited with exit code 1\ncat: /x: Permission denied\n"
    with pytest.raises(AgentError, match=r"\(it said: cat: /x: Permission denied\)"):
        verdict(JOBS, "n0nce", f"{MARK}node7\n", stderr, None, PY)


def test_doctor_says_where_the_files_are_and_whether_a_node_saw_them():
    facts = Facts(
        gpu_source="slurm",
        gpus=[],
        driver_version=None,
        driver_cuda=None,
        driver_error=None,
        state_dir="/shared/me/.gpuhop",
        disk_free=0,
    )
    assert shared_files(facts) == []  # a backend whose jobs use the agent's own host
    seen = f"jobs' files are under {JOBS}, which node node7 sees"
    [passed] = shared_files(replace(facts, files_seen=(True, seen)))
    assert (passed.name, passed.status, passed.detail) == (
        "shared filesystem",
        CheckStatus.passed,
        seen,
    )
    later = f"not checked: Slurm did not run the check within {PROBE_SECONDS}s (busy)"
    [warned] = shared_files(replace(facts, files_seen=(None, later)))
    assert warned.status == CheckStatus.warning
    assert warned.detail == (
        f"jobs' files are under /shared/me/.gpuhop/jobs, which the compute nodes must see; {later}"
    )
    assert warned.fix == "restart the agent when the partition has a free node, to check again"
