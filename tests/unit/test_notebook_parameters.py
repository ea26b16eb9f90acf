"""Papermill-style parameters of `gpuhop run NOTEBOOK.ipynb -p NAME=VALUE` (the in-job
runner's parsing and injection; the run itself is in tests/e2e/test_notebook_cli.py), and
the client's check of what follows the notebook."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from gpuhop.cli.jobs import notebook_options_first
from gpuhop.client import GpuhopError
from gpuhop.client.notebook import batch_command
from gpuhop.runtime.notebook import batch


def test_values_read_as_python_literals_else_as_strings():
    assert batch.parse_parameters(
        ["lr=0.01", "epochs=3", "fast=True", "layers=[64, 32]", "name=resnet", "empty=", "eq=a=b"]
    ) == {
        "lr": 0.01,
        "epochs": 3,
        "fast": True,
        "layers": [64, 32],
        "name": "resnet",
        "empty": "",
        "eq": "a=b",
    }


@pytest.mark.parametrize("pair", ["lr", "=1", "2x=1", "class=1", "a-b=1"])
def test_a_bad_parameter_is_refused_by_name(pair: str):
    with pytest.raises(batch.BadInput, match="NAME=VALUE"):
        batch.parse_parameters([pair])


def _nb(*cells: nbformat.NotebookNode) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = list(cells)
    return nb


def test_the_injected_cell_follows_the_parameters_cell():
    nb = _nb(
        nbformat.v4.new_markdown_cell("# title"),
        nbformat.v4.new_code_cell("lr = 0.1", metadata={"tags": ["parameters"]}),
        nbformat.v4.new_code_cell("print(lr)"),
    )
    at = batch.inject(nb, {"lr": 0.01, "name": "x"})
    assert at == 2
    cell = nb.cells[2]
    assert cell.metadata["tags"] == ["injected-parameters"]
    assert cell.source == "# Parameters\nlr = 0.01\nname = 'x'\n"
    assert nb.cells[3].source == "print(lr)"
    nbformat.validate(nb)  # ids and all: a notebook Jupyter opens


def test_without_a_parameters_cell_the_values_go_first_and_none_means_no_cell():
    nb = _nb(nbformat.v4.new_code_cell("print(lr)"))
    assert batch.inject(nb, {}) is None and len(nb.cells) == 1
    assert batch.inject(nb, {"lr": 1}) == 0
    assert nb.cells[0].source.endswith("lr = 1\n")


def test_the_client_checks_the_notebook_and_its_parameters(tmp_path: Path):
    (tmp_path / "nb").mkdir()
    (tmp_path / "nb" / "a.ipynb").write_text("{}")
    command = batch_command(["nb/a.ipynb", "-p", "lr=0.1"], tmp_path)
    assert command == ["-m", "gpuhop.runtime.notebook", "run", "nb/a.ipynb", "-p", "lr=0.1"]
    with pytest.raises(GpuhopError, match=r"no such notebook: b\.ipynb"):
        batch_command(["b.ipynb"], tmp_path)
    with pytest.raises(GpuhopError, match="takes its own options and parameters"):
        batch_command(["nb/a.ipynb", "-p"], tmp_path)
    with pytest.raises(GpuhopError, match="takes its own options and parameters"):
        batch_command(["nb/a.ipynb", "--epochs", "3"], tmp_path)
    outside = tmp_path.parent / "elsewhere.ipynb"
    outside.write_text("{}")
    with pytest.raises(GpuhopError, match="outside the work dir"):
        batch_command([str(outside)], tmp_path)


@pytest.mark.parametrize(
    ("given", "parsed"),
    [
        # The README's line: gpuhop's own options after the notebook's parameters.
        (["nb.ipynb", "-p", "lr=0.01", "--pull", "out/"],
         ["--pull", "out/", "nb.ipynb", "-p", "lr=0.01"]),
        (["-g", "1", "nb.ipynb", "--name=n", "-p", "a=1", "-d", "-e", "K=V", "--parameter", "b=2"],
         ["-g", "1", "--name=n", "-d", "-e", "K=V", "nb.ipynb", "-p", "a=1", "--parameter", "b=2"]),
        # What is neither stays after the notebook, for batch_command to name.
        (["nb.ipynb", "--lr", "0.1"], ["nb.ipynb", "--lr", "0.1"]),
        # After a script or a program everything is theirs; before it, nothing moves.
        (["train.py", "--pull", "out/", "-p", "x"], ["train.py", "--pull", "out/", "-p", "x"]),
        (["--name", "nb.ipynb", "train.py", "-d"], ["--name", "nb.ipynb", "train.py", "-d"]),
        (["--", "nb.ipynb", "-d"], ["--", "nb.ipynb", "-d"]),
    ],
)  # fmt: skip
def test_gpuhops_options_after_a_notebook_go_before_it(given: list[str], parsed: list[str]):
    assert notebook_options_first(given) == parsed
