"""Runs on the GPU host: `python -m gpuhop.agent` serves the agent in the foreground."""

import argparse
import sys
import traceback
from pathlib import Path

from gpuhop.agent.daemon import serve
from gpuhop.home import EXIT_MARK, AgentError, AgentPaths, default_home


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m gpuhop.agent")
    parser.add_argument("--home", type=Path, default=None)
    parser.add_argument("--fake-gpus", type=int, default=None)
    parser.add_argument("--fake-gpu-memory", type=int, default=None, metavar="MB")
    args = parser.parse_args()
    if args.fake_gpu_memory is not None and args.fake_gpus is None:
        parser.error("--fake-gpu-memory needs --fake-gpus")
    code = 0
    try:
        serve(
            AgentPaths(args.home or default_home()),
            fake_gpus=args.fake_gpus,
            fake_gpu_memory_mb=args.fake_gpu_memory,
        )
    except AgentError as e:
        print(f"gpuhop agent: {e}", file=sys.stderr)
        code = 1
    except Exception:
        traceback.print_exc()
        code = 1
    print(f"{EXIT_MARK.decode()} with code {code}", file=sys.stderr, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
