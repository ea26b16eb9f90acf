"""Runs on the agent's host, in a short-lived subprocess of `gpuhop doctor`: its TensorFlow
probe, run on a node of the Ray cluster as one Ray task.

`RayBackend.doctor_command` makes doctor run `python -m gpuhop.backends.ray.doctor SPEC --
ARGV...` where it would run the probe's ARGV on its own host. This process becomes a Ray
driver with the agent's address and token (as a job's leader does,
gpuhop.backends.ray.leader), reserves one CPU and, where the cluster has GPUs, one GPU in a
placement group, and runs ARGV there as one task (gpuhop.backends.ray.worker.check_here), in
the environment a job's worker gets on that node. It prints the task's stdout (the probe's
MARK line) and stderr and exits with its code, so doctor reads it as it reads the probe run
on its own host or through Slurm's srun. A cluster with no room for the task within the
spec's `wait` seconds is said, not waited on; the probe has `limit` seconds on the node.
Both are removed with the driver, whatever happens.

SPEC is a JSON object: {"address", "gpus" (0 or 1), "wait", "limit"}.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

from gpuhop.backends.ray.probe import ProbeError, probe
from gpuhop.runtime.iri import skip_iri_grammar


class NotChecked(Exception):
    """The check did not run (the cluster was busy, or Ray failed); the message says why."""


# gpuhop's package dir on the agent's host (this file is gpuhop/backends/ray/doctor.py).
PACKAGE = Path(__file__).parents[2]


def check(spec: dict[str, Any], argv: list[str]) -> dict[str, Any]:
    """The task's {"stdout", "stderr", "code"}; raises ProbeError or NotChecked."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from gpuhop.backends.ray.worker import check_here

    probe(spec["address"])  # a dead address would make ray.init hang
    ray.init(
        address=spec["address"],
        namespace="gpuhop",
        logging_level=logging.ERROR,
        log_to_driver=False,
        configure_logging=True,
    )
    try:
        bundle = {"CPU": 1, **({"GPU": spec["gpus"]} if spec["gpus"] else {})}
        group = placement_group([bundle], name="gpuhop-doctor")
        try:
            done, _ = ray.wait([group.ready()], timeout=spec["wait"])
            if not done:
                gpu = " and 1 GPU" if spec["gpus"] else ""
                raise NotChecked(
                    f"no node of the Ray cluster had 1 CPU{gpu} free for the check within"
                    f" {spec['wait']}s (its nodes are busy); run gpuhop doctor again later"
                )
            task = ray.remote(check_here).options(
                num_cpus=1,
                num_gpus=spec["gpus"],
                max_retries=0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(group, 0),
            )
            agent = {"python": argv[0], "package": str(PACKAGE)}
            ref = task.remote(argv, agent, spec["limit"])
            # The task ends itself after `limit`; the rest is margin for Ray.
            got: dict[str, Any] = ray.get(ref, timeout=spec["limit"] + 30)
            return got
        except ray.exceptions.RayError as e:
            lines = str(e).strip().splitlines()
            raise NotChecked(
                f"the check on the Ray cluster failed: {lines[-1] if lines else type(e).__name__}"
            ) from None
        finally:
            remove_placement_group(group)
    finally:
        ray.shutdown()


def main(args: list[str]) -> int:
    if len(args) < 3 or args[1] != "--":
        print("usage: python -m gpuhop.backends.ray.doctor SPEC -- ARGV...", file=sys.stderr)
        return 2
    skip_iri_grammar()
    try:
        got = check(json.loads(args[0]), args[2:])
    except (ProbeError, NotChecked) as e:
        print(f"gpuhop: {e}", file=sys.stderr)
        return 1
    sys.stdout.write(got["stdout"])
    sys.stderr.write(got["stderr"])
    return int(got["code"])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
