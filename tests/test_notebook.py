from __future__ import annotations

import base64
import json
import sys
from pathlib import Path

import pytest
from sim_study import is_blank, sim_study_db  # noqa: F401  (session fixture)
from test_analysis import prefix_study_db  # noqa: F401  (session fixture)

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "inspect_study.ipynb"
#: history, importances, tradeoff, layouts, capacity
FIGURES = 5


def test_notebook_is_committed_without_outputs():
    nb = json.loads(NOTEBOOK.read_text(encoding="utf-8"))
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert code and all(c["outputs"] == [] and c["execution_count"] is None for c in code)
    assert "STUDY_PATH" in "".join(code[0]["source"])  # the first code cell is the parameter


@pytest.fixture()
def venv_kernel(tmp_path, monkeypatch) -> str:
    """A kernelspec named python3 that runs this interpreter (the project's venv), found
    first on JUPYTER_PATH whatever else the machine has installed."""
    spec = tmp_path / "jupyter" / "kernels" / "python3"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (tuner venv)", "language": "python",
    }))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    return "python3"


@pytest.mark.slow
def test_notebook_runs_top_to_bottom_on_a_sim_study(sim_study_db, venv_kernel, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("TUNER_STUDY", str(sim_study_db))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    # raises CellExecutionError, naming the cell, when any cell fails
    NotebookClient(nb, kernel_name=venv_kernel, timeout=240,
                   resources={"metadata": {"path": str(ROOT)}}).execute()
    images = [base64.b64decode(out["data"]["image/png"])
              for cell in nb.cells if cell.cell_type == "code"
              for out in cell.outputs if "image/png" in out.get("data", {})]
    assert len(images) == FIGURES, f"{len(images)} figures shown, expected {FIGURES}"
    assert not any(is_blank(png) for png in images)
    text = "".join(str(out.get("data", {}).get("text/markdown", "")) for c in nb.cells if c.cell_type == "code"
                   for out in c.outputs)
    assert "Not drawn" not in text and "No plan stored" not in text
    assert "vllm serve Qwen/Qwen2.5-7B-Instruct" in text
    # the answer is the study's recommendation, with the confirmed mean tuner studies show prints
    from tuner.study import analysis

    said = analysis.recommendation(analysis.open_study(sim_study_db))
    assert said.confirmed and f"Recommended: trial {said.trial}, " in text
    assert f"confirmed: **{said.mean:,.0f} tokens/s**, mean of {said.measurements} measurements" in text
    # the knobs go by the names the user gave them, not Optuna's parameter names
    assert "The knob that mattered most: **" in text and "_index" not in text


@pytest.mark.slow
def test_notebook_counts_trials_that_differ_only_in_knobs_without_effect(prefix_study_db, venv_kernel, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("TUNER_STUDY", prefix_study_db)
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, kernel_name=venv_kernel, timeout=240,
                   resources={"metadata": {"path": str(ROOT)}}).execute()
    cell = next(c for c in nb.cells if c.cell_type == "code" and "top_groups" in c.source)
    said = "".join(str(out.get("data", {}).get("text/markdown", "")) for out in cell.outputs)
    table = "".join(str(out.get("data", {}).get("text/html", "")) for out in cell.outputs)
    assert "measured in ×4 trials" in said and "enable_prefix_caching: no shared prefixes" in said
    assert table.count("<td>×4</td>") == 2 and "×1" not in table  # 8 trials, 2 configurations
    assert table.count("any (no shared prefixes)") == 2
