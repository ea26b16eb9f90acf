"""Runs in the serving job: `python -m gpuhop.serving --model DIR --name NAME`.

First checks that this Python has what the server imports (`needs`: a server in a container
image runs with the image's `python3`), and where it lacks some of it exits at once with
code 2, saying what. Then loads the SavedModel, binds loopback (the job's private
network's, which only the agent reaches; port 0: any free port), and once uvicorn accepts
connections writes the ready file (`{"port": ..., "pid": ...}`, which the agent's proxy
reads) and prints the ready line.
SIGTERM (`gpuhop cancel`) stops it cleanly.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
from pathlib import Path

from gpuhop.serving import needs

PREFIX = "gpuhop-serving:"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m gpuhop.serving", description=__doc__)
    parser.add_argument("--model", type=Path, required=True, help="the SavedModel directory")
    parser.add_argument("--name", required=True, help="the model name in URLs")
    parser.add_argument("--host", default="127.0.0.1", help="keep it on loopback")
    parser.add_argument("--port", type=int, default=0, help="0: any free port")
    parser.add_argument("--max-batch-size", type=int, default=32, help="1: no batching")
    parser.add_argument("--batch-timeout-ms", type=float, default=2.0)
    parser.add_argument("--ready-file", type=Path, help="where to write the port once ready")
    return parser.parse_args(argv)


def write_ready(path: Path, data: dict[str, object]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


async def serve(args: argparse.Namespace) -> int:
    import uvicorn

    from gpuhop.serving.app import create_app
    from gpuhop.serving.batching import Batcher
    from gpuhop.serving.model import ServedModel

    print(f"{PREFIX} loading the SavedModel in {args.model} with {sys.executable}", flush=True)
    try:
        model = ServedModel(args.model)
    except (OSError, ValueError) as e:
        print(f"{PREFIX} cannot load the SavedModel in {args.model}: {e}", file=sys.stderr)
        return 2
    batcher = Batcher(model.run, args.max_batch_size, args.batch_timeout_ms / 1000)
    app = create_app(args.name, model.signatures, model.metadata, batcher)
    sock = socket.create_server((args.host, args.port), backlog=1024)
    # Accepted connections inherit it. Without it, a response's head and body wait on the
    # client's delayed ACK: 40 ms a request (uvicorn leaves a socket it is given as it is).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started and not task.done():
        await asyncio.sleep(0.01)
    if server.started:
        if args.ready_file is not None:
            write_ready(args.ready_file, {"port": port, "pid": os.getpid(), "model": args.name})
        batching = (
            f"batches of up to {args.max_batch_size} rows, waiting up to"
            f" {args.batch_timeout_ms:g} ms"
            if batcher.batching
            else "no batching"
        )
        print(
            f"{PREFIX} model {args.name} ready on http://{args.host}:{port}/v1/models/{args.name}"
            f" (signatures: {', '.join(sorted(model.signatures))}; {batching})",
            flush=True,
        )
    await task
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    lacking = needs.missing()
    if lacking:
        print(
            f"{PREFIX} {sys.executable} cannot import {', '.join(lacking)}, which gpuhop's"
            " model server needs",
            file=sys.stderr,
        )
        print(needs.line(lacking), file=sys.stderr, flush=True)
        return 2
    return asyncio.run(serve(args))


if __name__ == "__main__":
    sys.exit(main())
