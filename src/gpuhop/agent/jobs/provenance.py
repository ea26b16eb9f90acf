"""Runs in the agent: the record of what a job ran on, kept with the job's files.

Two halves, each written once per job. The agent's (`write_host`, at the job's first start,
after its process is on its way): gpuhop's version, the job's tree, the backend and host,
the GPUs it was given and their driver. The job's (gpuhop.runtime.provenance, by its first
Python process): the interpreter, the platform, the installed distributions and
TensorFlow's build info. The buckets' data the job was given is the agent's too, from the
job's deps as its fetch left them (`_data`). `read` joins them into the record `show` and
`diff` use; the distributions' digest is made here, over their sorted `name==version` lines
(a lock-style list), so that two jobs with the same environment have the same digest.

The job's half is the job's own words: read with a size cap, parsed line by line, and
anything odd in it dropped. It says what the job saw, and vouches for nothing else.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import json
import os
import socket
from typing import Any

from gpuhop.backends import jobdeps
from gpuhop.backends.base import GpuHost
from gpuhop.home import JobPaths
from gpuhop.version import __version__

# More than this of the job's half is not read (a venv of 1,000 distributions is ~30 KB).
MAX_RECORD_BYTES = 1024 * 1024
HEADER = "gpuhop-provenance 1"
# TensorFlow's build info fields kept (the rest is compiler detail).
TF_BUILD_KEYS = ("cuda_version", "cudnn_version", "is_cuda_build", "is_rocm_build")


def write_host(
    jp: JobPaths, tree: str | None, gpu_ids: list[int], host: GpuHost, backend: str
) -> None:
    """The agent's half, unless an earlier attempt wrote it."""
    if jp.host_record.exists():
        return
    by_index = {g.index: g for g in host.gpus}
    record = {
        "gpuhop": __version__,
        "tree": tree,
        "backend": backend,
        "host": socket.gethostname(),
        "gpus": [
            {"index": i, "name": by_index[i].name, "memory_mb": by_index[i].memory_mb}
            for i in gpu_ids
            if i in by_index
        ],
        "driver": host.driver_version,
        "cuda": host.cuda_version,
    }
    tmp = jp.host_record.with_name(jp.host_record.name + ".tmp")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, jp.host_record)


def read(jp: JobPaths) -> dict[str, Any]:
    """The job's record: the agent's half and the job's, each `recorded` where present."""
    record: dict[str, Any] = {"host_recorded": False, "recorded": False}
    with contextlib.suppress(OSError, ValueError):
        host = json.loads(jp.host_record.read_text())
        if isinstance(host, dict):
            record.update(host, host_recorded=True)
    record.update(_job_half(jp))
    data = _data(jp)
    if data:
        record["data"] = data
    return record


# What a bucket's fetch recorded of each source (gpuhop.agent.jobs.fetches), as shown.
DATA_KEYS = ("name", "url", "objects", "bytes", "fetched", "fetched_bytes", "ready_at")


def _data(jp: JobPaths) -> list[dict[str, Any]]:
    """The buckets' data the job was given: each source's listing (its digest: the same
    digest, the same objects, paths and versions), what of it was fetched rather than
    cached, and when it was whole. The agent's own words (the job's deps), not the job's."""
    out = []
    for mount in jobdeps.read(jp).get("data", []):
        if "url" not in mount:
            continue  # a pushed dataset
        entry = {key: mount[key] for key in DATA_KEYS if key in mount}
        entry["listing"] = os.path.basename(mount["source"])
        out.append(entry)
    return out


def _job_half(jp: JobPaths) -> dict[str, Any]:
    try:
        fd = os.open(jp.provenance, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return {}
    with os.fdopen(fd, "rb") as f:
        text = f.read(MAX_RECORD_BYTES).decode("utf-8", "replace")
    lines = text.split("\n")
    if not lines or lines[0] != HEADER or "end" not in lines:
        return {}  # not written (yet), or not by gpuhop's writer
    packages: dict[str, str] = {}
    half: dict[str, Any] = {"recorded": True}
    build_lines: list[str] = []
    for line in lines[1 : lines.index("end")]:
        kind, _, rest = line.partition("\t")
        fields = rest.split("\t")
        if kind == "python" and len(fields) == 3:
            keys = ("version", "implementation", "executable")
            half["python"] = dict(zip(keys, fields, strict=True))
        elif kind == "platform" and len(fields) == 3:
            half["platform"] = dict(zip(("system", "release", "machine"), fields, strict=True))
        elif kind in ("attempt", "worker") and fields[0].isdigit():
            half[f"recorded_by_{kind}"] = int(fields[0])
        elif kind == "dist" and len(fields) == 2 and all(fields):
            packages.setdefault(fields[0], fields[1])
        elif kind == "tf-build" and len(build_lines) < 20 and len(rest) < 4096:
            build_lines.append(rest)
    half["packages"] = dict(sorted(packages.items()))
    half["packages_digest"] = packages_digest(packages)
    build = _tf_build(build_lines)
    if build:
        half["tensorflow_build"] = build
    return half


def packages_digest(packages: dict[str, str]) -> str:
    lock = "".join(f"{name}=={version}\n" for name, version in sorted(packages.items()))
    return hashlib.sha256(lock.encode()).hexdigest()


def _tf_build(lines: list[str]) -> dict[str, Any]:
    """TensorFlow's build info from its build_info.py lines: a literal list of pairs inside
    `collections.OrderedDict([...])` (TensorFlow 2.x), or `build_info['key'] = value`."""
    found: dict[str, Any] = {}
    for line in lines:
        target, eq, value = line.partition("=")
        if not eq:
            continue
        value = value.strip()
        try:
            if target.strip() == "build_info" and "[" in value:
                pairs = ast.literal_eval(value[value.index("[") : value.rindex("]") + 1])
                found.update(p for p in pairs if isinstance(p, tuple) and len(p) == 2)
            elif target.startswith("build_info[") and target.rstrip().endswith("]"):
                found[ast.literal_eval(target.strip()[11:-1])] = ast.literal_eval(value)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
    return {k: found[k] for k in TF_BUILD_KEYS if k in found and _plain(found[k])}


def _plain(value: object) -> bool:
    return isinstance(value, str | bool | int) and len(str(value)) <= 100
