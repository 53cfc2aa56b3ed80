from __future__ import annotations

import dataclasses

import matplotlib
import matplotlib.pyplot as plt
import optuna
import pytest
from sim_study import TARGET_S, is_blank, sim_study_db  # noqa: F401  (session fixture)

from tuner.core.errors import InputError
from tuner.plots import (
    CAPTIONS,
    knob_importances,
    load_points,
    per_user_front,
    plot_capacity,
    plot_history,
    plot_importances,
    plot_layouts,
    plot_per_user_front,
    plot_tradeoff,
    plot_ttft_by_load,
    png_bytes,
    study_plots,
)
from tuner.study.analysis import best_trial, open_study, plan_sweep, trials_frame
from tuner.study.tables import PlanSweep

pytestmark = pytest.mark.slow  # the shared simulator study takes ~10-20 s to build once


def test_every_figure_of_the_sim_study_is_drawn_and_not_blank(sim_study_db):
    study = open_study(sim_study_db)
    plots = study_plots(study)
    assert [p.name for p in plots] == list(CAPTIONS)
    for p in plots:
        assert p.skipped is None, f"{p.name}: {p.skipped}"
        assert not is_blank(png_bytes(p.figure)), p.name
    # no pyplot window keeps them, and Optuna's style sheet does not leak into the session
    assert plt.get_fignums() == []
    assert matplotlib.rcParams["axes.facecolor"] == matplotlib.rcParamsDefault["axes.facecolor"]


def _star(fig):
    star = [c for c in fig.axes[0].collections if c.get_label().startswith("best feasible")]
    assert len(star) == 1
    return star[0].get_label(), tuple(star[0].get_offsets()[0])


def test_tradeoff_marks_the_best_feasible_trial_and_the_target(sim_study_db):
    study = open_study(sim_study_db)
    trials = trials_frame(study)
    best = best_trial(study)
    fig = plot_tradeoff(trials)  # the table's own target and recommended trial
    label, (x, y) = _star(fig)
    assert label == f"best feasible (#{best.number})"
    assert y == pytest.approx(best.value) and x == pytest.approx(best.user_attrs["summary"]["ttft_p95_s"])
    assert x <= TARGET_S
    target_lines = [line for line in fig.axes[0].get_lines() if line.get_label().startswith("target")]
    assert target_lines and target_lines[0].get_xdata()[0] == TARGET_S


def test_tradeoff_stars_the_recommended_trial_not_a_luckier_measurement(sim_study_db):
    study = open_study(sim_study_db)
    frame = trials_frame(study).to_frame()
    best = best_trial(study).number
    lucky = frame[frame["feasible"] & (frame["number"] != best)].index[0]  # measured more, not recommended
    frame.loc[lucky, "tokens_per_s"] = frame["tokens_per_s"].max() * 1.05
    assert _star(plot_tradeoff(frame, best=best))[0] == f"best feasible (#{best})"
    # without the study's recommendation: the fastest feasible measurement
    assert _star(plot_tradeoff(frame))[0] == f"best feasible (#{int(frame.loc[lucky, 'number'])})"
    # the report's figure is drawn with the recommendation
    tradeoff = next(p for p in study_plots(study) if p.name == "tradeoff")
    assert _star(tradeoff.figure)[0] == f"best feasible (#{best})"


def test_layouts_has_one_box_per_layout_the_study_ran(sim_study_db):
    trials = trials_frame(open_study(sim_study_db))
    fig = plot_layouts(trials)
    labels = [t.get_text().split("\n")[0] for t in fig.axes[0].get_xticklabels()]
    assert sorted(labels) == sorted(trials.frame["layout"].unique())


def test_capacity_curve_crosses_the_target_at_the_plan_capacity(sim_study_db):
    sweep = plan_sweep(open_study(sim_study_db))
    fig = plot_capacity(sweep)
    ax = fig.axes[0]
    capacity = [line for line in ax.get_lines() if line.get_label().startswith("capacity")]
    assert capacity[0].get_xdata()[0] == sweep.max_load
    target = [line for line in ax.get_lines() if line.get_label().startswith("target")]
    assert target[0].get_ydata()[0] == sweep.target_ttft_s == TARGET_S
    assert ax.get_title().startswith(f"capacity curve ({sweep.plan}): ")
    # the frame alone does not say the plan's target and capacity: refused by name
    with pytest.raises(InputError, match="sweep must be the PlanSweep"):
        plot_capacity(sweep.frame)


def test_an_empty_study_skips_every_figure_with_a_reason():
    study = optuna.create_study(direction="maximize")
    plots = study_plots(study)
    assert all(p.figure is None and p.skipped for p in plots)
    with pytest.raises(InputError, match="no completed trial"):
        plot_history(study)
    with pytest.raises(InputError, match="at least 4 completed trials"):
        plot_importances(study)
    with pytest.raises(InputError, match="tuner plan"):
        plot_capacity(plan_sweep(study))


def test_importances_name_the_knobs_as_the_search_space_does(sim_study_db):
    import dataclasses

    from tuner.serving.config import ServeConfig

    study = open_study(sim_study_db)
    assert "max_num_seqs" in study.best_trial.params  # an ordered choice is stored under its own name
    importances = knob_importances(study)
    knobs = {f.name for f in dataclasses.fields(ServeConfig)} | {"layout"}
    assert set(importances) <= knobs and "max_num_seqs" in importances
    assert sum(importances.values()) == pytest.approx(1.0)
    assert list(importances.values()) == sorted(importances.values(), reverse=True)
    labels = [t.get_text() for t in plot_importances(study).axes[0].get_yticklabels()]
    assert labels == list(importances)[::-1]  # most important at the top


def test_the_verify_run_is_in_the_capacity_legend_as_drawn(sim_study_db):
    import matplotlib.colors as mcolors
    import pandas as pd

    sweep = plan_sweep(open_study(sim_study_db))
    runs = sweep.frame
    # whether a plan ends in a verify run depends on where its sweep crosses the target:
    # here the sweep's highest point, measured again as the verify run
    runs = pd.concat([runs[runs["role"] != "verify"], runs.iloc[[-1]].assign(role="verify")], ignore_index=True)
    fig = plot_capacity(dataclasses.replace(sweep, frame=runs))
    legend = next(a.get_legend() for a in fig.axes if a.get_legend() is not None)
    texts = [t.get_text() for t in legend.get_texts()]
    handle = legend.legend_handles[texts.index("verify run")]
    face = mcolors.to_rgba(handle.get_markerfacecolor())
    assert face[3] == 1.0 and face[:3] != (1.0, 1.0, 1.0), "a hollow or white marker vanishes in the legend"
    assert handle.get_markersize() >= 6
    assert legend.get_frame().get_alpha() in (None, 1.0)


def test_layouts_need_more_than_one_layout(sim_study_db):
    frame = trials_frame(open_study(sim_study_db)).frame
    one = frame[frame["layout"] == frame["layout"].iloc[0]]
    with pytest.raises(InputError, match="only one layout was tried"):
        plot_layouts(one)


def test_tradeoff_colours_each_trial_by_the_slo_that_binds_it():
    import pandas as pd
    from matplotlib.colors import to_rgba

    slos = ("p95:ttft<=1s", "p99:tpot<=30ms")
    frame = pd.DataFrame({
        "number": [0, 1, 2, 3], "status": ["feasible", "feasible", "infeasible", "feasible"],
        "feasible": [True, True, False, True], "tokens_per_s": [900.0, 700.0, 300.0, 500.0],
        "ttft_p95_s": [0.9, 0.4, 0.3, 0.5], "binding_slo": ["p95:ttft<=1s", "p99:tpot<=30ms", "p99:tpot<=30ms", None]})
    ax = plot_tradeoff(frame, 1.0, best=0, slos=slos).axes[0]
    labels = [h.get_label() for h in ax.get_legend().legend_handles]
    assert labels[:3] == ["p95:ttft<=1s binds (1)", "p99:tpot<=30ms binds (2)", "binding SLO not recorded (1)"]
    entry = {h.get_label(): to_rgba(h.get_facecolor()[0]) for h in ax.get_legend().legend_handles[:3]}
    drawn = {}
    for c in [c for c in ax.collections if c.get_label().startswith("_")]:  # the trials, not the star
        for x, y in c.get_offsets():
            drawn[(float(x), float(y))] = to_rgba(c.get_facecolor()[0])
    assert drawn[(0.9, 900.0)][:3] == entry["p95:ttft<=1s binds (1)"][:3]
    assert drawn[(0.4, 700.0)][:3] == drawn[(0.3, 300.0)][:3] == entry["p99:tpot<=30ms binds (2)"][:3]
    assert drawn[(0.4, 700.0)][:3] != drawn[(0.9, 900.0)][:3]
    plain = plot_tradeoff(frame, 1.0, best=0).axes[0]  # one SLO: coloured by status, as before
    assert "feasible (3)" in [h.get_label() for h in plain.get_legend().legend_handles]


def test_the_capacity_curve_colours_each_run_by_the_slo_that_limits_it():
    import pandas as pd

    sweep = pd.DataFrame({
        "level": [2.0, 8.0, 16.0, 24.0, 20.0], "repeat": [0] * 5, "role": ["sweep"] * 4 + ["verify"],
        "ttft_p95_s": [0.2, 0.27, 0.8, 1.07, 0.9], "tokens_per_s": [130.0, 460.0, 740.0, 970.0, 860.0],
        "binding_slo": ["p99:tpot<=60ms", "p99:tpot<=60ms", "p95:ttft<=1s", "p95:ttft<=1s", "p95:ttft<=1s"]})
    sweep = PlanSweep(sweep, "s", plan="trial 2 at 1 s", target_ttft_s=1.0, max_load=20.0, bound="interpolated",
                      load_kind="concurrency", tokens_per_s=860.0, slos=("p95:ttft<=1s", "p99:tpot<=60ms"))
    labels = [t.get_text() for t in plot_capacity(sweep).axes[1].get_legend().get_texts()]
    assert "p95:ttft<=1s limits (3)" in labels and "p99:tpot<=60ms limits (2)" in labels  # the verify run counts
    assert "verify run" in labels


def _plot(study, name):
    return next(p for p in study_plots(study) if p.name == name)


def test_ttft_by_load_draws_the_best_configurations_at_the_loads_they_ran(sim_study_db):
    from tuner.study.analysis import top_groups
    from tuner.study.record import TrialRecord

    study = open_study(sim_study_db)
    fig = _plot(study, "ttft_by_load").figure
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    groups = top_groups(study, 5).frame
    named = [label for label in labels if label.startswith("#")]
    assert 1 <= len(named) <= 5 and [int(n[1:].split()[0]) for n in named] == list(groups["number"][:len(named)])
    best = best_trial(study).number
    assert [n for n in named if "★" in n] == [f"#{groups['number'][0]} ★ ({groups['layout'][0]})"]
    assert best in groups["members"][0]
    target = [line for line in ax.get_lines() if line.get_label().startswith("target")]
    assert list(target[0].get_ydata()) == [TARGET_S, TARGET_S]
    # the best configuration's line runs through the loads its trials measured, by load
    loads = {p.level: p.p95_ttft_s for m in groups["members"][0] for p in TrialRecord.from_trial(study.trials[m]).loads}
    line = next(line for line in ax.get_lines() if line.get_linestyle() == "-" and len(line.get_xdata()))
    assert sorted(line.get_xdata()) == list(line.get_xdata()) == sorted(loads)
    assert set(line.get_xdata()) == set(loads)


def test_load_points_reproduce_the_output_throughput_measured_at_the_chosen_load(sim_study_db):
    from tuner.study.record import TrialRecord

    study = open_study(sim_study_db)
    points = load_points(study)
    checked = 0
    for t in study.trials:
        rec = TrialRecord.from_trial(t)
        rows = points[points["number"] == t.number]
        if rec.is_repeat:
            assert rows.empty  # a copy of an earlier trial's measurement is not a point of its own
            continue
        assert len(rows) == len(rec.loads)
        chosen = rows[rows["load"] == rec.chosen_load]
        if rec.feasible and len(chosen) and not chosen["output_tokens_per_s"].isna().all():
            assert chosen["output_tokens_per_s"].iloc[0] == pytest.approx(rec.summary["output_tokens_per_s"])
            checked += 1
    assert checked >= 3
    # a run stopped early holds no throughput to compare
    assert points.loc[points["stopped_early"].astype(bool), "output_tokens_per_s"].isna().all()


def _points(rows):
    import pandas as pd

    frame = pd.DataFrame(rows, columns=["number", "level", "output_tokens_per_s", "gpus", "passed"])
    return frame.assign(load_kind="concurrency", layout="tp1x1", p95_ttft_s=1.0)


def test_the_per_user_front_keeps_the_points_no_other_beats_on_both_and_met_the_slos():
    points = _points([
        (0, 10.0, 1000.0, 1, True),    # 100 per user, 1000 per GPU: on the front (fastest per user)
        (1, 100.0, 5000.0, 1, True),   # 50 per user, 5000 per GPU: on it (most per GPU)
        (2, 50.0, 2000.0, 1, True),    # 40, 2000: beaten on both by trial 1
        (3, 100.0, 8000.0, 2, True),   # 80, 4000: on it, between them (two GPUs)
        (4, 200.0, 16000.0, 1, False),  # 80, 16000 would beat them all, but it missed an SLO
    ])
    rows = per_user_front(points)
    assert sorted(rows.loc[rows["front"], "number"]) == [0, 1, 3]
    fig = plot_per_user_front(points, recommended=3)
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert labels == ["missed an SLO (1)", "met every SLO (4)", "Pareto front (3)", "recommended (#3, 100 users)"]
    assert "missed" not in " ".join(t.get_text() for t in plot_per_user_front(points[points["passed"]])
                                    .axes[0].get_legend().get_texts())
    with pytest.raises(InputError, match="request rate"):
        plot_per_user_front(points.assign(load_kind="rate"))


def test_ttft_by_load_marks_the_loads_that_missed_hollow_and_pools_a_configuration_s_trials():
    points = _points([(7, 8.0, 0, 1, True), (7, 16.0, 0, 1, False), (9, 12.0, 0, 1, True)])
    points["p95_ttft_s"] = [0.5, 1.5, 0.9]
    ax = plot_ttft_by_load(points, [(7, 9)], target_s=1.0, recommended=9).axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "#7 ★ (tp1x1)", "hollow: missed at that load", "target P95 TTFT 1 s"]
    curve = next(line for line in ax.get_lines() if line.get_linestyle() == "-" and len(line.get_xdata()))
    assert list(curve.get_xdata()) == [8.0, 12.0, 16.0]  # trials 7 and 9 are one configuration
    hollow = [line for line in ax.get_lines() if line.get_markerfacecolor() == "white" and len(line.get_xdata())]
    assert [list(line.get_xdata()) for line in hollow] == [[16.0]]


def test_captions_describe_only_what_was_drawn_with_the_study_s_values():
    from tuner.plots._captions import Facts, caption

    three = Facts(target_s=3.0, slos=("p95:ttft<=3s",))
    for name in CAPTIONS:
        assert "2 s" not in caption(name, three)
    assert "red line at 3 s" in caption("ttft_by_load", three)
    assert "diamond" not in caption("capacity", three)  # a plan whose sweep ended without a verify run
    assert "the orange diamond is the run that verified it" in caption("capacity", Facts(target_s=3.0, verify_runs=1))
    assert "grey dots" not in caption("history", three)  # every trial feasible
    assert "grey dots" in caption("history", Facts(target_s=3.0, missed=True))
    several = caption("per_user", Facts(target_s=3.0, slos=("p95:ttft<=3s", "p99:tpot<=30ms")))
    assert "every SLO (p95:ttft<=3s, p99:tpot<=30ms)" in several


def test_a_study_s_figures_and_hints_name_its_own_target(tmp_path):
    from fakes import FakeBackend, small_workload
    from test_search import SPACE, fake_space

    from tuner.search import run_search

    space = fake_space(SPACE.replace("target_ttft_s: 1s", "target_ttft_s: 3s"))
    out = run_search(space, backend=FakeBackend(), workload=small_workload(), budget=3,
                     storage=f"sqlite:///{tmp_path}/s.db", sampler="random", seed=1, confirm=0)
    plots = {p.name: p for p in study_plots(out.study)}
    assert plots["capacity"].skipped == (f"the study holds no capacity plan "
                                         f"(run tuner plan --study {out.study.study_name} --target-ttft 3s)")
    for p in plots.values():
        assert "2 s" not in p.caption and "2s" not in (p.skipped or ""), p.name
