"""What studies are called: a study's name from its inputs, its objective's name, its companion's
name, and a listing without companions."""
from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import optuna

    from tuner.serving.config import Deployment


def study_name(deployment: Deployment, workload_fingerprint: str, space_name: str = "default",
               backend: str = "sim", target_ttft_s: float | None = None, slos: str = "") -> str:
    """``1xH100-SXM.qwen2.5-7b.default.3f9a1c2b.ttft2s``: deployment label, space, workload
    fingerprint (first 8 hex digits), the P95 TTFT target (feasibility depends on it, so
    two targets never share a study), and the backend unless it is the simulator (so a
    real study and its simulator warm start stay apart). ``slos`` (:meth:`tuner.serving.slo.SloSet.key`)
    names the service levels beyond P95 TTFT: another set is another study. Safe as a file name."""
    raw = f"{deployment.label()}.{space_name}.{workload_fingerprint[:8]}"
    if target_ttft_s is not None:
        raw += f".ttft{target_ttft_s:g}s"
    raw += slos
    if backend != "sim":
        raw += f".{backend}"
    return re.sub(r"[^A-Za-z0-9._-]+", "_", raw)


#: The objective's name, as optuna-dashboard and ``optuna.load_study(...).metric_names`` show it.
METRIC_NAMES = ["tokens_per_s"]


def name_objective(study: optuna.Study) -> optuna.Study:
    """Name the study's objective (:data:`METRIC_NAMES`; "Objective 0" otherwise), once."""
    import warnings

    import optuna

    if study.metric_names != METRIC_NAMES:
        with warnings.catch_warnings():  # set_metric_names is experimental since Optuna 3.2
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names(METRIC_NAMES)
    return study


#: What a study's companion is named after it (``<name>.confirm``): the study, in the same
#: storage, that holds the repeats confirming its winner (:func:`confirmation_study`).
COMPANION_SUFFIX = ".confirm"


def companion_name(name: str) -> str:
    """The name of study ``name``'s companion (:data:`COMPANION_SUFFIX`)."""
    return name + COMPANION_SUFFIX


def own_studies(names: list[str]) -> list[str]:
    """``names`` (a storage's studies, in its order) without the companions of studies among
    them: what ``tuner studies`` lists and a storage's "only" or "newest" study is one of."""
    present = set(names)
    return [n for n in names if not (n.endswith(COMPANION_SUFFIX) and n[: -len(COMPANION_SUFFIX)] in present)]
