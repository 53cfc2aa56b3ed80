"""Studies written by an earlier release stay readable: a study made by tuner 0.1.0
(``tests/fixtures/study-0.1.0``: ``tuner search`` on the simulator, then ``tuner plan``;
its trials carry no schema version) is read through plan, report and the notebook's
functions, which must find the facts that release's own readers found
(``facts.json``, written by them when the study was made)."""
from __future__ import annotations

import html
import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest

from tuner.serving.result import BENCH_FIELDS

FIXTURE = Path(__file__).parent / "fixtures" / "study-0.1.0"
STUDY = "release-0.1.0"
#: Columns of the trials frame that are the study's facts (not timings of this machine).
_TIMING = ("datetime_start", "duration_s")
#: The fields of a plan sweep (tuner.study.tables.PlanSweep) that 0.1.0 wrote as the frame's attrs.
_PLAN_FIELDS = ("bound", "load_kind", "max_concurrency", "max_load", "plan", "target_ttft_s", "tokens_per_s", "trial")


def _clean(value: Any) -> Any:
    """JSON-comparable: NaN as None, numbers rounded to 9 significant digits, tuples as lists."""
    if isinstance(value, float):
        return None if math.isnan(value) else float(f"{value:.9g}")
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if hasattr(value, "item"):  # numpy scalars
        return _clean(value.item())
    return value


def facts(study: Any) -> dict[str, Any]:
    """What the readers of a study find in it: the notebook's tables (:mod:`tuner.study.analysis`),
    the stored plan (:func:`tuner.plan.load_plan`) and the answer with its serve command."""
    from tuner.plan import load_plan, summary_rows
    from tuner.search import serve_command
    from tuner.serving.config import Deployment
    from tuner.study import analysis, trial_config

    frame = analysis.trials_frame(study).frame
    rows = [{k: v for k, v in row.items() if k not in _TIMING} for row in frame.to_dict("records")]
    top = analysis.top_groups(study).frame
    sweep = analysis.plan_sweep(study)
    best = analysis.best_trial(study)
    dep = study.user_attrs["deployment"]
    est = load_plan(study)
    return _clean({
        "target_ttft_s": analysis.target_ttft_s(study),
        "trials": rows,
        "top": top[["number", "trials", "members", "tokens_per_s", "folded"]].to_dict("records"),
        "sweep": sweep.frame.to_dict("records"),
        # what 0.1.0 kept in the sweep frame's attrs: the plan's fields now (no SLOs besides P95 TTFT then)
        "sweep_attrs": {k: getattr(sweep, k) for k in _PLAN_FIELDS} | ({"slos": sweep.slos} if sweep.slos else {}),
        "best": best.number,
        "best_value": best.value,
        "config": trial_config(best).to_dict(),
        "command": serve_command(Deployment(**{**dep, "gpu_ids": tuple(dep.get("gpu_ids") or ())}), trial_config(best)),
        "plan": {"trial": est.trial, "max_load": est.max_load, "tokens_per_s": est.tokens_per_s,
                 "workload": est.workload.fingerprint, "summary": summary_rows(est)},
    })


@pytest.fixture
def old_study(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A copy of the 0.1.0 study (opening SQLite writes beside the file), read from the
    repository root, where its search space's recorded path leads."""
    from tuner.study.analysis import open_study

    shutil.copy(FIXTURE / "study.db", tmp_path / "study.db")
    monkeypatch.chdir(FIXTURE.parents[2])
    return open_study(tmp_path / "study.db")


#: What today's rules derive (tuner.study.effective: which knobs could not act): a later release
#: may fold more knobs than 0.1.0 did, never fewer, and group no trials apart that it grouped.
_DERIVED = ("group", "folded", "recommended")
#: vllm bench serve's names for what the summary holds (tuner.serving.result.bench_fields): derived
#: on read, so an old study has them too (checked against the seconds below); ``completed``
#: was a column of the summary already.
_BENCH = tuple(f for f in BENCH_FIELDS if f != "completed")


def _clauses(folded: str | None) -> set[str]:
    return set((folded or "").split("; ")) - {""}


def test_the_notebook_functions_and_the_stored_plan_read_what_0_1_0_read(old_study):
    from tuner.study import repeats

    expected = json.loads((FIXTURE / "facts.json").read_text())
    # 0.1.0 kept the confirmation's repeats among the trials; they are read as repeats now, not rows
    kept = {t.number for t in repeats(old_study)}
    assert kept and all(t.user_attrs["confirm_of"] not in kept for t in repeats(old_study))
    expected["trials"] = [row for row in expected["trials"] if row["number"] not in kept]
    for then in expected["top"]:
        then["members"] = [m for m in then["members"] if m not in kept]
        then["trials"] = len(then["members"])
    got = facts(old_study)
    assert {k: v for k, v in got.items() if k not in ("trials", "top")} == \
        {k: v for k, v in expected.items() if k not in ("trials", "top")}
    assert [{k: v for k, v in row.items() if k not in _DERIVED + _BENCH} for row in got["trials"]] == \
        [{k: v for k, v in row.items() if k not in _DERIVED} for row in expected["trials"]]
    measured = [row for row in got["trials"] if row.get("ttft_p95_s") is not None]
    assert measured and all(row["p95_ttft_ms"] == pytest.approx(row["ttft_p95_s"] * 1e3) for row in measured)
    assert all(row["std_ttft_ms"] is None for row in measured)  # 0.1.0 kept no std: none, not made up
    for now, then in zip(got["trials"], expected["trials"]):
        assert _clauses(then["folded"]) <= _clauses(now["folded"]), now.get("number")
    # top groups: a knob folded now that was not then may merge groups of 0.1.0, never split
    # one; each group reads its best trial, and the best group is the same trial
    value = {row["number"]: row["tokens_per_s"] for row in got["trials"]}
    for then in expected["top"]:
        holder = [now for now in got["top"] if set(then["members"]) <= set(now["members"])]
        assert len(holder) == 1, then["members"]
        assert _clauses(then["folded"]) <= _clauses(holder[0]["folded"]), then["number"]
    for now in got["top"]:
        assert now["trials"] == len(now["members"]) and now["tokens_per_s"] == value[now["number"]]
        assert value[now["number"]] == max(value[m] for m in now["members"] if m in value)
    assert got["top"][0]["number"] == expected["top"][0]["number"]


def test_the_report_of_a_0_1_0_study_shows_its_answer_plan_and_reasons(old_study):
    from tuner.report.html import render_report

    expected = json.loads((FIXTURE / "facts.json").read_text())
    page, _ = render_report(old_study)
    assert html.escape(expected["command"]) in page
    for label, value in expected["plan"]["summary"]:
        assert f"<th class='l'>{html.escape(label)}</th><td class='l'>{html.escape(value)}</td>" in page
    for row in expected["trials"]:
        if row["reason"]:
            assert html.escape(row["reason"]) in page


def test_plan_replays_a_0_1_0_study_on_the_requests_and_configuration_it_recorded(old_study):
    """The study's own workload is rebuilt from what its trials recorded, and the trial's
    configuration and deployment are read back (the capacity itself is the simulator's of
    today, which may have been calibrated since)."""
    from tuner.plan import Sweep, load_plan, plan_capacity

    stored = load_plan(old_study)
    again = plan_capacity(stored.target_ttft_s, study=old_study, store=False,
                          sweep=Sweep(requests=stored.workload.requests, levels=(1, 2, 4, 8)))
    assert again.workload.match == "same" and again.workload.fingerprint == stored.workload.fingerprint
    assert (again.trial, again.config, again.deployment) == (stored.trial, stored.config, stored.deployment)
    assert {p.level for p in again.sweep if p.role == "sweep"} == {p.level for p in stored.sweep if p.role == "sweep"}


def test_the_repeats_a_0_1_0_study_kept_among_its_trials_are_read_as_repeats(old_study):
    from tuner.study import analysis, confirmation_study, count_finished, recommendation, repeats

    expected = json.loads((FIXTURE / "facts.json").read_text())
    kept = repeats(old_study)  # no companion: the old study's own trials with confirm_of
    assert kept and confirmation_study(old_study) is None
    assert {t.number for t in kept} <= {t.number for t in old_study.trials}
    configurations = len(old_study.trials) - len(kept)
    assert count_finished(old_study) == configurations == len(analysis.trials_frame(old_study))
    assert recommendation(old_study).trial == analysis.trials_frame(old_study).recommended == expected["best"]


def test_a_0_1_0_study_resumes_in_the_encoding_its_trials_hold(old_study, tmp_path):
    """0.1.0 stored ordered choices as ``<knob>_index`` and constraints by name: resumed, the
    new trials do too (Optuna refuses a second distribution for a parameter of a study, and
    its GP sampler constraint names that differ between trials), and read as values."""
    from tuner.search import num_heads, run_search
    from tuner.space import load_space
    from tuner.study import count_finished, trial_config

    space = load_space(str(FIXTURE / "space.yaml"))
    space = space.bind(space.deployment, num_heads(space.deployment))
    before = {t.number for t in old_study.trials}
    out = run_search(space, budget=count_finished(old_study) + 2, storage=f"sqlite:///{tmp_path / 'study.db'}",
                     study=STUDY, seed=3, max_replays=3)
    new = [t for t in out.study.trials if t.number not in before and t.state.is_finished() and t.params]
    assert new
    seqs = next(p for p in space.params if p.name == "max_num_seqs")
    for t in new:
        assert "max_num_seqs" not in t.params
        assert trial_config(t).max_num_seqs == seqs.choices[t.params["max_num_seqs_index"]]
        assert space.config_from_params(t.params).max_num_seqs == trial_config(t).max_num_seqs
        if t.state.name == "COMPLETE":
            assert set(t.constraints) == {"p95_ttft_over_target"}, t.number
