"""Runs inside the job: `gpuhop run NOTEBOOK.ipynb`, a notebook run top to bottom with
nbclient, in the job's own Python (its kernel is ipykernel in that Python).

Each cell's output goes to the job's log as it comes (stdout, stderr, results), under a
line naming the cell. The executed notebook, outputs and all, is written to the same path
under the job's artifacts ($GPUHOP_ARTIFACTS_DIR), also when a cell fails, so `--pull`
and `gpuhop pull` bring it back. A cell that raises fails the job (exit code 1) with its
number and traceback: where the log is not a terminal, in plain text and only the frames
of the user's code (failure.py); the executed notebook keeps the kernel's whole traceback.
Progress is in plain words: "cell 3 of 18", "cell 2 of 18 (parameters)".

Parameters work as papermill's: `-p NAME=VALUE` makes a cell of assignments, tagged
`injected-parameters`, right after the cell tagged `parameters` (at the top if there is
none). A value is a Python literal if it reads as one (`0.01`, `True`, `[1, 2]`), else a
string.
"""

from __future__ import annotations

import ast
import keyword
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from gpuhop.runtime import artifacts_dir
from gpuhop.runtime.iri import skip_iri_grammar
from gpuhop.runtime.legacykeras import hint_for
from gpuhop.runtime.notebook import MISSING
from gpuhop.runtime.notebook.failure import is_terminal, plain, short

PARAMETERS_TAG = "parameters"
INJECTED_TAG = "injected-parameters"


class BadInput(Exception):
    """A notebook or parameter the run cannot start with; the message names it."""


def _say(message: str) -> None:
    sys.stdout.flush()
    print(f"gpuhop: {message}", file=sys.stderr, flush=True)


def parse_parameters(pairs: list[str]) -> dict[str, Any]:
    """`NAME=VALUE` pairs as papermill's `-p` reads them."""
    values: dict[str, Any] = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        if not sep or not name.isidentifier() or keyword.iskeyword(name):
            raise BadInput(f"-p takes NAME=VALUE with NAME a Python identifier, got {pair!r}")
        try:
            values[name] = ast.literal_eval(text)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            values[name] = text
    return values


def inject(nb: Any, values: dict[str, Any]) -> int | None:
    """Add a cell setting `values` after the one tagged `parameters`; its index, or None."""
    if not values:
        return None
    import nbformat

    source = "# Parameters\n" + "".join(f"{k} = {v!r}\n" for k, v in values.items())
    cell = nbformat.v4.new_code_cell(source, metadata={"tags": [INJECTED_TAG]})
    tagged = [
        i for i, c in enumerate(nb.cells) if PARAMETERS_TAG in c.get("metadata", {}).get("tags", [])
    ]
    if not tagged:
        _say(f"no cell is tagged {PARAMETERS_TAG!r}: the parameters go into a first cell")
    at = tagged[0] + 1 if tagged else 0
    nb.cells.insert(at, cell)
    return at


def read(path: Path) -> Any:
    import nbformat

    if path.suffix != ".ipynb":
        raise BadInput(f"{path} is not a notebook (.ipynb)")
    try:
        nb = nbformat.read(path, as_version=4)
    except FileNotFoundError:
        raise BadInput(f"no notebook {path} in the job's work dir") from None
    except (OSError, ValueError) as e:
        raise BadInput(f"{path} is not a readable notebook: {e}") from None
    nbformat.validator.normalize(nb)
    return nb


def run(path_text: str, parameter_pairs: list[str]) -> int:
    skip_iri_grammar()
    try:
        import nbformat
        from jupyter_client.manager import KernelManager
        from nbclient import NotebookClient
        from nbclient.exceptions import CellExecutionError, DeadKernelError
    except ImportError as e:
        _say(f"gpuhop run NOTEBOOK.ipynb {MISSING.format(what=e.name, python=sys.executable)}")
        return 2
    path = Path(path_text)
    try:
        values = parse_parameters(parameter_pairs)
        nb = read(path)
    except BadInput as e:
        _say(str(e))
        return 2
    injected = inject(nb, values)
    out = artifacts_dir() / path
    out.parent.mkdir(parents=True, exist_ok=True)
    runtime = tempfile.mkdtemp(prefix="gpuhop-kernel-")
    # ipykernel in this Python, whatever the notebook names; over Unix sockets in a private
    # dir rather than loopback TCP ports that anyone on the host may connect to.
    km = KernelManager(
        kernel_name="python3", transport="ipc", connection_file=f"{runtime}/kernel.json"
    )
    client = _streaming_client(NotebookClient)(
        nb,
        km=km,
        timeout=None,
        resources={"metadata": {"path": str(path.parent.resolve())}},
        injected=injected,
    )
    code = 0
    try:
        client.execute()
    except CellExecutionError as e:
        _say(client.failure(e))
        hint = hint_for(f"{e.ename}: {e.evalue}")
        if hint is not None:
            _say(hint)
        code = 1
    except DeadKernelError as e:
        _say(f"the kernel died while running {client.cell_name()}: {e}")
        code = 1
    finally:
        nbformat.write(nb, out)
        shutil.rmtree(runtime, ignore_errors=True)
    kept = ", with the kernel's whole traceback," if code else ""
    _say(
        f"the executed notebook{kept} is {out.relative_to(artifacts_dir())} in the job's artifacts"
    )
    if code == 0:
        cells = sum(c.cell_type == "code" for c in nb.cells)
        _say(f"ran {path}: {cells} code cell{'s' if cells != 1 else ''}")
    return code


def _streaming_client(base: type) -> type:
    """nbclient's NotebookClient, echoing each cell's outputs to the log as they come."""

    class StreamingClient(base):
        def __init__(self, nb: Any, injected: int | None, **kwargs: Any):
            super().__init__(nb, on_cell_execute=self._started, **kwargs)
            self.injected = injected
            self.current = -1

        def cell_name(self, index: int | None = None) -> str:
            """Cell `index` (the running one by default) in plain words, numbered as in
            the user's notebook (1-based): "cell 3", or "the -p parameters"."""
            i = self.current if index is None else index
            if self.injected is not None:
                if i == self.injected:
                    return "the -p parameters"
                if i > self.injected:
                    i -= 1
            return f"cell {i + 1}"

        def _progress(self, index: int) -> str:
            """What the log says as cell `index` starts: "cell 3 of 18", "cell 2 of 18
            (parameters)", "the -p parameters (lr, epochs), after cell 2"."""
            cell = self.nb.cells[index]
            if index == self.injected:
                names = ", ".join(
                    line.split("=", 1)[0].strip()
                    for line in cell.source.splitlines()[1:]
                    if "=" in line
                )
                place = f"after {self.cell_name(index - 1)}" if index else "before cell 1"
                return f"the -p parameters ({names}), {place}"
            total = len(self.nb.cells) - (self.injected is not None)
            tagged = PARAMETERS_TAG in cell.get("metadata", {}).get("tags", [])
            return f"{self.cell_name(index)} of {total}" + (" (parameters)" if tagged else "")

        def _started(self, cell: Any, cell_index: int) -> None:
            self.current = cell_index
            _say(self._progress(cell_index))

        def failure(self, error: Any) -> str:
            """What the log says of a cell that raised `error` (nbclient's
            CellExecutionError): where the log is a terminal, the kernel's traceback as it
            is; otherwise plain text, with only the frames of the user's code."""
            said = f"{self.cell_name()} raised {error.ename}: {error.evalue}"
            if is_terminal():
                return f"{said}\n{error}"
            outputs = self.nb.cells[self.current].get("outputs", [])
            tb: list[str] = next(
                (o.get("traceback", []) for o in outputs if o.output_type == "error"), []
            )
            counts = {c.get("execution_count"): i for i, c in enumerate(self.nb.cells)}
            text = short(
                tb,
                error.ename,
                error.evalue,
                lambda n: self.cell_name(counts[n]) if n in counts else f"In[{n}]",
            )
            return f"{said}\n{text if text is not None else plain(str(error))}"

        def process_message(self, msg: dict, cell: Any, cell_index: int) -> Any:
            result = super().process_message(msg, cell, cell_index)
            _echo(msg)
            return result

    return StreamingClient


def _echo(msg: dict) -> None:
    kind, content = msg.get("msg_type") or msg["header"]["msg_type"], msg.get("content", {})
    if kind == "stream":
        stream = sys.stderr if content.get("name") == "stderr" else sys.stdout
        stream.write(content.get("text", ""))
        stream.flush()
    elif kind in ("execute_result", "display_data"):
        text = content.get("data", {}).get("text/plain")
        if text:
            sys.stdout.write(text.rstrip("\n") + "\n")
            sys.stdout.flush()


def main(argv: list[str]) -> int:
    pairs: list[str] = []
    rest = list(argv)
    paths = []
    while rest:
        arg = rest.pop(0)
        if arg in ("-p", "--parameter"):
            if not rest:
                _say(f"{arg} needs NAME=VALUE")
                return 2
            pairs.append(rest.pop(0))
        elif arg.startswith("-p") and len(arg) > 2:
            pairs.append(arg[2:])
        else:
            paths.append(arg)
    if len(paths) != 1:
        _say(
            "gpuhop run NOTEBOOK.ipynb takes one notebook and -p NAME=VALUE options, got"
            f" {' '.join(argv) or 'nothing'}"
        )
        return 2
    os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    return run(paths[0], pairs)
