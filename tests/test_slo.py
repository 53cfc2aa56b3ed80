"""Service levels (tuner/serving/slo.py): parsing as people write them, which SLO binds, the
error-rate allowance, goodput as ``vllm bench serve --goodput`` counts it, and the
goodput search held to every SLO of a set."""
from __future__ import annotations

import math

import numpy as np
import pytest
from fakes import FakeBackend, small_workload

from tuner.core.errors import InputError
from tuner.search import evaluate_config
from tuner.serving.config import Deployment, ServeConfig
from tuner.serving.result import RunResult
from tuner.serving.slo import Slo, SloSet, monotone_crossing, parse_slo, split_slos
from tuner.space import parse_space
from tuner.study.record import TrialRecord


def test_slos_read_as_people_write_them():
    assert parse_slo("p95:ttft<=2s") == Slo(95, "ttft", 2.0)
    tpot = parse_slo("p99:tpot<=30ms")
    assert (tpot.percentile, tpot.metric, tpot.bound_s) == (99, "tpot", pytest.approx(0.03))
    assert parse_slo(" P90 : e2el <= 20s ") == Slo(90, "e2el", 20.0)
    assert parse_slo("p95:itl<=50ms").key == "itl_p95_s"
    assert parse_slo("p90:e2el<=20s").key == "e2e_p90_s"  # vLLM's e2el is tuner's e2e column
    for text in ("p95:ttft<=2s", "p99:tpot<=30ms", "p90:e2el<=20s"):
        assert parse_slo(text).text == text


@pytest.mark.parametrize("bad", ["p95:ttft<2s", "p97:ttft<=2s", "p95:speed<=1s", "p95:ttft<=-1s",
                                 "p95:ttft<=soon", "ttft<=2s", ""])
def test_a_bad_slo_is_one_line_that_quotes_it(bad):
    with pytest.raises(InputError) as err:
        parse_slo(bad)
    assert repr(bad) in str(err.value)
    assert "\n" not in str(err.value)


def test_the_binding_slo_is_the_one_with_the_smallest_margin():
    slos = SloSet.of(["p95:ttft<=2s", "p99:tpot<=30ms"])
    summary = {"ttft_p95_s": 1.5, "tpot_p99_s": 0.033, "error_rate": 0.0}
    assert not slos.meets(summary)
    assert slos.binding(summary).text == "p99:tpot<=30ms"
    assert slos.ratio(summary) == pytest.approx(1.1)
    summary["tpot_p99_s"] = 0.021  # margin 30 % against TTFT's 25 %
    assert slos.meets(summary)
    assert slos.binding(summary).text == "p95:ttft<=2s"


def test_a_metric_never_measured_fails_and_errors_past_the_allowance_fail():
    slos = SloSet.of(["p95:ttft<=2s", "p95:itl<=50ms"])
    assert not slos.meets({"ttft_p95_s": 1.0, "error_rate": 0.0})  # no ITL recorded
    assert slos.ratios({"ttft_p95_s": 1.0})["p95_itl"] == math.inf
    ok = {"ttft_p95_s": 1.0, "itl_p95_s": 0.01}
    assert slos.meets({**ok, "error_rate": 0.01})
    assert not slos.meets({**ok, "error_rate": 0.02})


def _result() -> RunResult:
    # a: good; b: TTFT over 1 s; c: TPOT (3 s - 0.5 s) / 9 = 0.28 s over 0.1 s;
    # d: failed; e: one output token, TPOT counted 0 as vLLM does
    return RunResult(
        send_s=np.zeros(5), ttft_s=np.array([0.5, 1.5, 0.5, np.nan, 0.5]),
        e2e_s=np.array([1.0, 2.0, 3.0, np.nan, 9.0]), prompt_tokens=np.full(5, 10),
        output_tokens=np.array([10, 10, 10, 0, 1]), error=[None, None, None, "http_500", None], duration_s=2.0)


def test_goodput_counts_requests_meeting_every_per_request_bound_as_vllm_bench_does():
    result = _result()
    assert SloSet.of(["p95:ttft<=1s"]).goodput(result) == pytest.approx(3 / 2.0)  # a, c, e
    assert SloSet.of(["p95:ttft<=1s", "p99:tpot<=100ms"]).goodput(result) == pytest.approx(2 / 2.0)  # a, e
    assert SloSet.of(["p95:ttft<=1s", "p99:tpot<=100ms", "p90:e2el<=5s"]).goodput(result) == pytest.approx(1 / 2.0)
    # ITL is no per-request figure (vLLM's --goodput takes none): it does not change goodput
    assert SloSet.of(["p95:ttft<=1s", "p95:itl<=1ms"]).goodput(result) == pytest.approx(3 / 2.0)


def test_a_slo_set_names_its_study_apart_but_ttft_alone_as_before():
    assert SloSet.ttft(2.0).key() == ""
    a = SloSet.of(["p95:ttft<=2s", "p99:tpot<=30ms", "p90:e2el<=20s"]).key()
    b = SloSet.of(["p90:e2el<=20s", "p95:ttft<=2s", "p99:tpot<=30ms"]).key()
    assert a == b and a != SloSet.of(["p95:ttft<=2s", "p99:tpot<=40ms"]).key()
    with pytest.raises(InputError, match="two bounds for P99 TPOT"):
        SloSet.of(["p99:tpot<=30ms", "p99:tpot<=40ms"])
    with pytest.raises(InputError, match="two bounds for P95 TTFT"):
        split_slos(["p95:ttft<=2s", "p95:ttft<=1s"])
    assert split_slos(["p99:tpot<=30ms", "p95:ttft<=1s"]) == (1.0, ("p99:tpot<=30ms",))


def test_the_monotone_crossing_follows_the_running_maximum():
    assert monotone_crossing([(10, 0.5), (20, 1.5)], 1.0, 10, 20) == pytest.approx(15.0, abs=0.01)
    assert monotone_crossing([(10, 0.5), (15, 0.4), (20, 1.5)], 1.0, 15, 20) < 20
    assert monotone_crossing([(10, 0.5), (20, 0.9)], 1.0, 10, 20) is None


def test_a_search_space_holds_slos_and_a_ttft_one_is_its_target():
    space = parse_space("name: s\nworkload: {target_ttft_s: 5s, slos: ['p99:tpot<=30ms', 'p95:ttft<=1s']}\n")
    assert space.workload.target_ttft_s == 1.0
    assert space.workload.slo.texts == ("p95:ttft<=1s", "p99:tpot<=30ms")
    with pytest.raises(InputError) as err:
        parse_space("name: s\nworkload:\n  slos: ['p99:tpot<30ms']\n", path="s.yaml")
    assert "s.yaml:3" in str(err.value) and "'p99:tpot<30ms'" in str(err.value)


def test_the_goodput_search_stops_at_the_first_slo_to_break_and_names_it():
    # the fake's E2E is TTFT + 1 s: P95 E2EL <= 1.5 s breaks near 47 users, P95 TTFT <= 1 s near 95
    config = ServeConfig(max_num_seqs=256, gpu_memory_utilization=0.9)
    ttft_only = evaluate_config(FakeBackend(ttft_per_user=0.01), Deployment(), config, small_workload(600), 1.0)
    slos = SloSet.of(["p95:ttft<=1s", "p95:e2el<=1.5s"])
    both = evaluate_config(FakeBackend(ttft_per_user=0.01), Deployment(), config, small_workload(600), slos)
    assert both.feasible and both.value < ttft_only.value
    assert both.record.summary["e2e_p95_s"] <= 1.5
    assert both.record.binding_slo == "p95:e2el<=1.5s"
    assert set(both.named_constraints()) == {"p95_ttft_over_target", "p95_e2el_over_target"}
    assert all(c <= 0 for c in both.named_constraints().values())
    assert ttft_only.named_constraints() == {"p95_ttft_over_target": ttft_only.constraint}
    assert both.record.goodput_requests_per_s > 0
    tight = SloSet.of(["p95:ttft<=1s", "p95:e2el<=900ms"])  # E2E is at least 1 s: never met
    miss = evaluate_config(FakeBackend(ttft_per_user=0.01), Deployment(), config, small_workload(600), tight)
    assert not miss.feasible
    assert "P95 E2EL" in miss.record.infeasible_reason and "p95:e2el<=900ms binds" in miss.record.infeasible_reason
    assert miss.named_constraints()["p95_e2el_over_target"] > 0


def test_a_plan_meets_every_slo_and_names_the_one_that_limits_each_load():
    from tuner.plan import Sweep, plan_capacity

    def plan(slos):
        return plan_capacity(1.0, config=ServeConfig(max_num_seqs=256), backend=FakeBackend(ttft_per_user=0.01),
                             workload=small_workload(600), sweep=Sweep(levels=[10, 20, 40, 80, 120]), store=False,
                             slos=slos)

    ttft_only, both = plan(None), plan(["p95:e2el<=1.5s"])
    assert ttft_only.slos == () and both.slos == ("p95:e2el<=1.5s",)
    assert both.max_load < ttft_only.max_load  # E2EL breaks near 47 users, TTFT near 95
    assert both.e2e_mean_s <= 1.5 and both.binding_slo == "p95:e2el<=1.5s"
    assert both.goodput_requests_per_s > 0
    chosen = [p for p in both.sweep if p.level == both.max_load]
    assert chosen and all(p.meets(1.0) for p in chosen)
    assert all(p.binding_slo == "p95:e2el<=1.5s" for p in both.sweep)  # E2EL = TTFT + 1 s binds everywhere
    assert not next(p for p in both.sweep if p.level == 80).meets(1.0)  # TTFT ok at 80 users, E2EL not
    assert next(p for p in ttft_only.sweep if p.level == 80).meets(1.0)


def test_the_fidelity_table_compares_the_tails_users_state_as_slos():
    from tuner.calibrate.fidelity import by_shape, with_tails

    table = [{"name": "a", "set": "check", "model": "qwen2.5-7b"}, {"name": "b", "set": "check", "model": "qwen2.5-7b"},
             {"name": "c", "set": "check", "model": "qwen2.5-7b"}]
    measured = {"a": {"tpot_p99_s": 0.020, "itl_p95_s": 0.010}, "b": {"tpot_p99_s": 0.040, "itl_p95_s": 0.010},
                "c": {"tpot_p99_s": 0.030}}  # c's run recorded no ITL: it is left out of the ITL MAPE
    predicted = {"a": {"tpot_p99_s": 0.022, "itl_p95_s": 0.005}, "b": {"tpot_p99_s": 0.040, "itl_p95_s": 0.010},
                 "c": {"tpot_p99_s": 0.027, "itl_p95_s": 0.1}}
    (group,) = by_shape(with_tails(table, measured, predicted))
    assert group["tpot_p99_s"] == pytest.approx((10 + 0 + 10) / 3)
    assert group["itl_p95_s"] == pytest.approx((50 + 0) / 2)


def test_a_study_with_slos_is_another_study_with_a_constraint_per_slo(tmp_path):
    from test_search import SPACE, fake_space

    from tuner.search import run_search

    storage = f"sqlite:///{tmp_path}/s.db"
    with_slos = fake_space(SPACE.replace("requests: 60}", "requests: 60, slos: ['p95:e2el<=1.5s']}"))
    plain = run_search(fake_space(), backend=FakeBackend(), workload=small_workload(), budget=3, storage=storage,
                       seed=1, confirm=0)
    held = run_search(with_slos, backend=FakeBackend(), workload=small_workload(), budget=3, storage=storage,
                      seed=1, confirm=0)
    assert held.name == plain.name.removesuffix(".fake") + ".p95e2el1.5s.fake"
    assert held.slos == ("p95:ttft<=1s", "p95:e2el<=1.5s")
    done = [t for t in held.study.trials if t.state.name == "COMPLETE"]
    # one Optuna constraint per SLO, in name order; the names in the trial's record
    both = sorted(["p95_ttft_over_target", "p95_e2el_over_target"])
    assert done and all(sorted(TrialRecord.from_trial(t).constraints) == both for t in done)
    assert all(list(t.constraints.values()) == pytest.approx([TrialRecord.from_trial(t).constraints[k] for k in both])
               for t in done if "boundary" not in t.user_attrs)
    assert all(len(t.constraints) == 1 for t in plain.study.trials if t.constraints)
    best = held.best
    assert best is not None and best.user_attrs["summary"]["e2e_p95_s"] <= 1.5
    assert best.user_attrs["binding_slo"] == "p95:e2el<=1.5s"
    with pytest.raises(InputError, match="mix two SLO sets"):  # the same study resumed with other SLOs
        run_search(fake_space(), backend=FakeBackend(), workload=small_workload(), budget=4, storage=storage,
                   study=held.name, seed=1, confirm=0)


def test_the_goodput_objective_scores_requests_meeting_every_slo_at_the_same_edge():
    config = ServeConfig(max_num_seqs=256, gpu_memory_utilization=0.9)
    slos = SloSet.of(["p95:ttft<=1s", "p95:e2el<=1.5s"])
    tokens = evaluate_config(FakeBackend(ttft_per_user=0.01), Deployment(), config, small_workload(600), slos)
    good = evaluate_config(FakeBackend(ttft_per_user=0.01), Deployment(), config, small_workload(600), slos,
                           objective="goodput", incumbent=None)
    assert good.record.chosen_load == tokens.record.chosen_load
    assert good.value == pytest.approx(good.record.goodput_requests_per_s)
    assert 0 < good.value <= good.record.summary["requests_per_s"]
    assert tokens.value == pytest.approx(tokens.record.tokens_per_s)


def test_a_goodput_study_is_stamped_so_and_refuses_to_resume_scoring_tokens(tmp_path):
    from test_search import SPACE, fake_space

    from tuner.search import run_search
    from tuner.study.record import StudyRecord

    storage = f"sqlite:///{tmp_path}/s.db"
    space = fake_space(SPACE.replace("requests: 60}", "requests: 60, slos: ['p95:e2el<=1.5s']}"))
    good = run_search(space, backend=FakeBackend(), workload=small_workload(), budget=4, storage=storage,
                      sampler="random", seed=1, confirm=1, objective="goodput")
    assert StudyRecord.from_study(good.study).objective == "goodput"
    assert good.confirmation is not None
    reason = good.confirmation.reason
    assert "req/s goodput" in reason and "tok/s" not in reason
    trials = len(good.study.trials)
    with pytest.raises(InputError) as err:  # the same study, told to score tokens/s
        run_search(space, backend=FakeBackend(), workload=small_workload(), budget=6, storage=storage,
                   study=good.name, sampler="random", seed=1, confirm=0, objective="tokens")
    assert "scores goodput (req/s goodput), not tokens" in err.value.message
    assert "\n" not in err.value.message and "--objective goodput" in err.value.hint
    assert len(good.study.trials) == trials  # nothing written


def test_reasons_tell_a_goodput_study_in_requests_per_second():
    from tuner.study.race import Candidate, NoiseFloor, confirmation_rows, decide

    config = {"gpu_memory_utilization": 0.9, "max_num_seqs": 64, "enforce_eager": False}
    conf = decide([Candidate(3, config, [37.6, 37.8, 37.7])], NoiseFloor(0.01), objective="goodput")
    assert conf.reason.startswith("trial 3: 37.70 req/s goodput, mean of 3 measurements (37.60-37.80)")
    rows = dict(confirmation_rows(conf.mean, 3, conf.band, conf.ties, 0.01, "goodput"))
    assert rows["confirmed"] == "37.70 req/s goodput mean of 3 (37.60-37.80)"
    tokens = decide([Candidate(3, config, [27000.0, 27124.0])], NoiseFloor(0.01))
    assert tokens.reason.startswith("trial 3: 27,062 tok/s, mean of 2 measurements (27,000-27,124)")


def test_the_search_and_the_plan_place_the_edge_by_one_fit():
    from tuner.serving.capacity import max_load_meeting

    # a load measured twice, once over the bound: it fails (its worse value), in both
    points = [(10, 0.25), (20, 0.75), (20, 1.25), (30, 2.25)]
    assert monotone_crossing(points, 1.0, 10, 30) == pytest.approx(17.5, abs=1e-3)
    assert max_load_meeting(*zip(*points), 1.0).level == pytest.approx(17.5)
    # a run that measured nothing is a miss: no curve beyond it, for either
    assert monotone_crossing([(10, 0.5), (20, math.nan), (30, 2.0)], 1.0, 10, 30) is None
    assert max_load_meeting([10, 20, 30], [0.5, math.nan, 2.0], 1.0).level == 10


def test_a_load_meets_its_slos_by_one_rule_in_the_search_and_the_plan():
    from tuner.serving.capacity import SweepPoint

    slos = SloSet.of(["p95:ttft<=1s", "p99:tpot<=30ms"])
    cases = [({"ttft_p95_s": 0.9, "tpot_p99_s": 0.029, "error_rate": 0.01}, True),
             ({"ttft_p95_s": 0.9, "tpot_p99_s": 0.031, "error_rate": 0.0}, False),  # TPOT over
             ({"ttft_p95_s": 1.1, "tpot_p99_s": 0.010, "error_rate": 0.0}, False),  # TTFT over
             ({"ttft_p95_s": 0.9, "tpot_p99_s": 0.029, "error_rate": 0.011}, False),  # more than 1 % failed
             ({"ttft_p95_s": 0.9, "tpot_p99_s": math.nan, "error_rate": 0.0}, False)]  # TPOT not measured
    for summary, met in cases:
        point = SweepPoint.from_summary(10, "10 users", summary, slo_ratio=slos.ratio(summary))
        assert slos.meets(summary) is met and point.meets(1.0) is met, summary
