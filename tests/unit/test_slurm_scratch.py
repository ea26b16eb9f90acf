"""Where a Slurm task's node-local scratch dir goes: the site's $SLURM_TMPDIR first, then
agent.toml's [slurm] scratch, then the node's temp dir (saying why a configured path was
passed over)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from gpuhop.backends.slurm.scratch import base


def test_the_sites_slurm_tmpdir_comes_first_then_the_configured_path(tmp_path):
    site, configured = tmp_path / "site", tmp_path / "local"
    site.mkdir()
    configured.mkdir()
    assert base(str(configured), {"SLURM_TMPDIR": str(site)}, "n1") == (site, "")
    assert base(str(configured), {}, "n1") == (configured, "")
    assert base(None, {}, "n1") == (Path(tempfile.gettempdir()), "")
    # A SLURM_TMPDIR that is not there (no prolog made it) is passed over.
    assert base(str(configured), {"SLURM_TMPDIR": str(tmp_path / "gone")}, "n1")[0] == configured


def test_a_configured_path_missing_on_the_node_is_said_and_the_temp_dir_used(tmp_path):
    where, note = base(str(tmp_path / "nope"), {}, "n1")
    assert where == Path(tempfile.gettempdir())
    assert note == (
        f"the scratch path {tmp_path / 'nope'} ([slurm] scratch in the agent's agent.toml)"
        f" does not exist on node n1, so the job's scratch dir is in {where}"
    )
