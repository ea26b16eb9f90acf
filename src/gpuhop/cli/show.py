"""Runs on the user's machine: `gpuhop show JOB`, one job in full, read from the agent's
JSON (`Job.data`): no model built, and no rich where the output is not a terminal."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from gpuhop.api.sizes import format_mb
from gpuhop.api.states import JobState
from gpuhop.cli import params
from gpuhop.cli.connect import OnOption, client_for
from gpuhop.cli.jobs import find_job
from gpuhop.cli.output import (
    ago,
    counted,
    duration,
    echo,
    escape,
    format_metrics,
    human_bytes,
    print_json,
    state_text,
    when,
)
from gpuhop.cli.queue import queue_rows
from gpuhop.client import GpuhopError

Info = Mapping[str, Any]
# The distributions that are TensorFlow, for the summary's framework line; and the other
# frameworks it names, after TensorFlow.
TENSORFLOW = ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tf-nightly")
FRAMEWORKS = ("torch", "jax")

# Env names whose values `show` hides (the dashboard's job page hides the same).
SECRET_KEY = re.compile(r"secret|token|passw|api_?key|credential|private", re.IGNORECASE)

if TYPE_CHECKING:
    import typer


def show(
    job_ref: str = params.Argument(..., metavar="JOB", help="Job id, unique id prefix, or name."),
    json_out: bool = params.Option(False, "--json", help="Print JSON for scripts."),
    on: str | None = OnOption,
) -> None:
    """Show one job: its state, how it ended, GPUs, and latest metrics."""
    with client_for(on) as client:
        job = find_job(client, job_ref)
        info = job.data
        try:
            ran_on: Info | None = job.provenance_json()
        except GpuhopError:
            ran_on = None  # an agent from before the record
    if json_out:
        print_json(info if ran_on is None else {**info, "provenance": ran_on})
        return
    get = info.get
    rows = [
        ("id", info["id"]),
        ("name", escape(get("name") or "-")),
        ("state", state_text(JobState(info["state"]))),
        ("command", escape(" ".join(info["command"]))),
        ("gpus", _gpus_text(info)),
        ("attempt", f"{info['attempt']} of {get('retries', 0) + 1}"),
        ("created", ago(info["created_at"])),
        ("duration", duration(get("started_at"), get("ended_at"))),
        ("result", get("reason") or "-"),
        *queue_rows(info),
        ("log", human_bytes(get("log_size", 0))),
        ("metrics", format_metrics(get("latest_metrics"))),
    ]
    if get("memory_peak_mb") is not None:
        rows.insert(5, ("memory", memory_text(info)))
    if get("waiting"):
        rows.insert(3, ("waiting", info["waiting"]))
    if get("cluster_job"):
        rows.insert(3, ("runs as", info["cluster_job"]))
    if get("sweep"):
        limit = f" (at most {info['max_parallel']} at once)" if get("max_parallel") else ""
        rows.insert(2, ("sweep", f"{info['sweep']}{limit}"))
    if get("data"):
        rows.insert(4, ("data", " ".join(info["data"])))
    if get("python_env") or get("python"):
        env_text = f"env {info['python_env'][:12]} from " if get("python_env") else ""
        rows.insert(4, ("python", f"{env_text}{get('python')}"))
    if get("image"):
        rows.insert(4, ("image", info["image"]))
    if get("env"):
        rows.insert(4, ("env", " ".join(f"{k}={_shown(k, v)}" for k, v in info["env"].items())))
    latest_source = (get("latest_metrics") or {}).get("source")
    at = next(i for i, (key, _) in enumerate(rows) if key == "metrics") + 1
    # Each other phase's last numbers under the latest's: a fit's, a custom loop's, ...
    rows[at:at] = [
        ("", format_metrics(record))
        for source, record in (get("metrics_by_source") or {}).items()
        if source != latest_source
    ]
    if get("energy"):
        rows += [(key, escape(text)) for key, text in energy_rows(info["energy"])]
    if ran_on is not None and JobState(info["state"]) != JobState.queued:
        rows += ran_on_rows(ran_on)
    if ran_on is not None:
        rows += fetched_rows(ran_on, when(info["created_at"]))
    for key, value in rows:
        echo(f"[bold]{key:>9}[/bold]  {value}")
    for past in get("attempts", ()):
        echo(
            f"[bold]{'attempt ' + str(past['attempt']):>9}[/bold]"
            f"  {state_text(JobState(past['state']))}: {past.get('reason') or '-'}"
        )
        if past.get("metrics"):
            echo(f"{'':>9}  last metrics: {format_metrics(past['metrics'])}")


def ran_on_rows(record: Info) -> list[tuple[str, str]]:
    """`show`'s short summary of what the job ran on (`show --json` has all of it)."""
    get = record.get
    rows = []
    if get("recorded"):
        python, platform = record["python"], record["platform"]
        packages = record["packages"]
        text = (
            f"{python['implementation']} {python['version']} on {platform['system']}"
            f" {platform['release']} {platform['machine']}; {counted(len(packages), 'package')}"
            f" (digest {record['packages_digest'][:12]})"
        )
        rows.append(("ran on", escape(text)))
        frameworks = [f"{n} {packages[n]}" for n in FRAMEWORKS if n in packages]
        tf = next((f"{n} {packages[n]}" for n in TENSORFLOW if n in packages), None)
        if tf is not None:
            build = get("tensorflow_build") or {}
            built = (
                f", built for CUDA {build['cuda_version']}, cuDNN {build.get('cudnn_version')}"
                if build.get("is_cuda_build") and build.get("cuda_version")
                else ""
            )
            frameworks.insert(0, tf + built)
        if frameworks:
            rows.append(("framework", escape("; ".join(frameworks))))
    else:
        rows.append(("ran on", "not recorded (no Python process of the job wrote it)"))
    if get("host_recorded"):
        gpus = ", ".join(f"{g['index']}: {g['name']}" for g in get("gpus") or []) or "none"
        driver = f" (driver {get('driver')}, CUDA {get('cuda')})" if get("driver") else ""
        tree = f"; tree {record['tree'][:12]}" if get("tree") else ""
        host = f"gpuhop {get('gpuhop')} on {get('host')}; GPUs {gpus}{driver}{tree}"
        rows.append(("host", escape(host)))
    return rows


def fetched_rows(record: Info, created_at: datetime | None) -> list[tuple[str, str]]:
    """A row for each bucket's prefix the job was given, once its data was whole: how much,
    how much of it came from the bucket rather than the host's cache, when it was whole, and
    its listing's digest (the same digest, the same objects, paths and versions)."""
    rows = []
    for source in record.get("data") or []:
        if "objects" not in source:
            continue  # fetched by an agent from before the record
        objects, fetched = source["objects"], source["fetched"]
        if not fetched:
            brought = "all cached"
        elif fetched == objects:
            brought = "all fetched"
        else:
            brought = f"{fetched} fetched ({human_bytes(source['fetched_bytes'])}), the rest cached"
        waited = (
            ""
            if created_at is None
            else f"; whole {max(0.0, source['ready_at'] - created_at.timestamp()):.2f} s after"
            " submit"
        )
        text = (
            f"{source['name']}: {source['url']}, {counted(objects, 'object')},"
            f" {human_bytes(source['bytes'])}, {brought}{waited}; listing"
            f" {source['listing'][:12]}"
        )
        rows.append(("fetched", escape(text)))
    return rows


def energy_rows(energy: Info) -> list[tuple[str, str]]:
    """The job's GPU energy and GPU time; each attempt's too, where it had several."""
    attempts = energy.get("attempts") or []
    if len(attempts) < 2:
        return [("energy", energy_text(energy))]
    rows = [("energy", f"{energy_text(energy)} (all {len(attempts)} attempts)")]
    rows += [("", f"attempt {a['attempt']}: {energy_text(a)}") for a in attempts]
    return rows


def energy_text(use: Info) -> str:
    """ "12.3 kJ (3.42 Wh); GPU time 65.0 GPU-s; NVML's energy counter, split by
    utilisation", or "not measured (why)", never 0."""
    seconds = use.get("gpu_seconds")
    gpu_time = None if seconds is None else f"GPU time {_gpu_seconds(seconds)}"
    if not use.get("measured"):
        return "; ".join(p for p in (f"not measured ({use.get('why')})", gpu_time) if p)
    joules = use["joules"]
    watt_hours = joules / 3600
    wh = f"{_figure(watt_hours / 1000)} kWh" if watt_hours >= 1000 else f"{_figure(watt_hours)} Wh"
    parts = [f"{_joules(joules)} ({wh})", gpu_time, _how(use)]
    unmeasured = use.get("unmeasured_gpu_seconds") or 0
    if unmeasured >= 0.05:
        parts.append(f"{_gpu_seconds(unmeasured)} of it not measured")
    return "; ".join(p for p in parts if p)


# How a GPU's energy was read and split (api.energy's words), as `show` says it.
_READ_AS = {"energy counter": "NVML's energy counter", "power samples": "power samples"}
_SPLIT_AS = {"utilisation": "split by utilisation", "equal": "split equally"}


def _how(use: Info) -> str:
    read = use.get("measured_by") or {}
    text = " and ".join(words for key, words in _READ_AS.items() if key in read)
    shared = {k: v for k, v in (use.get("split_by") or {}).items() if k in _SPLIT_AS}
    if shared:
        main = max(shared, key=lambda k: shared[k])
        text += f", {_SPLIT_AS[main]}"
        if len(shared) > 1:
            other = next(k for k in shared if k != main)
            words = _SPLIT_AS[other].removeprefix("split ")
            text += f" ({words} for {_gpu_seconds(shared[other])})"
    return text


def _joules(joules: float) -> str:
    for unit, size in (("MJ", 1e6), ("kJ", 1e3)):
        if joules >= size:
            return f"{_figure(joules / size)} {unit}"
    return f"{_figure(joules)} J"


def _gpu_seconds(seconds: float) -> str:
    hours = f" ({seconds / 3600:.2f} GPU-h)" if seconds >= 3600 else ""
    return f"{seconds:.1f} GPU-s{hours}"


def _figure(value: float) -> str:
    """Three significant figures or so: 123, 12.3, 1.23."""
    if value >= 100:
        return f"{value:.0f}"
    return f"{value:.1f}" if value >= 10 else f"{value:.2f}"


# A suggested share leaves this much room above the peak the job's framework reported.
SHARE_HEADROOM = 1.2


def memory_text(info: Info) -> str:
    """ "peak 5.1 GiB of a 6 GiB share", and for a finished job the share it would need."""
    peak = info.get("memory_peak_mb") or 0.0
    text = f"peak {format_mb(peak)} (the framework's own count)"
    if info.get("gpu_memory_mb") is not None:
        text = f"peak {format_mb(peak)} of a {format_mb(info['gpu_memory_mb'])} share"
    if JobState(info["state"]).finished and peak > 0:
        text += f"; next time --gpu-memory {suggest_share(peak)} would do (peak + 20 %)"
    return text


def suggest_share(peak_mb: float) -> str:
    """A --gpu-memory value 20 % above `peak_mb`, rounded up to what `format_mb` shows."""
    want = peak_mb * SHARE_HEADROOM
    if want < 1024:
        return f"{math.ceil(want)}MiB"
    return format_mb(math.ceil(want / 102.4) * 102.4).replace(" ", "")


def _shown(key: str, value: str) -> str:
    """An env value as `show` prints it: hidden where its name says it is a secret (a
    notebook's JUPYTER_TOKEN, an API key), as on the dashboard; `show --json` has it all."""
    return "******" if SECRET_KEY.search(key) else value


def _gpus_text(info: Info) -> str:
    gpu_ids = info["gpu_ids"]
    if info.get("gpu_memory_mb") is not None:
        share = f"a {format_mb(info['gpu_memory_mb'])} share"
        if gpu_ids:
            return f"{gpu_ids[0]} ({share}, may be shared with other jobs)"
        return f"{share} of one GPU requested"
    if gpu_ids:
        return ",".join(map(str, gpu_ids))
    return f"{info['gpus']} requested" if info["gpus"] else "none (CPU)"


def register(app: typer.Typer) -> None:
    app.command()(show)
