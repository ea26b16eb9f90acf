"""The processes of a job in a container image are the job's, as a venv job's are: Podman's
conmon, which parents the container, is adopted by the job's leader (leader.py), so the
agent finds them where it finds a venv job's. `gpuhop stacks` shows where the job in the
image waits; a forward reaches the server it listens with on the host's loopback; and the
container's first process is the job's for the GPU figures told per job (gpuprocs.py).
"""

from __future__ import annotations

import os
import urllib.request

import pytest

from gpuhop.agent.host.gpuprocs import init_of, pid_namespace
from gpuhop.backends.procs import command_line
from gpuhop.home import JobPaths
from tests.conftest import wait_until

pytestmark = pytest.mark.timeout(120)

SERVER = """
import functools, http.server, os, sys, time

def waiting_in_the_image():
    web.serve_forever()

open("page.html", "w").write("served from the image")
handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=".")
web = http.server.HTTPServer(("127.0.0.1", 0), handler)  # a port the kernel picks
print(f"listening on {web.server_address[1]}", flush=True)
waiting_in_the_image()
"""


def test_stacks_forward_and_gpu_figures_find_an_image_jobs_processes(
    shared_agent, minimal_image, project
):
    root = project({"server.py": SERVER})
    with shared_agent.client() as client:
        job = client.submit(["server.py"], workdir=root, image=minimal_image)
        try:
            said = wait_until(lambda: b"listening on" in b"".join(job.logs()), timeout=60)
            assert said
            log = b"".join(job.logs()).decode()
            port = int(log.split("listening on ", 1)[1].split()[0])

            shown = shared_agent.cli("stacks", job.id)
            assert shown.returncode == 0, shown.stderr
            assert "waiting_in_the_image" in shown.stdout and "server.py" in shown.stdout
            # The job's own process only: not Podman's, nor the container's init.
            assert shown.stdout.count("rocess ") == 1, shown.stdout
            native = shared_agent.cli("stacks", job.id, "--native")
            assert native.returncode == 0, native.stderr
            assert "waiting_in_the_image" in native.stdout, native.stdout

            with job.forward(port) as fwd:
                page = urllib.request.urlopen(f"{fwd.url}/page.html", timeout=30)
                with page:
                    assert page.read() == b"served from the image"

            init = init_of(JobPaths(shared_agent.paths.job_dir(job.id)).leader_pid)
            assert init is not None
            # The container's first process (Podman's init, catatonit), in a PID
            # namespace of its own: the job's, which no process of it can leave.
            assert (command_line(init[0]) or b"").split(b"\0")[0].endswith(b"init")
            assert pid_namespace(init[0]) not in (None, pid_namespace(os.getpid()))
        finally:
            job.cancel(grace=0)
            job.wait(timeout=60)
