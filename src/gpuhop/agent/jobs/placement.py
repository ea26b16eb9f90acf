"""Runs in the agent: the pure queue policy that decides which queued jobs start on which GPUs
(applied by the loop in `scheduler`).

No I/O and no clock of its own: the caller passes the queue, the GPUs with their memory, and
what the running jobs hold, so the policy is tested without sleeps and without a GPU.

Policy:
- Jobs are considered by priority (high first), then age (old first), then id.
- A job that needs no GPU always starts.
- A whole-GPU job (`gpus=N`) takes N GPUs that nobody holds, not even a share: it owns its
  GPUs. They are handed out lowest index first.
- A share job (`gpu_memory_mb=M`) takes one GPU that no whole-GPU job holds and whose shares
  plus M fit in its memory. Of the GPUs it fits on, it goes to the *best fit*: the one that
  would have the least memory left, lowest index on a tie. Shares so pack onto GPUs that are
  already shared and leave empty GPUs (big holes) open for whole-GPU jobs and large shares.
  Three 4 GiB shares on two empty 8 GiB GPUs: the first two share GPU 0, the third takes 1.
- No starvation: the first GPU job (whole or share) that does not fit blocks every GPU job
  behind it, so a large job is never passed over by a stream of small ones. CPU jobs still
  start.
- Several whole GPUs for one job are of one model and topology group (`GpuKind`): a slower
  card holds back every synchronous step. The job takes the lowest-indexed group with
  enough free GPUs, and waits (blocking, as above: it keeps its place in line) while none
  has, unless it allows mixed GPUs (`mixed_gpus`). Why it waits goes to `in_line`.
- Limits that are not about GPUs being busy make a job wait without blocking others: a
  user's GPUs held at once (`Limits.user_gpus`), and a sweep's runs at once (its
  `max_parallel`). Why each such job waits goes to `waiting`.
- A GPU out of service (quarantined for a hardware fault) is given to no job; jobs that
  would need it wait, as for a busy GPU.
- A job that could never fit on this host (more GPUs than it has, or a share larger than
  every GPU) is passed over instead of blocking the queue for good (`could_ever_fit`).
  Submit refuses such jobs, so this happens only after an agent restart with fewer or
  smaller GPUs; the agent then fails them with a reason.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpuhop.api.spec import JobSpec


@dataclass(frozen=True)
class Pending:
    """A queued job as placement sees it: its spec whole (GPUs or a share, priority, sweep,
    whether its GPUs may be of different models), whose it is, and how old."""

    job_id: str
    created_at: float
    spec: JobSpec
    owner: str | None = None


@dataclass(frozen=True)
class Holding:
    """What a started job holds: its GPUs, and its share of them if it is a share job."""

    job_id: str
    gpu_ids: tuple[int, ...]
    gpu_memory_mb: int | None = None
    owner: str | None = None
    sweep: str | None = None
    name: str | None = None  # how its owner knows it (`waits` names holders by it)


@dataclass(frozen=True)
class Limits:
    """Per-user limits of a team agent (None: no limit). Users in `exempt` (admins) have none."""

    user_gpus: int | None = None
    exempt: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Placement:
    job_id: str
    gpu_ids: tuple[int, ...]


class _Gpus:
    """The GPUs' occupancy while a plan is made: whole-GPU owners and the shares on each."""

    def __init__(
        self, memory: Mapping[int, int], holdings: Iterable[Holding], out: Iterable[int] = ()
    ):
        self.memory = dict(memory)
        # Out of service: as if a whole-GPU job held it.
        self.whole: set[int] = set(out)
        self.shared = dict.fromkeys(self.memory, 0)
        for held in holdings:
            for gpu in held.gpu_ids:
                if gpu in self.memory:  # a GPU that vanished across a restart holds nothing
                    self.take(gpu, held.gpu_memory_mb)

    def take(self, gpu: int, share_mb: int | None) -> None:
        if share_mb is None:
            self.whole.add(gpu)
        else:
            self.shared[gpu] += share_mb

    def empty(self) -> list[int]:
        return sorted(g for g in self.memory if g not in self.whole and not self.shared[g])

    def best_fit(self, share_mb: int) -> int | None:
        """The GPU a share goes to: least memory left after it, lowest index on a tie."""
        fits = [
            (self.memory[g] - self.shared[g] - share_mb, g)
            for g in self.memory
            if g not in self.whole and self.shared[g] + share_mb <= self.memory[g]
        ]
        return min(fits)[1] if fits else None


def plan(
    pending: Iterable[Pending],
    gpus: Mapping[int, int],
    holdings: Iterable[Holding] = (),
    *,
    kinds: Mapping[int, str] | None = None,
    limits: Limits = Limits(),
    waiting: dict[str, str] | None = None,
    in_line: dict[str, str] | None = None,
    out_of_service: Iterable[int] = (),
) -> list[Placement]:
    """Return the jobs to start now and the GPUs each gets.

    `gpus` maps each GPU's index to its memory in MB; `holdings` are the started jobs'.
    `kinds` maps each GPU to its model and topology group (one kind: all alike).
    `waiting`, when given, is filled with why a job waits on a limit rather than on GPUs.
    `in_line`, when given, is filled with why a job that keeps its place in line (it holds
    up the GPU jobs behind it) waits where enough GPUs are free: they are of two models.
    `out_of_service`: GPUs that no job may get (quarantined).
    """
    holdings = list(holdings)
    out = sorted(set(out_of_service) & set(gpus))
    state = _Gpus(gpus, holdings, out)
    in_service = {g: m for g, m in gpus.items() if g not in out}
    kinds = kinds or {}
    held_by = Counter[str | None]()
    sweep_runs = Counter[tuple[str | None, str]]()
    for held in holdings:
        held_by[held.owner] += len(held.gpu_ids)
        if held.sweep is not None:
            sweep_runs[held.owner, held.sweep] += 1
    placements: list[Placement] = []
    gpu_queue_blocked = False
    for job in sorted(pending, key=queue_order):
        sweep_key = (job.owner, job.spec.sweep or "")
        if job.spec.max_parallel is not None and sweep_runs[sweep_key] >= job.spec.max_parallel:
            _wait(waiting, job, f"its sweep already runs {job.spec.max_parallel} (max_parallel)")
            continue
        if job.spec.gpus == 0 and job.spec.gpu_memory_mb is None:
            placements.append(Placement(job.job_id, ()))
            sweep_runs[sweep_key] += 1
            continue
        if gpu_queue_blocked or not could_ever_fit(job, gpus, kinds):
            continue
        cap = None if job.owner in limits.exempt else limits.user_gpus
        if cap is not None and held_by[job.owner] + job.spec.gpus > cap:
            _wait(
                waiting,
                job,
                f"{job.owner or 'its owner'} holds {held_by[job.owner]} GPU(s) and this job"
                f" asks for {job.spec.gpus}; the agent's limit is {cap} per user at once",
            )
            continue
        taken: tuple[int, ...]
        if job.spec.gpu_memory_mb is not None:
            gpu = state.best_fit(job.spec.gpu_memory_mb)
            taken = () if gpu is None else (gpu,)
        else:
            taken = _whole(state.empty(), job, kinds)
            if not taken and job.spec.gpus <= len(state.empty()):
                _wait(in_line, job, f"no {job.spec.gpus} free GPUs of one model (see --mixed-gpus)")
        if not taken:
            if out and not could_ever_fit(job, in_service, kinds):
                # It waits on an admin, not on GPUs coming free: as a job held by a limit,
                # it holds up nobody behind it (or the whole GPU queue would stall until
                # the release, with GPUs free).
                _wait(
                    waiting,
                    job,
                    f"GPU(s) {','.join(map(str, out))} quarantined for a hardware fault; it"
                    " needs them back (gpuhop gpus --release N)",
                )
                continue
            gpu_queue_blocked = True
            continue
        for gpu in taken:
            state.take(gpu, job.spec.gpu_memory_mb)
        held_by[job.owner] += len(taken)
        if job.spec.sweep is not None:
            sweep_runs[sweep_key] += 1
        placements.append(Placement(job.job_id, taken))
    return placements


def queue_order(job: Pending) -> tuple[int, float, str]:
    """Where a queued job stands in line: by priority (high first), then age, then id."""
    return (-job.spec.priority, job.created_at, job.job_id)


def _wait(waiting: dict[str, str] | None, job: Pending, why: str) -> None:
    if waiting is not None:
        waiting[job.job_id] = why


def _whole(empty: list[int], job: Pending, kinds: Mapping[int, str]) -> tuple[int, ...]:
    """The GPUs a whole-GPU job takes from `empty`: the lowest-indexed that are all of one
    kind (the first kind in index order with enough), or any for a mixed or 1-GPU job."""
    if job.spec.gpus > len(empty):
        return ()
    if job.spec.mixed_gpus or job.spec.gpus <= 1:
        return tuple(empty[: job.spec.gpus])
    by_kind: dict[str, list[int]] = {}
    for gpu in empty:
        by_kind.setdefault(kinds.get(gpu, ""), []).append(gpu)
    for same in by_kind.values():
        if len(same) >= job.spec.gpus:
            return tuple(same[: job.spec.gpus])
    return ()


def could_ever_fit(
    job: Pending, gpus: Mapping[int, int], kinds: Mapping[int, str] | None = None
) -> bool:
    """Whether the job fits on these GPUs when nothing else runs."""
    if job.spec.gpu_memory_mb is not None:
        return job.spec.gpu_memory_mb <= max(gpus.values(), default=0)
    if job.spec.mixed_gpus or job.spec.gpus <= 1 or not kinds:
        return job.spec.gpus <= len(gpus)
    return job.spec.gpus <= largest_kind(gpus, kinds)


def largest_kind(gpus: Iterable[int], kinds: Mapping[int, str]) -> int:
    """How many GPUs the largest group of one kind has."""
    return max(Counter(kinds.get(g, "") for g in gpus).values(), default=0)
