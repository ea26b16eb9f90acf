"""Runs on one machine: `make bench` sets gpuhop side by side with what a user would do instead.

Each benchmark starts its own agent in a temp dir and removes everything it made. Writes
results.md and results.json to --out and prints the markdown table.

    .venv/bin/python bench/run.py [--quick] [--repeat N] [--only start_latency,logs]
"""

from __future__ import annotations

import argparse
import compileall
import json
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import agent_start
import buckets
import containers
import datasets
import forward
import gpu_training
import imports
import load
import logs
import memory
import overhead
import profiling
import resync
import serving
import start_latency
import tfops
import transports
from harness import REPO, Row, Settings, machine, markdown

import gpuhop
import ray_backend
import slurm_backend

BENCHMARKS: dict[str, Callable[[Settings], list[Row]]] = {
    "start_latency": start_latency.run,
    "agent_start": agent_start.run,
    "containers": containers.run,
    "imports": imports.run,
    "resync": resync.run,
    "overhead": overhead.run,
    "profiling": profiling.run,
    "gpu_training": gpu_training.run,
    "logs": logs.run,
    "transports": transports.run,
    "forward": forward.run,
    "datasets": datasets.run,
    "buckets": buckets.run,
    "load": load.run,
    "memory": memory.run,
    "serving": serving.run,
    "tfops": tfops.run,
    "ray_backend": ray_backend.run,
    "slurm_backend": slurm_backend.run,
}


def names(text: str) -> list[str]:
    chosen = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in BENCHMARKS]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(
            f"unknown benchmark {', '.join(unknown) or text!r}; choose from {', '.join(BENCHMARKS)}"
        )
    return chosen


def compile_gpuhop() -> None:
    """gpuhop's modules compiled to .pyc, as pip compiles a wheel's when it installs it.
    An editable install writes them on first use, except where PYTHONDONTWRITEBYTECODE is
    set (as on this project's machines): then every command and every job would compile
    gpuhop's modules again, some 40 ms of a command's start that no installed copy pays."""
    compileall.compile_dir(Path(gpuhop.__file__).parent, quiet=1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--repeat",
        type=int,
        metavar="N",
        help="repeats of every measurement (default: 5, fewer where one sample takes long:"
        " 3 first uploads, 2 training runs; --quick lowers each)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="fewer repeats and smaller sizes (under 2 minutes)"
    )
    parser.add_argument(
        "--only", type=names, metavar="NAME[,NAME]", help=f"run only these: {', '.join(BENCHMARKS)}"
    )
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results", metavar="DIR")
    args = parser.parse_args()
    if args.repeat is not None and args.repeat < 1:
        parser.error("--repeat must be at least 1")

    settings = Settings(repeat=args.repeat, quick=args.quick)
    compile_gpuhop()
    info = machine()
    rows: list[Row] = []
    errors: dict[str, str] = {}
    for name in args.only or BENCHMARKS:
        print(f"bench: {name} ...", file=sys.stderr, flush=True)
        started = time.perf_counter()
        try:
            rows += BENCHMARKS[name](settings)
        except Exception:
            errors[name] = traceback.format_exc()
            print(f"bench: {name} failed:\n{errors[name]}", file=sys.stderr)
            continue
        print(f"bench: {name} took {time.perf_counter() - started:.0f}s", file=sys.stderr)

    table = markdown(rows, info, settings)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.md").write_text(table)
    report = {
        "machine": info,
        "settings": {"repeat": settings.repeat, "quick": settings.quick},
        "rows": [row.to_json() for row in rows],
        "errors": errors,
    }
    (args.out / "results.json").write_text(json.dumps(report, indent=2) + "\n")
    print(table)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
