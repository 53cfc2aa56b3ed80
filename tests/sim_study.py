"""A small study made by ``tuner search`` on the simulator, with a ``tuner plan`` sweep
stored in it: the real input of the analysis, plot, report and notebook tests. Built
once per test session (~10-20 s on 2 busy cores) and only read afterwards."""
from __future__ import annotations

import io
from pathlib import Path

import pytest

#: 2x L4 holds qwen2.5-7b on TP 1 only with enough memory utilisation: the sampler
#: meets vLLM's refusals as well as two layouts (tp1x2, tp2x1).
SPACE = """
name: analysis-test
deployment: {model: qwen2.5-7b, gpu: L4, gpus: 2}
workload: {target_ttft_s: 1s, requests: 60, load: concurrency, seed: 0}
parameters:
  gpu_memory_utilization: {low: 0.60, high: 0.95, step: 0.05}
  max_num_seqs: {choices: [8, 16, 32, 64]}
  max_model_len: {choices: [4096, 32768]}
  enable_prefix_caching: {choices: [true, false]}
layouts: auto
"""
STUDY = "analysis-test"
TARGET_S = 1.0
BUDGET = 10

_BUILT: dict[str, Path] = {}


def build(folder: Path) -> Path:
    """``folder/analysis-test.db``: BUDGET sim trials and a plan of the best one."""
    from tuner.plan import Sweep, plan_capacity
    from tuner.search import num_heads, run_search
    from tuner.space import load_space

    path = folder / "analysis-test.yaml"
    path.write_text(SPACE, encoding="utf-8")
    space = load_space(str(path))
    space = space.bind(space.deployment, num_heads(space.deployment))
    db = folder / f"{STUDY}.db"
    out = run_search(space, budget=BUDGET, storage=f"sqlite:///{db}", study=STUDY, seed=0, max_replays=3)
    assert out.best is not None, "the test study found no feasible configuration"
    plan_capacity(TARGET_S, study=out.study, sweep=Sweep(requests=60, levels=(2, 4, 8, 16), max_extensions=2))
    return db


@pytest.fixture(scope="session")
def sim_study_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if "db" not in _BUILT:
        _BUILT["db"] = build(tmp_path_factory.mktemp("sim_study"))
    return _BUILT["db"]


def png_pixels(data: bytes):
    """PNG bytes as an array of RGB(A) floats in [0, 1]."""
    import matplotlib.image

    return matplotlib.image.imread(io.BytesIO(data), format="png")


def is_blank(data: bytes) -> bool:
    """True when the PNG is one flat colour (an empty figure, a failed render)."""
    pixels = png_pixels(data)
    return float(pixels[..., :3].std()) == 0.0


def colourful_share(data: bytes, min_saturation: float = 0.25) -> float:
    """Share of pixels with colour (not white, grey or black): plot markers and lines,
    never page text."""
    import numpy as np

    rgb = png_pixels(data)[..., :3]
    hi, lo = rgb.max(axis=-1), rgb.min(axis=-1)
    saturation = np.where(hi > 0, (hi - lo) / np.maximum(hi, 1e-9), 0.0)
    return float((saturation > min_saturation).mean())
