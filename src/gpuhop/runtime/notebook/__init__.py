"""Runs inside the job: gpuhop's notebook programs, in the job's own Python.

`python -m gpuhop.runtime.notebook serve` is the JupyterLab server of `gpuhop notebook`
(see `server`); `python -m gpuhop.runtime.notebook run NOTEBOOK.ipynb` runs a notebook top
to bottom for `gpuhop run NOTEBOOK.ipynb` (see `batch`). Both need jupyter_server,
jupyterlab, ipykernel and nbclient in the job's Python (`pip install 'gpuhop[notebook]'`);
they import them only when they run.
"""

from __future__ import annotations

MODULE = "gpuhop.runtime.notebook"
# The job's metrics record that names the server's port on the host's loopback; the
# client finds the server by it. Later records add how long the server has been idle.
PORT_METRIC = "notebook_port"
IDLE_METRIC = "idle_s"
# The token reaches the server in this variable (Jupyter's own), and only there: the server
# takes it out of its environment before any kernel starts.
TOKEN_ENV = "JUPYTER_TOKEN"
MISSING = (
    "needs {what} in the job's Python ({python}); install gpuhop's notebook extra there:"
    " pip install 'gpuhop[notebook]' (or jupyterlab ipykernel nbclient), or give the job a"
    " requirements.txt that lists them"
)
