# ruff: noqa: F811 (the fixtures imported are parameters here)
"""What a multi-worker job's Keras is, asked as it is submitted to a team agent (a real one):
never of a PYTHONPATH the user gave, whose sitecustomize.py ran as root there (seen: the
agent asked the interpreter with the job's PYTHONPATH, outside any sandbox). Asked as the
job starts instead, in its sandbox as its user's identity."""

from __future__ import annotations

import pytest

from gpuhop.api import JobState
from tests.integration.test_tls import remote, tls_agent, tokens  # noqa: F401 (fixtures)

pytestmark = pytest.mark.timeout(300)

# Written by the user's first job into their home: it marks where it ran as root, in a dir
# only root may write (the job's own runs, as its identity, cannot).
PLANT = """
import os, sys
code = f"import os\\nif os.geteuid() == 0: open({sys.argv[1]!r}, 'w').write('root')\\n"
open(os.path.join(os.environ["HOME"], "sitecustomize.py"), "w").write(code)
print(os.environ["HOME"])
"""


def test_a_pythonpath_of_the_users_is_never_run_by_the_agent_at_submit(
    tls_agent, remote, tokens, project, tmp_path
):
    marker = tmp_path / "ran-as-root"
    with remote(tokens["alice"]) as alice:
        plant = alice.submit(["plant.py", str(marker)], workdir=project({"plant.py": PLANT}))
        assert plant.wait(timeout=120).state == JobState.succeeded
        home = b"".join(plant.logs()).decode().strip().splitlines()[-1]
        job = alice.submit(
            ["w.py"],
            workdir=project({"w.py": "import os; print(os.environ['GPUHOP_WORKER_INDEX'])\n"}),
            workers=2,
            env={"PYTHONPATH": home},
        )
        info = job.wait(timeout=120)
    assert not marker.exists(), "the user's sitecustomize.py ran as root"
    assert info.state == JobState.succeeded, info.reason
