"""The simulator as predictor for real backends: corrected start loads, pruning, twins."""
from __future__ import annotations

import optuna
import pytest
from fakes import FakeBackend, small_workload
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial
from test_search import fake_space

from tuner.backends.sim import SimBackend
from tuner.search import MAX_REPLAYS, evaluate_config, run_search
from tuner.search.prediction import (
    MIN_MATCHED,
    PRUNE_SHARE,
    TWIN_SHARE,
    Prediction,
    Predictor,
    advise,
    correction,
    sim_predictor,
)
from tuner.serving.config import Deployment, ServeConfig
from tuner.serving.load import Concurrency
from tuner.study.record import TrialRecord
from tuner.traffic.synth import default_workload


def measured(number: int, config: ServeConfig, *, value: float, level: float, pred: Prediction) -> optuna.trial.FrozenTrial:  # noqa: E501
    """A COMPLETE trial as run_search stores it: measured value and load, and the prediction."""
    t = create_trial(
        value=value, params={"x": 0.5}, distributions={"x": FloatDistribution(0, 1)},
        user_attrs={"config": config.to_dict(), "feasible": True, "tokens_per_s": value,
                    "loads": [{"level": level, "passed": True}, {"level": level * 1.2, "passed": False}],
                    "prediction": pred.to_dict()},
    )
    t.number = number
    return t


A = ServeConfig(max_num_seqs=64, tensor_parallel_size=1, replicas=2)
B = ServeConfig(max_num_seqs=128, tensor_parallel_size=1, replicas=2)
C = ServeConfig(max_num_seqs=256, tensor_parallel_size=1, replicas=2)


def study_so_far() -> list[optuna.trial.FrozenTrial]:
    # reality is 1.25x the prediction in load and 1.2x in tokens/s, on both trials
    return [
        measured(0, A, value=1200.0, level=50, pred=Prediction(True, 40, 1000.0, 0.8)),
        measured(1, B, value=2400.0, level=100, pred=Prediction(True, 80, 2000.0, 0.9)),
    ]


def test_correction_is_the_median_measured_over_predicted_ratio():
    corr = correction(study_so_far())
    assert corr.level == pytest.approx(1.25) and corr.tokens_per_s == pytest.approx(1.2)
    assert corr.matched == 2 and corr.trusted
    assert not correction(study_so_far()[:MIN_MATCHED - 1]).trusted
    assert correction([]).tokens_per_s == 1.0


def test_advice_starts_at_the_corrected_predicted_load():
    advice = advise(study_so_far(), C, Prediction(True, 60, 1900.0, 0.9), best=2400.0)
    assert not advice.prune
    assert advice.start_level == pytest.approx(75.0)  # 60 predicted x 1.25 measured/predicted
    assert advice.expected_value == pytest.approx(2280.0)
    assert advice.prediction["correction"]["matched"] == 2


def test_a_config_predicted_far_below_the_best_is_pruned_with_the_evidence():
    best = 2400.0
    low = 0.95 * PRUNE_SHARE * best / 1.2  # corrected: just under PRUNE_SHARE of the best
    advice = advise(study_so_far(), C, Prediction(True, 30, low, 0.5), best=best)
    assert advice.prune and advice.value == pytest.approx(low * 1.2)
    assert "under 80% of the best trial's 2,400" in advice.reason
    kept = advise(study_so_far(), C, Prediction(True, 30, 1.05 * PRUNE_SHARE * best / 1.2, 0.5), best=best)
    assert not kept.prune


def test_nothing_is_pruned_before_predictions_are_trusted():
    advice = advise(study_so_far()[:1], C, Prediction(True, 5, 10.0, 0.5), best=1200.0)
    assert not advice.prune and advice.expected_value is None
    assert advice.start_level == pytest.approx(5 * 1.25)
    infeasible = advise(study_so_far()[:1], C, Prediction(False, 0, 0.0, 9.0, "P95 over"), best=1200.0)
    assert not infeasible.prune
    assert advise(study_so_far(), C, Prediction(False, 0, 0.0, 9.0, "P95 over"), best=1200.0).prune


def test_a_predicted_twin_of_a_weaker_trial_is_not_launched_but_one_of_the_best_is():
    trials = study_so_far()
    same_as_a = ServeConfig(max_num_seqs=64, tensor_parallel_size=1, replicas=2, block_size=32)
    twin = advise(trials, same_as_a, Prediction(True, 40, 1002.0, 0.8), best=2400.0)
    assert twin.prune and twin.twin_of == 0 and twin.value == 1200.0
    assert "block_size" in twin.reason
    same_as_best = ServeConfig(max_num_seqs=128, tensor_parallel_size=1, replicas=2, block_size=32)
    assert not advise(trials, same_as_best, Prediction(True, 80, 2000.0, 0.9), best=2400.0).prune
    assert 2400.0 >= TWIN_SHARE * 2400.0
    other_layout = ServeConfig(max_num_seqs=64, tensor_parallel_size=2, replicas=1)
    assert advise(trials, other_layout, Prediction(True, 40, 1000.0, 0.8), best=2400.0).twin_of is None
    different_load = advise(trials, same_as_a, Prediction(True, 41, 1000.0, 0.8), best=2400.0)
    assert different_load.twin_of is None


def test_goodput_search_from_a_predicted_load_steps_up_and_brackets_the_edge():
    backend = FakeBackend(ttft_per_user=0.01)  # P95 = 1.0225 x 0.01 s x users: 97 users meet 1 s
    config = ServeConfig(max_num_seqs=256, gpu_memory_utilization=0.9)
    ev = evaluate_config(backend, Deployment(), config, small_workload(600), 1.0, start_level=80)
    loads = ev.record.loads
    assert loads[0].level == 80 and loads[0].passed
    assert loads[1].level == 92  # 80 x 1.15
    chosen = max(p.level for p in loads if p.passed)
    assert 90 <= chosen <= 97 and len(loads) <= MAX_REPLAYS
    assert all(p.level > chosen for p in loads if not p.passed)


def test_goodput_search_from_a_predicted_load_too_high_steps_down_gently():
    backend = FakeBackend(ttft_per_user=0.01)
    config = ServeConfig(max_num_seqs=256, gpu_memory_utilization=0.9)
    ev = evaluate_config(backend, Deployment(), config, small_workload(600), 1.0, start_level=110)
    loads = ev.record.loads
    assert loads[0].level == 110 and not loads[0].passed
    assert 85 <= loads[1].level < 110  # not the x0.7 jump used from the top
    assert ev.feasible and 85 <= max(p.level for p in loads if p.passed) <= 97  # edge: P95 = 1.0225 x 0.01 x users


class ByMaxNumSeqs:
    """A predictor that ranks configurations by max-num-seqs (what FakeBackend serves)."""

    def __init__(self) -> None:
        self.asked: list[ServeConfig] = []

    def predict(self, config: ServeConfig) -> Prediction:
        self.asked.append(config)
        # FakeBackend's edge: ~95 users per replica (P95 0.01 s x users / replicas)
        users = min(95.0 * config.replicas, float(config.max_num_seqs * config.replicas))
        return Prediction(True, users, 100.0 * users, 0.9)


def test_search_with_a_predictor_prunes_without_launching(tmp_path):
    storage = f"sqlite:///{tmp_path}/s.db"
    backend = FakeBackend()
    predictor = ByMaxNumSeqs()
    out = run_search(fake_space(), backend=backend, workload=small_workload(600), budget=14, storage=storage,
                     sampler="random", seed=1, predictor=predictor, confirm=0)
    trials = optuna.load_study(study_name=out.name, storage=storage).trials
    pruned = [t for t in trials if t.state == TrialState.PRUNED]
    ran = [t for t in trials if t.state == TrialState.COMPLETE and "repeat_of" not in t.user_attrs
           and "rejected_kind" not in t.user_attrs]
    assert pruned, "max-num-seqs 16 is predicted at a third of the best: some trial must be pruned"
    assert len(backend.started) == len(ran)  # a pruned trial started nothing
    for t in pruned:
        a = t.user_attrs
        assert a["gpu_s"] == 0.0 and a["pruned_reason"] and a["prediction"]["feasible"]
        assert ServeConfig.from_dict(a["config"]) not in backend.started or "twin_of" in a
    for t in ran:
        assert t.user_attrs["prediction"]["level"] > 0
    assert out.best is not None and out.best.state == TrialState.COMPLETE
    assert out.best.user_attrs["config"]["max_num_seqs"] >= 64
    copies = [t for t in trials if "repeat_of" in t.user_attrs]  # a copy takes no budget slot
    assert len(trials) - len(copies) == 14


def test_search_with_the_sim_backend_uses_no_predictor_by_default(tmp_path):
    out = run_search(fake_space(), backend=FakeBackend(), workload=small_workload(), budget=3,
                     storage=f"sqlite:///{tmp_path}/s.db", seed=0)
    assert all("prediction" not in t.user_attrs for t in out.study.trials)


# -- the real simulator as predictor ---------------------------------------------------------
def test_sim_predictor_needs_a_deployment_the_simulator_knows():
    wl = default_workload(seed=0, n=50)
    assert sim_predictor(Deployment(model="qwen2.5-7b", gpu="H100-SXM"), wl, 2.0) is not None
    assert sim_predictor(Deployment(model="qwen2.5-7b", gpu="no-such-gpu"), wl, 2.0) is None


def test_sim_prediction_is_the_edge_of_the_target_on_the_simulator():
    deployment = Deployment(model="qwen2.5-7b", gpu="H100-SXM", gpu_count=1)
    wl = default_workload(seed=0, n=120)
    config = ServeConfig(max_num_seqs=64, gpu_memory_utilization=0.9, max_model_len=8192)
    pred = Predictor(deployment, wl, 1.0).predict(config)
    assert pred is not None and pred.feasible and pred.level >= 1
    with SimBackend().start(deployment, config) as inst:
        at = inst.run(wl, Concurrency(int(pred.level))).summary()
        above = inst.run(wl, Concurrency(int(pred.level) + 1)).summary()
    assert at["ttft_p95_s"] <= 1.0
    assert at["tokens_per_s"] == pytest.approx(pred.tokens_per_s, rel=1e-9)
    if pred.level < 60:  # below the workload's cap, the next user breaks the target
        assert above["ttft_p95_s"] > 1.0


def test_sim_prediction_of_a_config_vllm_refuses_is_left_to_the_precheck():
    deployment = Deployment(model="qwen2.5-7b", gpu="T4", gpu_count=1)
    wl = default_workload(seed=0, n=50)
    assert Predictor(deployment, wl, 2.0).predict(ServeConfig(gpu_memory_utilization=0.3)) is None


WIDER = """\
name: fake
deployment: {model: qwen2.5-7b, gpu: H100-SXM, gpus: 2}
workload: {target_ttft_s: 1s, requests: 60}
parameters:
  gpu_memory_utilization: {choices: [0.8, 0.85, 0.9]}
  max_num_seqs: {choices: [32, 48, 64, 96, 128, 256]}
  block_size: {choices: [16, 32]}
layouts: [tp1x2, tp2x1]
"""


def test_after_a_predicted_twin_the_predictor_proposes_a_neighbour_of_the_best(tmp_path):
    storage = f"sqlite:///{tmp_path}/s.db"
    backend = FakeBackend()
    space = fake_space(WIDER)
    out = run_search(space, backend=backend, workload=small_workload(600), budget=24, storage=storage,
                     sampler="tpe", seed=0, predictor=ByMaxNumSeqs(), confirm=0)
    trials = optuna.load_study(study_name=out.name, storage=storage).trials
    twins = [t for t in trials if t.state == TrialState.PRUNED and "twin_of" in t.user_attrs]
    proposed = [t for t in trials if t.user_attrs.get("proposed_by") == "predictor"]
    assert twins, "gpu-memory-utilization does not change the prediction: TPE must propose twins"
    assert proposed
    for t in proposed:
        earlier = [e for e in trials if e.number < t.number and e.state == TrialState.COMPLETE]
        # one knob (or the layout) away from a trial measured before it
        assert any(sum(e.params.get(k) != v for k, v in t.params.items()) == 1 for e in earlier)
        assert t.state == TrialState.COMPLETE and "twin_of" not in t.user_attrs


class WithSloFigures(ByMaxNumSeqs):
    """ByMaxNumSeqs, with the per-SLO constraints the simulator's goodput search leaves."""

    def predict(self, config: ServeConfig) -> Prediction:
        pred = super().predict(config)
        return Prediction(pred.feasible, pred.level, pred.tokens_per_s, pred.p95_ttft_s,
                          constraints={"p95_ttft_over_target": -0.1, "p95_e2el_over_target": -0.25})


def test_a_pruned_trial_carries_every_slos_constraint(tmp_path):
    from test_search import SPACE

    storage = f"sqlite:///{tmp_path}/s.db"
    space = fake_space(SPACE.replace("requests: 60}", "requests: 60, slos: ['p95:e2el<=1.5s']}"))
    out = run_search(space, backend=FakeBackend(), workload=small_workload(600), budget=14, storage=storage,
                     sampler="random", seed=1, predictor=WithSloFigures(), confirm=0)
    trials = optuna.load_study(study_name=out.name, storage=storage).trials
    pruned = [t for t in trials if t.state == TrialState.PRUNED]
    assert pruned, "max-num-seqs 16 is predicted at a third of the best: some trial must be pruned"
    both = {"p95_ttft_over_target", "p95_e2el_over_target"}
    for t in pruned:
        named = TrialRecord.from_trial(t).constraints
        assert set(named) == both
        # what the sampler and optuna-dashboard read: the values in name order
        assert list(t.constraints.values()) == pytest.approx([named[k] for k in sorted(both)])
        twin = t.user_attrs.get("twin_of")
        if twin is None:  # the prediction's own figures
            assert named["p95_e2el_over_target"] == pytest.approx(-0.25)
        else:  # what the twin measured
            assert named == pytest.approx(trials[twin].user_attrs["constraints"])


def test_a_pruned_trial_whose_prediction_names_no_slo_is_judged_on_p95_ttft_alone():
    from tuner.search.prediction import Advice
    from tuner.search.pruning import pruned_constraints
    from tuner.serving.slo import SloSet

    slos = SloSet.of(["p95:ttft<=1s", "p99:tpot<=30ms"])
    study = optuna.create_study()
    feasible = Advice(prediction=Prediction(True, 40, 1000.0, 0.8).to_dict(), prune=True)
    assert pruned_constraints(study, feasible, slos) == pytest.approx(
        {"p95_ttft_over_target": -0.2, "p99_tpot_over_target": 1.0})  # TPOT not predicted: not known to be met
    infeasible = Advice(prediction=Prediction(False, 0, 0.0, 0.8).to_dict(), prune=True)
    assert pruned_constraints(study, infeasible, slos) == {"p95_ttft_over_target": 1.0, "p99_tpot_over_target": 1.0}


def test_the_sim_predictor_holds_every_slo_of_the_study():
    from tuner.serving.slo import SloSet

    deployment = Deployment(model="qwen2.5-7b", gpu="H100-SXM", gpu_count=1)
    wl = default_workload(seed=0, n=120)
    config = ServeConfig(max_num_seqs=64, gpu_memory_utilization=0.9, max_model_len=8192)
    ttft = Predictor(deployment, wl, 1.0).predict(config)
    tight = Predictor(deployment, wl, SloSet.of(["p95:ttft<=1s", "p95:e2el<=6.5s"])).predict(config)
    assert set(ttft.constraints) == {"p95_ttft_over_target"}
    assert set(tight.constraints) == {"p95_ttft_over_target", "p95_e2el_over_target"}
    # a 6.5 s end-to-end bound breaks near 30 users; P95 TTFT <= 1 s holds to the cap of 60
    assert tight.level < ttft.level
    assert all(c <= 0 for c in tight.constraints.values())
