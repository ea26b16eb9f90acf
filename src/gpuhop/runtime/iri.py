"""Runs first in those of gpuhop's own processes that import jsonschema, before they do: the
Ray backend's leader, probe and doctor driver (Ray imports it), the notebook server and the
notebook runner (nbformat and Jupyter's server, through jupyter_events, import it).

jsonschema imports `rfc3987_syntax` where it is installed (gpuhop[notebook]'s JupyterLab
brings it), for its checks of the "iri" formats, and that compiles an Earley grammar as it
is imported: 1.4-1.5 CPU-s on a 2-core machine, most of `import ray` (2 CPU-s) and most of a
notebook run's start-up, paid by every job's leader and every notebook. jsonschema checks
formats only when asked to; neither Ray nor nbformat asks, and no schema of Jupyter's server,
JupyterLab or jupyter_events has an "iri" format: these processes go as if the package were
not installed. A user's own code (a job, a notebook's kernel) runs in other processes.
"""

from __future__ import annotations

import sys

IRI_GRAMMAR = "rfc3987_syntax"


def skip_iri_grammar() -> None:
    """Make `import rfc3987_syntax` fail in this process, as where it is not installed
    (jsonschema then goes without its IRI format checks). Call before jsonschema's import."""
    sys.modules.setdefault(IRI_GRAMMAR, None)  # type: ignore[arg-type]  # its import raises
