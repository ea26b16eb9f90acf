"""Runs on the GPU host: `python -m gpuhop.agent` serves the agent in the foreground."""

import argparse
import os
import sys
import traceback
from pathlib import Path

from gpuhop.agent.server.daemon import serve
from gpuhop.agent.server.listen import parse_listen
from gpuhop.backends import BACKENDS, BackendSettings
from gpuhop.home import EXIT_MARK, AgentError, AgentPaths, default_home

POLICY_OPTIONS = (
    "keep_days",
    "keep_jobs",
    "gc_every_hours",
    "gc_grace_minutes",
    "env_keep_days",
    "storage_quota",
    "jobs_quota",
    "log_cap",
)


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m gpuhop.agent")
    parser.add_argument("--home", type=Path, default=None)
    parser.add_argument("--fake-gpus", type=int, default=None)
    parser.add_argument("--fake-gpu-memory", type=int, default=None, metavar="MB")
    parser.add_argument("--fake-gpu-models", default=None, metavar="MODEL[@GROUP],...")
    parser.add_argument("--listen", default=None, metavar="HOST:PORT")
    parser.add_argument("--no-tls", action="store_true")
    parser.add_argument("--tls-cert", type=Path, default=None)
    parser.add_argument("--tls-key", type=Path, default=None)
    # Where jobs run (see gpuhop.backends); without --backend, as at the last start.
    parser.add_argument("--backend", choices=BACKENDS, default=None)
    parser.add_argument("--ray-address", default=None, metavar="HOST:PORT")
    parser.add_argument("--ray-token-file", default=None, metavar="FILE")
    parser.add_argument("--ray-allow-no-auth", action="store_true")
    parser.add_argument("--partition", default=None)
    parser.add_argument("--account", default=None)
    parser.add_argument("--qos", default=None)
    # Retention and quotas (see gpuhop.agent.config); these win over agent.toml.
    parser.add_argument("--keep-days", type=float, default=None)
    parser.add_argument("--keep-jobs", type=int, default=None)
    parser.add_argument("--gc-every-hours", type=float, default=None)
    parser.add_argument("--gc-grace-minutes", type=float, default=None)
    parser.add_argument("--env-keep-days", type=float, default=None)
    parser.add_argument("--storage-quota", default=None, metavar="SIZE")
    parser.add_argument(
        "--jobs-quota",
        default=None,
        metavar="SIZE",
        help="job dirs in all, checked when a job is submitted (admission only: what a"
        " running job writes is not held to it; its log is, by --log-cap)",
    )
    parser.add_argument(
        "--log-cap", default=None, metavar="SIZE", help="one job's log; enforced while it runs"
    )
    args = parser.parse_args()
    if args.fake_gpu_memory is not None and args.fake_gpus is None:
        parser.error("--fake-gpu-memory needs --fake-gpus")
    if args.fake_gpu_models is not None and args.fake_gpus is None:
        parser.error("--fake-gpu-models needs --fake-gpus")
    if args.listen is None and (args.no_tls or args.tls_cert or args.tls_key):
        parser.error("--no-tls, --tls-cert and --tls-key go with --listen")
    backend = None
    if args.backend is not None:
        backend = BackendSettings(
            args.backend,
            args.ray_address,
            args.ray_token_file,
            args.ray_allow_no_auth,
            args.partition,
            args.account,
            args.qos,
        )
    elif args.ray_address or args.ray_token_file or args.ray_allow_no_auth:
        parser.error("--ray-address, --ray-token-file, --ray-allow-no-auth go with --backend ray")
    elif args.partition or args.account or args.qos:
        parser.error("--partition, --account and --qos go with --backend slurm")
    try:
        listen = None
        if args.listen is not None:
            listen = parse_listen(args.listen, not args.no_tls, args.tls_cert, args.tls_key)
    except AgentError as e:
        # A listen request that cannot be served (a bad address, an expired certificate) is
        # an error in the arguments, as argparse's are: exit 2, before anything starts.
        print(f"gpuhop agent: {e}", file=sys.stderr)
        return _exited(2)
    code = 0
    try:
        serve(
            AgentPaths(args.home or default_home()),
            fake_gpus=args.fake_gpus,
            fake_gpu_memory_mb=args.fake_gpu_memory,
            listen=listen,
            policy={name: getattr(args, name) for name in POLICY_OPTIONS},
            backend=backend,
            fake_gpu_models=args.fake_gpu_models,
        )
    except AgentError as e:
        print(f"gpuhop agent: {e}", file=sys.stderr)
        code = 1
    except Exception:
        traceback.print_exc()
        code = 1
    return _exited(code)


def _exited(code: int) -> int:
    # With its pid: a client starting an agent just after another stopped tells this one's
    # exit from the other's, whose line may come after the lock is free (gpuhop.client.embedded).
    print(f"{EXIT_MARK.decode()} with code {code} (pid {os.getpid()})", file=sys.stderr, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
