"""Runs inside the job: `python -m gpuhop.runtime.notebook serve [--idle SECONDS]` or
`python -m gpuhop.runtime.notebook run NOTEBOOK.ipynb [-p NAME=VALUE]...`."""

from __future__ import annotations

import sys

USAGE = (
    "usage: python -m gpuhop.runtime.notebook serve [--idle SECONDS]\n"
    "       python -m gpuhop.runtime.notebook run NOTEBOOK.ipynb [-p NAME=VALUE]..."
)


def main(argv: list[str]) -> int:
    if argv[:1] == ["run"]:
        from gpuhop.runtime.notebook import batch

        return batch.main(argv[1:])
    if argv[:1] == ["serve"]:
        from gpuhop.runtime.notebook import server

        idle = 0
        if argv[1:2] == ["--idle"] and len(argv) == 3 and argv[2].isdigit():
            idle = int(argv[2])
        elif len(argv) != 1:
            print(USAGE, file=sys.stderr)
            return 2
        return server.serve(idle)
    print(USAGE, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
