"""Remote TensorFlow ops: per-op round trip through gpuhop's tunnel (`gpuhop.tf.connect` to
a `gpuhop tf-server` job) next to TensorFlow's own unprotected gRPC connection to a server
on loopback (what a user on the GPU host itself would get).

Each sample is one fresh client process: it connects, warms up, and reports the median of
many ops, each fetched back (`.numpy()`), so every op is a full round trip. The direct
baseline runs its server and client together in a private network namespace of their own,
so the benchmark exposes no port either. gpuhop turns TensorFlow's streaming enqueue off
(see gpuhop.tf.remote); a second baseline row with it off too separates that setting's cost
from the tunnel's.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from harness import PYTHON, REPO, Row, Settings, private_agent

NAME = "tfops"
CLIENT = """
import json, os, statistics, subprocess, sys, time
mode, count = sys.argv[1], int(sys.argv[2])
if mode.startswith("direct"):
    sys.path.insert(0, os.path.join(sys.argv[3], "src", "gpuhop", "backends", "local"))
    import leader
    leader.private_network()  # server and client share a loopback nobody else reaches
    os.environ["TF_ENABLE_EAGER_CLIENT_STREAMING_ENQUEUE"] = (
        "false" if mode == "direct-nostream" else "true"
    )
    server = subprocess.Popen([sys.executable, "-c", (
        "import tensorflow as tf; tf.distribute.Server(tf.train.ClusterSpec("
        "{'worker': ['127.0.0.1:2222']}), job_name='worker', task_index=0).join()")])
import tensorflow as tf
import gpuhop.tf
if mode == "gpuhop":
    remote = gpuhop.tf.connect(home=sys.argv[3])
else:
    for _ in range(600):
        try:
            import socket
            socket.create_connection(("127.0.0.1", 2222), timeout=1).close()
            break
        except OSError:
            time.sleep(0.05)
    tf.config.experimental_connect_to_cluster(
        tf.train.ClusterSpec({"worker": ["127.0.0.1:2222"]}))
device = "/job:worker/replica:0/task:0/device:CPU:0"

def median_us(op, n):
    times = []
    for _ in range(n):
        start = time.perf_counter()
        op()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6

with tf.device(device):
    one = tf.constant(1.0)
    x = tf.random.normal((256, 256))
    @tf.function
    def ten_matmuls(a):
        for _ in range(10):
            a = tf.matmul(a, x) / 256.0
        return tf.reduce_sum(a)
    scalar = lambda: (one + 1.0).numpy()
    fn = lambda: ten_matmuls(x).numpy()
    for _ in range(50):
        scalar(); fn()
    result = {"scalar": median_us(scalar, count), "function": median_us(fn, count // 2)}
print(json.dumps(result), flush=True)
if mode == "gpuhop":
    remote.close()
else:
    server.kill()
"""


def _sample(mode: str, count: int, arg: str, env: dict[str, str]) -> dict[str, float]:
    out = subprocess.run(
        [PYTHON, "-c", CLIENT, mode, str(count), arg],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"{mode} client failed ({out.returncode}):\n{out.stderr[-3000:]}")
    result: dict[str, float] = json.loads(lines[-1])
    return result


def run(settings: Settings) -> list[Row]:
    repeats = settings.repeats(default=5, quick=2)
    count = 100 if settings.quick else 400
    modes = ("gpuhop", "direct", "direct-nostream")
    samples: dict[str, dict[str, list[float]]] = {m: {"scalar": [], "function": []} for m in modes}
    with (
        tempfile.TemporaryDirectory(prefix="gpuhop-bench-") as tmp,
        private_agent(Path(tmp) / "agent") as agent,
    ):
        agent.cli("tf-server", "start")
        try:
            for _ in range(repeats):
                for mode in modes:
                    arg = str(agent.home) if mode == "gpuhop" else str(REPO)
                    for key, value in _sample(mode, count, arg, agent.env).items():
                        samples[mode][key].append(value)
        finally:
            agent.cli("tf-server", "stop")
    rows = []
    for key, what in (
        ("scalar", "remote op round trip: a scalar add, fetched"),
        ("function", "tf.function of 10 256x256 matmuls, result fetched"),
    ):
        rows.append(
            Row(
                NAME,
                what,
                "µs",
                samples["gpuhop"][key],
                "TensorFlow's own gRPC on loopback (no auth)",
                samples["direct"][key],
                f"median of {count if key == 'scalar' else count // 2} per sample; local agent",
            )
        )
        rows.append(
            Row(
                NAME,
                f"{what} (baseline with streaming enqueue off, as gpuhop sets it)",
                "µs",
                samples["gpuhop"][key],
                "the same, TF_ENABLE_EAGER_CLIENT_STREAMING_ENQUEUE=false",
                samples["direct-nostream"][key],
                "separates the tunnel's cost from the streaming setting's",
            )
        )
    return rows


if __name__ == "__main__":
    from harness import Settings as _Settings

    for row in run(_Settings(repeat=None, quick="--quick" in sys.argv)):
        print(row)
