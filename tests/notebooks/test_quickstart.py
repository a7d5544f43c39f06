"""The quick-start notebook runs top to bottom (in a scratch copy, so its files stay out of the repo)."""

import os
import shutil

import nbformat
import pytest
from nbclient import NotebookClient

from helpers import REPO


@pytest.mark.slow
@pytest.mark.distributed  # its last cell runs `kfast launch -np 2`
@pytest.mark.timeout(600)
def test_quickstart_notebook_executes(tmp_path):
    shutil.copy(os.path.join(REPO, "notebooks", "quickstart.ipynb"), tmp_path)
    nb = nbformat.read(tmp_path / "quickstart.ipynb", as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = "\n".join(o.get("text", "") for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs)
    assert "kfast diagnosis: INPUT-BOUND" in outputs
    assert "worker processes: " in outputs  # tune's choice, measured: threads or processes
    # A dataset defined in a cell, loaded by worker processes, batch for batch as in the notebook itself.
    assert "batches loaded by worker processes: 32 - same labels as in-process: True" in outputs
    assert "chosen:" in outputs and "kfast recipe tabular: 2 rank(s)" in outputs
    assert (tmp_path / "quickstart_diagnosis.png").stat().st_size > 1000
    assert os.listdir(tmp_path / "quickstart_checkpoints")
