"""Runs in the agent: the figures behind `GET /metrics`, for Prometheus, read at scrape time.

Nothing is counted in memory and no thread samples anything: each scrape asks the job store
and the GPU host, so the figures survive an agent restart and agree with `gpuhop ps` and
`gpuhop gpus`. The job store never deletes a job's row (retention removes files only), so
the counts that only grow (jobs submitted, the run-time histogram) are true counters.

Labels are bounded: job states, GPU indices and names, a GPU fault's kind (a few words).
No job names or users: any token may scrape (see `routers.metrics`), so a user must not
learn other users' job names or how busy each user is. Job ids label one kind of figure
only, the counters of each job's GPU energy and GPU time, and only for the jobs running now
and those that ended in the last hour (at most 1,000: `gpuhop.agent.jobs.energy`), so the
series stay few; and a user's scrape lists only their own jobs there (an admin's, every
job), so no one learns another user's job ids or use. These two are kept in memory
by the energy meter (which reads the GPUs at each sample), not read at scrape time.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.utils import floatToGoString

from gpuhop.agent.callers import Caller
from gpuhop.agent.context import AgentContext
from gpuhop.agent.services import gpus as gpus_service
from gpuhop.api import EndClass, JobState
from gpuhop.version import __version__

MB = 2**20
# Run-time buckets in seconds, from a quick test to a day-long training run.
RUN_TIME_BUCKETS = (1, 5, 15, 60, 300, 900, 1800, 3600, 3 * 3600, 6 * 3600, 12 * 3600, 86400)
# Who the collector asks the GPU service as: every job counts towards the figures.
_EVERYONE = Caller("metrics", admin=True)


class AgentCollector(Collector):
    """The agent's jobs, queue and GPUs, as Prometheus metric families."""

    def __init__(self, ctx: AgentContext, caller: Caller):
        self.ctx = ctx
        self.caller = caller

    def describe(self) -> list[Metric]:
        return []  # unknown until collected: the registry must not collect at register time

    def collect(self) -> Iterator[Metric]:
        yield from self._agent()
        yield from self._jobs()
        yield from self._gpus()
        yield from self._energy()

    def _agent(self) -> Iterator[Metric]:
        info = GaugeMetricFamily(
            "gpuhop_agent_info", "The gpuhop agent's version; always 1.", labels=["version"]
        )
        info.add_metric([__version__], 1)
        yield info

    def _jobs(self) -> Iterator[Metric]:
        store = self.ctx.store
        counts = store.counts()
        by_state = GaugeMetricFamily("gpuhop_jobs", "Jobs in each state now.", labels=["state"])
        for state in JobState:
            by_state.add_metric([state.value], counts[state])
        yield by_state
        yield GaugeMetricFamily(
            "gpuhop_queue_length",
            "Jobs queued, waiting for GPUs (or for the scheduler).",
            value=counts[JobState.queued],
        )
        queued = store.queued()
        oldest = min((j.created_at for j in queued), default=None)
        yield GaugeMetricFamily(
            "gpuhop_queue_oldest_wait_seconds",
            "How long the longest-waiting queued job has waited (0: none waits).",
            value=0.0 if oldest is None else max(0.0, time.time() - oldest),
        )
        yield CounterMetricFamily(
            "gpuhop_jobs_submitted",
            "Jobs ever submitted to this agent.",
            value=sum(counts.values()),
        )
        ended = CounterMetricFamily(
            "gpuhop_jobs_ended",
            "Finished jobs by why they ended (their class: succeeded, app-error, oom-gpu,"
            " killed, timeout, ...). Jobs an older agent finished are not counted.",
            labels=["class"],
        )
        classes = store.end_classes()
        for end in EndClass:
            ended.add_metric([end.value], classes.get(end.value, 0))
        yield ended
        run_times = HistogramMetricFamily(
            "gpuhop_job_duration_seconds",
            "How long finished jobs ran (their last attempt, start to end), by how they ended."
            " Jobs that never started are not counted.",
            labels=["state"],
        )
        found = store.run_times(RUN_TIME_BUCKETS)
        for state in (s for s in JobState if s.finished):
            none: tuple[tuple[int, ...], int, float] = ((0,) * len(RUN_TIME_BUCKETS), 0, 0.0)
            cumulative, count, total = found.get(state, none)
            buckets = [
                (floatToGoString(b), float(n))
                for b, n in zip(RUN_TIME_BUCKETS, cumulative, strict=True)
            ]
            buckets.append(("+Inf", float(count)))
            run_times.add_metric([state.value], buckets, sum_value=total)
        yield run_times

    def _gpus(self) -> Iterator[Metric]:
        labels = ["gpu", "name"]
        util = GaugeMetricFamily(
            "gpuhop_gpu_utilization_percent", "GPU load now (percent).", labels=labels
        )
        used = GaugeMetricFamily(
            "gpuhop_gpu_memory_used_bytes", "GPU memory in use now, by anything.", labels=labels
        )
        total = GaugeMetricFamily(
            "gpuhop_gpu_memory_total_bytes", "GPU memory in all.", labels=labels
        )
        reserved = GaugeMetricFamily(
            "gpuhop_gpu_reserved_memory_bytes",
            "GPU memory that gpuhop's jobs hold: all of it for a whole-GPU job, the share"
            " for a share job (--gpu-memory).",
            labels=labels,
        )
        holders = GaugeMetricFamily(
            "gpuhop_gpu_jobs",
            "Jobs that hold the GPU now (share jobs may be several).",
            labels=labels,
        )
        quarantined = GaugeMetricFamily(
            "gpuhop_gpu_quarantined",
            "1 for a GPU out of service for a hardware fault (xid, ecc, retired-pages, lost),"
            " until an admin releases it; 0 for a GPU in service (fault label empty).",
            labels=[*labels, "fault"],
        )
        faults = self.ctx.quarantine.all()
        for gpu in gpus_service.describe(self.ctx, _EVERYONE):
            fault = faults.get(gpu.index)
            quarantined.add_metric(
                [str(gpu.index), gpu.name, fault.kind if fault else ""], 1 if fault else 0
            )
            key = [str(gpu.index), gpu.name]
            if gpu.utilization is not None:  # unknown readings (no NVML support) are left out
                util.add_metric(key, gpu.utilization)
            if gpu.memory_used_mb is not None:
                used.add_metric(key, gpu.memory_used_mb * MB)
            total.add_metric(key, gpu.memory_mb * MB)
            reserved.add_metric(key, (gpu.memory_reserved_mb or 0) * MB)
            holders.add_metric(key, len(gpu.job_ids))
        yield from (util, used, total, reserved, holders, quarantined)

    def _energy(self) -> Iterator[Metric]:
        joules = CounterMetricFamily(
            "gpuhop_job_gpu_energy_joules",
            "GPU energy a job used, all its attempts (NVML's energy counter, else its power"
            " integrated; a shared GPU's split by each job's load). Jobs running now or"
            " ended in the last hour; a job whose energy is not measured is left out.",
            labels=["job"],
        )
        seconds = CounterMetricFamily(
            "gpuhop_job_gpu_seconds",
            "GPU time a job held, in GPU-seconds (a shared GPU's split as its energy is)."
            " Jobs running now or ended in the last hour.",
            labels=["job"],
        )
        totals = self.ctx.supervisor.energy.totals()
        if not self.caller.admin:  # a user's scrape names only their own jobs
            mine = self.ctx.store.owned([t.job_id for t in totals], self.caller.user)
            totals = [t for t in totals if t.job_id in mine]
        for total in totals:
            if total.joules is not None:
                joules.add_metric([total.job_id], total.joules)
            seconds.add_metric([total.job_id], total.gpu_seconds)
        yield from (joules, seconds)


def registry(ctx: AgentContext, caller: Caller) -> CollectorRegistry:
    """A registry for one scrape by `caller`: the agent's figures (the per-job ones of the
    caller's own jobs, or of every job for an admin) and its own process's (CPU, memory,
    open files). Made per scrape: it costs microseconds, and holds no state between them."""
    from prometheus_client import ProcessCollector

    reg = CollectorRegistry(auto_describe=False)
    reg.register(AgentCollector(ctx, caller))
    ProcessCollector(registry=reg)
    return reg
