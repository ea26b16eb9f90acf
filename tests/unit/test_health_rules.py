"""GPU health and the idle guard's pure parts: which readings are faults, the quarantine
kept across restarts (and an admin's release acknowledging a fault), and how long a job's
GPUs have sat at 0 % in the GPU history."""

from __future__ import annotations

from rich.console import Console

from gpuhop.agent.duties.idlegpus import _watched
from gpuhop.agent.host.gpuhistory import GpuHistory, sample_every
from gpuhop.agent.host.health import describe
from gpuhop.agent.host.quarantine import QuarantineStore
from gpuhop.agent.jobs.placement import Pending, plan
from gpuhop.agent.jobs.records import NOTEBOOK_SERVER
from gpuhop.agent.jobs.store import JobRecord
from gpuhop.agent.jobs.waits import said
from gpuhop.api import GpuInfo, JobState
from gpuhop.api.spec import JobSpec
from gpuhop.backends.base import Fault, Usage
from gpuhop.cli.ps import gpu_panel
from gpuhop.client.notebook import SERVE
from gpuhop.runtime import notebook
from tests.placing import queued


def test_the_gravest_fault_is_named_and_a_jobs_own_xid_is_none():
    assert describe(lost=True, xid=79) == Fault(
        "lost", "the GPU fell off the bus (NVML: GPU is lost)"
    )
    assert describe(xid=48).kind == "xid"
    assert describe(xid=31) is None and describe(xid=13) is None  # a bug in the job's kernel
    assert describe(ecc_uncorrected=2) == Fault(
        "ecc", "2 uncorrectable ECC error(s) since the driver loaded"
    )
    assert describe(pages_pending=True).kind == "retired-pages"
    assert describe(ecc_uncorrected=0) is None


def test_quarantine_survives_a_restart_and_a_release_acknowledges_the_fault(tmp_path):
    path = tmp_path / "quarantine.json"
    store = QuarantineStore(path)
    assert store.add(0, "ecc", "1 uncorrectable ECC error(s)", now=5.0)
    assert not store.add(0, "ecc", "1 uncorrectable ECC error(s)")  # already held
    again = QuarantineStore(path)
    assert again.get(0) is not None and again.get(0).since == 5.0
    assert again.release(0) is not None and again.release(0) is None
    # The same reading does not quarantine it again; a worse one does.
    assert not again.add(0, "ecc", "1 uncorrectable ECC error(s)")
    assert QuarantineStore(path).all() == {}
    again.settle({0: "1 uncorrectable ECC error(s)"})  # still seen: still acknowledged
    assert not again.add(0, "ecc", "1 uncorrectable ECC error(s)")
    again.settle({})  # gone (a reset): the same fault coming back counts again
    assert again.add(0, "ecc", "1 uncorrectable ECC error(s)")


def test_a_bad_quarantine_file_quarantines_nothing_and_is_named(tmp_path, caplog):
    path = tmp_path / "quarantine.json"
    path.write_text("[1, 2")
    assert QuarantineStore(path).all() == {}
    assert str(path) in caplog.text


def test_the_scheduler_gives_a_gpu_out_of_service_to_no_job():
    jobs = [queued("a", 1, 0, 1.0), queued("b", 1, 0, 2.0), queued("c", 0, 0, 3.0)]
    placed = plan(jobs, {0: 8192, 1: 8192}, out_of_service=[0])
    assert [(p.job_id, p.gpu_ids) for p in placed] == [("a", (1,)), ("c", ())]
    share = plan([queued("s", 0, 0, 1.0, gpu_memory_mb=1024)], {0: 8192}, out_of_service=[0])
    assert share == []
    waiting: dict[str, str] = {}
    assert plan([queued("two", 2, 0, 1.0)], {0: 1, 1: 1}, out_of_service=[1], waiting=waiting) == []
    assert waiting == {
        "two": "GPU(s) 1 quarantined for a hardware fault; it needs them back"
        " (gpuhop gpus --release N)"
    }


def test_a_share_of_the_only_gpu_waits_naming_its_quarantine_as_a_whole_gpu_job_does():
    # As the agent queues them: a share's spec is settled to one GPU.
    for spec in (JobSpec(gpus=1), JobSpec(gpu_memory_mb=1024).settled()):
        job = Pending("j", 1.0, spec)
        waiting: dict[str, str] = {}
        placed = plan([job], {0: 8192}, waiting=waiting, out_of_service=[0])
        assert placed == [], spec
        assert waiting == {
            "j": "GPU(s) 0 quarantined for a hardware fault; it needs them back"
            " (gpuhop gpus --release N)"
        }, spec
        # A job that waits on the quarantine has no place in line said over it.
        assert said([job], placed, [], {0: 8192}, waiting) == {}, spec


def test_idle_since_is_the_start_of_the_last_run_of_zero_readings():
    history = GpuHistory(every=1.0)
    for t, util in [(1, 50), (2, 0), (3, 0), (4, 0)]:
        history.record(t, {0: Usage(0, util), 1: Usage(0, 0), 2: Usage(None, None)})
    assert history.idle_since([0], after=0) == 2
    assert history.idle_since([0, 1], after=3) == 3  # not before the job started
    assert history.idle_since([1], after=0) == 1
    assert history.idle_since([2], after=0) is None  # unknown load is never idle
    history.record(5, {0: Usage(0, 1), 1: Usage(0, 0)})
    assert history.idle_since([0], after=0) is None
    assert sample_every(None) == 5.0 and sample_every(0.05) == 0.5 and sample_every(0.001) == 0.25


def test_the_idle_guard_watches_whole_gpu_jobs_but_not_notebooks_or_shares():
    def job(command: list[str], gpu_memory_mb: int | None = None) -> JobRecord:
        return JobRecord(
            id="j",
            state=JobState.running,
            command=command,
            spec=JobSpec(gpus=1, gpu_memory_mb=gpu_memory_mb),
            gpu_ids=[0],
            attempt=1,
            created_at=0.0,
            pid=42,
        )

    assert _watched(job(["train.py"]))
    assert not _watched(job(["-m", "gpuhop.runtime.notebook", "serve", "--idle", "3600"]))
    assert _watched(job(["-m", "gpuhop.runtime.notebook", "run", "nb.ipynb"]))  # a batch run
    assert not _watched(job(["train.py"], gpu_memory_mb=1024))
    assert NOTEBOOK_SERVER == SERVE and NOTEBOOK_SERVER[1] == notebook.MODULE  # in step


def test_tops_gpu_panel_names_a_quarantined_gpus_fault():
    gpus = [
        GpuInfo(index=0, name="A100", memory_mb=8192, job_ids=["3fa9"]),
        GpuInfo(index=1, name="A100", memory_mb=8192, quarantined="XID 79 (GPU fell off the bus)"),
    ]
    console = Console(width=200, record=True)
    console.print(gpu_panel([g.model_dump(mode="json") for g in gpus]))  # as `top` reads them
    lines = console.export_text().splitlines()
    assert "3fa9" in lines[1]
    assert "QUARANTINED: XID 79 (GPU fell off the bus)" in lines[2]
