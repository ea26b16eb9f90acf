"""Runs on the GPU host, as a gpuhop job: a TensorFlow server for remote eager execution.

`gpuhop tf-server start` submits a one-line entry script that calls `main()` here, in a
job with `private_network`: TensorFlow's gRPC server has no authentication and binds every
interface, so it must live in a network namespace of its own, reached only through the
agent's authenticated port forward (`gpuhop.tf.connect` on the user's machine). It refuses
to start anywhere else. `join()` never returns: the job runs until it is cancelled.
"""

from __future__ import annotations

import argparse
import sys

DEFAULT_PORT = 2222


def network_interfaces() -> list[str]:
    """The interfaces of this process's network namespace (/sys may show the host's)."""
    with open("/proc/self/net/dev") as f:
        return sorted(line.split(":")[0].strip() for line in f.readlines()[2:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpuhop tf-server")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    args = parser.parse_args(argv)
    interfaces = network_interfaces()
    if interfaces != ["lo"]:
        print(
            "gpuhop tf-server: refusing to start: this process can reach the network"
            f" ({', '.join(i for i in interfaces if i != 'lo')}), and TensorFlow's server has"
            " no authentication and listens on every interface. Start it with"
            " `gpuhop tf-server start`, which runs it in a private network namespace.",
            file=sys.stderr,
            flush=True,
        )
        return 2
    import tensorflow as tf

    devices = [d.name for d in tf.config.list_logical_devices()]
    server = tf.distribute.Server(
        tf.train.ClusterSpec({"worker": [f"127.0.0.1:{args.port}"]}),
        job_name="worker",
        task_index=0,
        protocol="grpc",
    )
    print(
        f"gpuhop tf-server: TensorFlow {tf.__version__} serving on port {args.port} of this"
        f" job's private network; devices: {', '.join(devices)}",
        flush=True,
    )
    server.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
