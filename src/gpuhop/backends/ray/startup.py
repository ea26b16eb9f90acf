"""Runs first in gpuhop's own Ray processes on the agent's host (the leader, the probe, the
doctor's driver), before they import Ray: Ray's import without a cost nothing here needs.

Ray imports jsonschema, and jsonschema imports `rfc3987_syntax` where it is installed (as on
a GPU host with gpuhop[notebook]: JupyterLab's jupyter-events brings it), which compiles an
Earley grammar for IRIs at import: 1.5 of the 2 CPU-s `import ray` takes on a 2-core machine,
paid by every job's leader. Ray never checks an IRI format (jsonschema checks formats only
when asked to), so these processes import Ray as if the package were not there.
"""

from __future__ import annotations

import sys

IRI_GRAMMAR = "rfc3987_syntax"


def skip_iri_grammar() -> None:
    """Make `import rfc3987_syntax` fail in this process, as where it is not installed
    (jsonschema then goes without its IRI format checks). Call before the first Ray import."""
    sys.modules.setdefault(IRI_GRAMMAR, None)  # type: ignore[arg-type]
