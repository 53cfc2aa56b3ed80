from __future__ import annotations

import optuna
import pytest
from fakes import ErrorBackend, FakeBackend, small_workload
from optuna.trial import TrialState

from tuner.runtime.control import RunControl
from tuner.search import MAX_REPLAYS, evaluate_config, make_sampler, run_search, serve_command, slo_stop_hook
from tuner.serving.config import Deployment, ServeConfig
from tuner.space import parse_space
from tuner.study import best_feasible_trial, closest_miss, trial_config

SPACE = """\
name: fake
deployment: {model: qwen2.5-7b, gpu: H100-SXM, gpus: 2}
workload: {target_ttft_s: 1s, requests: 60}
parameters:
  gpu_memory_utilization: {choices: [0.8, 0.9, 0.95]}
  max_num_seqs: {choices: [16, 64, 256]}
  enforce_eager: false
layouts: [tp1x2, tp2x1]
"""


def fake_space(text: str = SPACE):
    return parse_space(text, path="fake.yaml").bind(Deployment(gpu_count=2), num_heads=28)


def test_stop_hook_fires_once_p95_is_lost():
    stop = slo_stop_hook(1.0, total=100)  # 5 of 100 may exceed the target
    control = RunControl(total=100)
    control.ttft_s += [2.0] * 5 + [0.1] * 50
    assert not stop(control)
    control.ttft_s.append(1.5)
    assert stop(control)


def test_goodput_finds_the_highest_load_meeting_the_target():
    backend = FakeBackend(ttft_per_user=0.01)  # P95 ≈ 0.0105 s x users → ~95 users meet 1 s
    config = ServeConfig(max_num_seqs=256, gpu_memory_utilization=0.9)
    ev = evaluate_config(backend, Deployment(), config, small_workload(600), 1.0)
    assert ev.feasible
    assert len(ev.record.loads) <= MAX_REPLAYS
    passed = [p for p in ev.record.loads if p.passed]
    failed = [p for p in ev.record.loads if not p.passed]
    chosen = max(p.level for p in passed)
    assert all(p.p95_ttft_s <= 1.0 for p in passed)
    assert all(p.level > chosen for p in failed)
    assert 60 <= chosen <= 95  # within the few replays allowed, close to the edge
    assert ev.value == pytest.approx(100.0 * chosen, rel=0.01)
    assert ev.record.summary["ttft_p95_s"] <= 1.0
    assert ev.constraint <= 0
    assert ev.gpu_s == pytest.approx(30.0 + sum(p.duration_s for p in ev.record.loads))
    assert backend.instances[0].closed == 1


def test_open_loop_rate_axis():
    backend = FakeBackend(ttft_per_user=0.01)
    config = ServeConfig(max_num_seqs=256, gpu_memory_utilization=0.9)
    ev = evaluate_config(backend, Deployment(), config, small_workload(600), 1.0, load_kind="rate")
    assert ev.feasible
    assert ev.record.chosen_load.endswith("req/s")


def test_rejected_config_costs_no_launch_and_records_the_reason():
    backend = FakeBackend()
    ev = evaluate_config(backend, Deployment(), ServeConfig(gpu_memory_utilization=0.95), small_workload(), 1.0)
    assert not ev.feasible and ev.constraint > 0 and ev.value == 0.0
    assert backend.started == []
    assert ev.gpu_s == 0.0
    assert ev.record.infeasible_reason.startswith("oom:")
    assert ev.record.rejected_at == "pre-check"


def test_slo_lost_even_at_the_lowest_load_is_infeasible_with_evidence():
    backend = FakeBackend(ttft_per_user=5.0)  # one user already takes 5 s to first token
    ev = evaluate_config(backend, Deployment(), ServeConfig(max_num_seqs=64), small_workload(), 1.0)
    assert not ev.feasible and ev.constraint > 0
    assert "even at 1 users" in ev.record.infeasible_reason
    assert ev.record.lowest_load == "1 users"
    assert any(p.stopped_early for p in ev.record.loads)
    assert len(ev.record.loads) <= MAX_REPLAYS


def test_study_tops_up_to_the_budget_and_resumes(tmp_path):
    storage = f"sqlite:///{tmp_path}/s.db"
    backend = FakeBackend()
    from tuner.study import is_copy

    def copies(out):
        return sum(1 for t in out.study.trials if is_copy(t))

    first = run_search(fake_space(), backend=backend, workload=small_workload(), budget=5, storage=storage, seed=3)
    assert first.finished == 5 and first.new_trials == 5 + copies(first)  # a copy takes no slot
    before = copies(first)
    second = run_search(fake_space(), backend=backend, workload=small_workload(), budget=8, storage=storage, seed=3)
    assert second.name == first.name
    assert second.finished == 8 and second.new_trials == 3 + copies(second) - before
    assert second.copies == copies(second) - before  # what the run says it re-read
    again = run_search(fake_space(), backend=backend, workload=small_workload(), budget=8, storage=storage, seed=3)
    assert again.new_trials == 0
    from tuner.study import summarize
    summary = summarize(again.study, storage)  # tuner studies: feasible counted as the budget counts trials
    assert summary.finished == 8 and summary.feasible <= summary.finished
    study = optuna.load_study(study_name=first.name, storage=storage)
    searched = [t for t in study.trials if not is_copy(t)]
    assert len(searched) == 8 and not any("confirm_of" in t.user_attrs for t in study.trials)
    # the winner's confirmation repeats sit in the companion study, each naming its trial and round
    repeats = optuna.load_study(study_name=first.name + ".confirm", storage=storage).trials
    assert repeats and all(t.user_attrs["confirm_round"] >= 1 for t in repeats)
    assert {t.user_attrs["confirm_of"] for t in repeats} <= {t.number for t in searched}


def test_resuming_anyway_over_other_choices_of_a_knob_is_refused_in_one_line(tmp_path):
    """Optuna keeps one distribution per parameter in a study: new choices of a knob stored
    as its values cannot join it, even with --resume-anyway; one line before any trial runs,
    not Optuna's ValueError from the first trial."""
    from tuner.core.errors import InputError

    storage = f"sqlite:///{tmp_path}/s.db"
    kw = dict(backend=FakeBackend(), workload=small_workload(), storage=storage, study="s", seed=3)
    run_search(fake_space(), budget=3, **kw)
    other = SPACE.replace("[16, 64, 256]", "[16, 64, 128, 256]")
    with pytest.raises(InputError, match="holds max_num_seqs as choices \\[16, 64, 256\\], the space as "
                                         "choices \\[16, 64, 128, 256\\]") as err:
        run_search(fake_space(other), budget=4, resume_anyway=True, **kw)
    assert "\n" not in err.value.message


def test_trials_store_results_and_infeasible_reasons(tmp_path):
    storage = f"sqlite:///{tmp_path}/s.db"
    out = run_search(fake_space(), backend=FakeBackend(), workload=small_workload(), budget=12,
                     storage=storage, sampler="random", seed=0)
    trials = optuna.load_study(study_name=out.name, storage=storage).trials
    assert all(t.state == TrialState.COMPLETE for t in trials)
    rejected = [t for t in trials if t.user_attrs["config"]["gpu_memory_utilization"] == 0.95]
    ran = [t for t in trials if t.user_attrs["config"]["gpu_memory_utilization"] != 0.95]
    assert rejected and ran
    for t in rejected:
        assert t.user_attrs["feasible"] is False and t.value == 0.0
        assert "oom" in t.user_attrs["infeasible_reason"]
    for t in ran:
        attrs = t.user_attrs
        assert {"ttft_p50_s", "ttft_p95_s", "ttft_p99_s", "tpot_p95_s", "e2e_p99_s", "error_rate"} <= set(attrs["summary"])  # noqa: E501
        assert attrs["loads"] and attrs["server"] == {"num_preemptions": 0}
        run = attrs["run"]
        assert run["backend"] == "fake" and run["vllm_version"] == "0.0-fake"
        assert run["workload_fingerprint"] == small_workload().fingerprint()
        assert run["hardware"]["gpu_count"] == 2 and run["seed"] == 0 and run["sampler"] == "random"
        assert run["log_paths"] == ["/tmp/fake.log"]
        assert attrs["gpu_s"] > 30.0 or attrs["repeat_of"] < t.number  # a repeat costs nothing
        assert trial_config(t) == fake_space().config_from_params(t.params)
    best = best_feasible_trial(out.study)
    assert best is not None and best.value == max(t.value for t in trials)
    assert out.best.number == best.number


def test_a_crashing_trial_fails_alone(tmp_path):
    text = SPACE.replace("enforce_eager: false", "enforce_eager: {choices: [false, true]}")
    out = run_search(fake_space(text), backend=FakeBackend(), workload=small_workload(), budget=10,
                     storage=f"sqlite:///{tmp_path}/s.db", sampler="random", seed=1)
    states = [t.state for t in out.study.trials]
    assert out.finished == 10 and TrialState.FAIL in states and TrialState.COMPLETE in states
    failed = [t for t in out.study.trials if t.state == TrialState.FAIL]
    assert all("fake server died" in t.user_attrs["error"] for t in failed)


def test_no_feasible_config_names_the_closest_miss(tmp_path):
    out = run_search(fake_space(), backend=FakeBackend(ttft_per_user=3.0), workload=small_workload(), budget=4,
                     storage=f"sqlite:///{tmp_path}/s.db", sampler="random", seed=0)
    assert out.best is None
    miss = closest_miss(out.study)
    assert miss is not None and miss.user_attrs["p95_ttft_at_lowest_load_s"] > 1.0


def test_grid_sampler_covers_the_discretised_space(tmp_path):
    space = fake_space()
    out = run_search(space, backend=FakeBackend(), workload=small_workload(), budget=100,
                     storage=f"sqlite:///{tmp_path}/s.db", sampler="grid")
    assert out.finished == 3 * 3 * 2  # the grid ends the study when exhausted
    assert {tuple(sorted(t.params.items())) for t in out.study.trials} == {
        tuple(sorted(p.items())) for p in _product(space.grid())
    }


def _product(grid):
    import itertools

    keys = sorted(grid)
    return [dict(zip(keys, values)) for values in itertools.product(*(grid[k] for k in keys))]


def test_enqueued_configs_run_first(tmp_path):
    space = fake_space()
    first = ServeConfig(gpu_memory_utilization=0.8, max_num_seqs=256, tensor_parallel_size=2, replicas=1)
    out = run_search(space, backend=FakeBackend(), workload=small_workload(), budget=3,
                     storage=f"sqlite:///{tmp_path}/s.db", enqueue=[first])
    assert trial_config(out.study.trials[0]) == first


def test_unknown_sampler_is_bad_input():
    with pytest.raises(Exception, match="unknown sampler"):
        make_sampler("annealing", seed=0)


def test_serve_command_is_copyable():
    cmd = serve_command(Deployment(model="qwen2.5-7b", dtype="float16"),
                        ServeConfig(max_num_seqs=128, tensor_parallel_size=2, replicas=4, enable_prefix_caching=False))
    assert cmd.startswith("vllm serve Qwen/Qwen2.5-7B-Instruct ")
    assert "--max-num-seqs 128" in cmd and "--tensor-parallel-size 2" in cmd
    assert "--data-parallel-size 4" in cmd and "--no-enable-prefix-caching" in cmd
    assert "--host" not in cmd
    # a local model folder stays as given
    assert serve_command(Deployment(model="/models/my-7b"), ServeConfig()).startswith("vllm serve /models/my-7b")


def test_a_repeated_config_reuses_the_earlier_result(tmp_path):
    from tuner.study import FREE_COPIES, copy_slots, count_finished

    space = fake_space(SPACE.replace("{choices: [16, 64, 256]}", "64").replace("{choices: [0.8, 0.9, 0.95]}", "0.9"))
    backend = FakeBackend()
    out = run_search(space, backend=backend, workload=small_workload(), budget=6,
                     storage=f"sqlite:///{tmp_path}/s.db", sampler="random", seed=0, confirm=0)
    trials = out.study.trials
    assert len(backend.started) == 2  # two layouts, each launched once
    repeats = [t for t in trials if "repeat_of" in t.user_attrs]
    # copies take no budget slot up to FREE_COPIES, then one each: the loop still ends
    assert len(repeats) == FREE_COPIES + 4 and len(trials) == 2 + len(repeats)
    assert count_finished(out.study) == 6 and copy_slots(out.study) == 4
    for t in repeats:
        first = trials[t.user_attrs["repeat_of"]]
        assert t.value == first.value and t.user_attrs["config"] == first.user_attrs["config"]
        assert t.user_attrs["gpu_s"] == 0.0


def test_warm_start_enqueues_the_simulator_best_first(tmp_path):
    from tuner.search import warm_start_configs

    storage = f"sqlite:///{tmp_path}/s.db"
    space = fake_space()
    warm = warm_start_configs(space, small_workload(), k=2, budget=4, storage=storage)
    assert 1 <= len(warm) <= 2
    out = run_search(space, backend=FakeBackend(), workload=small_workload(), budget=3, storage=storage, enqueue=warm)
    assert out.name.endswith(".fake")  # the real study is not the simulator's
    assert [trial_config(t) for t in out.study.trials[: len(warm)]] == warm
    assert all(t.user_attrs.get("warm_start") for t in out.study.trials[: len(warm)])


def test_gp_sampler_or_a_clear_message():
    from tuner.core.errors import InputError

    try:
        sampler = make_sampler("gp", seed=0)
    except InputError as err:  # GPSampler needs PyTorch
        assert "torch" in str(err)
    else:
        assert isinstance(sampler, optuna.samplers.GPSampler)


def test_a_new_tpe_study_starts_from_vllm_defaults_at_each_layout(tmp_path):
    out = run_search(fake_space(), backend=FakeBackend(), workload=small_workload(), budget=3,
                     storage=f"sqlite:///{tmp_path}/s.db", seed=0)
    first = out.study.trials[:2]
    assert all(t.user_attrs.get("vllm_defaults") for t in first)
    assert {t.params["layout"] for t in first} == {"tp1x2", "tp2x1"}
    # vLLM's default utilization (0.92 in the 0.26 line) snapped to the nearest choice
    assert all(trial_config(t).gpu_memory_utilization == 0.9 for t in first)
    assert not out.study.trials[2].user_attrs.get("vllm_defaults")


def test_refining_stops_when_the_incumbent_cannot_be_beaten():
    config = ServeConfig(max_num_seqs=256, gpu_memory_utilization=0.9)
    free = evaluate_config(FakeBackend(0.005), Deployment(), config, small_workload(600), 1.0)
    bounded = evaluate_config(FakeBackend(0.005), Deployment(), config, small_workload(600), 1.0, incumbent=1e9)
    assert len(bounded.record.loads) == 2 < len(free.record.loads)  # top load fails, next passes, stop
    assert bounded.feasible and bounded.value <= free.value
    weak = evaluate_config(FakeBackend(0.005), Deployment(), config, small_workload(600), 1.0, incumbent=1.0)
    assert weak.record.loads == free.record.loads  # an incumbent it can beat changes nothing


def test_vllm_defaults_run_first_and_are_moved_one_knob_when_snapping_makes_them_refuse():
    from tuner.search import default_trials, num_heads
    from tuner.sim.memory import plan_memory
    from tuner.space import load_space

    # vLLM 0.6.3 on V100 (no chunked prefill) defaults max-num-batched-tokens to max-model-len
    # (8192), but the article-000 space stops at 4096: the snapped defaults would be refused
    # ("max_num_batched_tokens (4096) is smaller than max_model_len (8192)").
    space = load_space("article-000-v100-16gb")
    space = space.bind(space.deployment, num_heads(space.deployment))
    (params,) = default_trials(space)
    config = space.config_from_params(params)
    plan_memory(space.deployment, config)  # starts: raises ConfigRejected otherwise
    assert config.enforce_eager is False  # vLLM's default, which the study must see working
    assert config.max_num_batched_tokens == 4096 and config.max_model_len == 4096  # only max-model-len moved
    # a space whose snapped defaults start keeps vLLM's values (H100, vLLM 0.26: 32k context)
    default = load_space("default")
    default = default.bind(default.deployment, num_heads(default.deployment))
    for p in default_trials(default):
        c = default.config_from_params(p)
        plan_memory(default.deployment, c)
        assert (c.gpu_memory_utilization, c.max_model_len, c.enforce_eager) == (0.9, 32768, False)


def test_a_replay_stops_once_more_than_one_percent_of_its_requests_failed():
    from tuner.search import error_stop_hook

    stop = error_stop_hook(total=200)  # 2 of 200 may fail
    control = RunControl(total=200, finished=52, ttft_s=[0.1] * 50)
    assert not stop(control)
    control.finished += 1
    assert stop(control)


def test_errors_fail_every_load_and_the_reason_names_them_not_a_latency():
    w = small_workload(200)
    ev = evaluate_config(ErrorBackend("http_429"), Deployment(), ServeConfig(max_num_seqs=64), w, 1.0)
    assert not ev.feasible and ev.value == 0.0 and ev.constraint >= 1.0
    reason = ev.record.infeasible_reason
    assert reason.startswith("the first 3 requests answered failed at ") and "http_429 x3" in reason
    assert "rate limit reached" in reason and "so the replay stopped" in reason
    assert "P95 TTFT" not in reason and "nan" not in reason
    assert ev.record.failed_by == "errors" and set(ev.record.errors) == {"http_429"}
    assert ev.record.error_detail == {"http_429": "rate limit reached"}
    # the replay stopped at the third failure (2 of 200 allowed), not after 200
    assert all(p.errors == {"http_429": 3} and p.stopped_early and not p.passed for p in ev.record.loads)
    assert ev.record.summary["errors_http_429"] == 3


def test_errors_under_the_limit_are_kept_on_a_feasible_trial():
    w = small_workload(200)  # one request in 200 fails: 0.5%, under the 1% allowed
    ev = evaluate_config(ErrorBackend("timeout", every=200), Deployment(), ServeConfig(max_num_seqs=64), w, 1.0)
    assert ev.feasible and ev.record.errors == {"timeout": 1}
    assert all(p.errors == {"timeout": 1} for p in ev.record.loads)
    # two in 100 fail: 2%, over it
    ev = evaluate_config(ErrorBackend("short_output", every=50), Deployment(), ServeConfig(max_num_seqs=64), w, 1.0)
    assert not ev.feasible and ev.record.infeasible_reason.startswith("3 of the first 101 requests answered failed")
    ev = evaluate_config(ErrorBackend("short_output", every=50), Deployment(), ServeConfig(max_num_seqs=64), w, 1.0,
                         early_stop=False)  # every request answered
    assert ev.record.infeasible_reason.startswith("4 of 200 requests failed at ")
    assert ev.record.infeasible_reason.endswith("short_output x4 (first short_output: 'rate limit reached'); "
                                                  "at most 1% may fail")


def test_a_study_that_errors_failed_explains_itself_by_its_errors(tmp_path):
    from tuner.study import error_totals, miss_explanation

    out = run_search(fake_space(), backend=ErrorBackend("http_500"), workload=small_workload(100), budget=3,
                     storage=f"sqlite:///{tmp_path}/s.db", sampler="random", seed=1)
    assert out.best is None
    miss = closest_miss(out.study)
    text = miss_explanation(miss)
    assert "requests answered failed at" in text and "http_500 x2" in text and "came closest" not in text
    ran = [t for t in out.study.trials if t.user_attrs.get("loads") and "repeat_of" not in t.user_attrs]
    assert ran and error_totals(out.study) == {"http_500": sum(
        p["errors"]["http_500"] for t in ran for p in t.user_attrs["loads"])}
    assert all(t.user_attrs["errors"] == {"http_500": 2} for t in ran)  # 1 of 100 allowed: stopped at 2


def test_a_latency_miss_is_still_closer_than_an_error_miss(tmp_path):
    import optuna as _optuna

    st = _optuna.create_study(storage=f"sqlite:///{tmp_path}/m.db", study_name="m")
    for attrs in ({"failed_by": "errors", "p95_ttft_at_lowest_load_s": 0.01, "infeasible_reason": "24 of 24 ..."},
                  {"failed_by": "latency", "p95_ttft_at_lowest_load_s": 3.0, "target_ttft_s": 1.0}):
        t = st.ask()
        for k, v in attrs.items():
            t.set_user_attr(k, v)
        t.set_user_attr("feasible", False)
        st.tell(t, 0.0)
    assert closest_miss(st).number == 1



def test_a_queued_retry_finishing_with_one_grid_point_left_does_not_crash_the_grid_study():
    """The rerun after Ctrl-C queues the stopped trial's configuration again; with the grid
    sampler it carries no grid_id, and Optuna's after_trial raised KeyError on it when one
    point was left (the rerun exited 1: tests/faults stop_signal, seen under load). Optuna 4.x
    and 5.0 raise it; pyproject admits them."""
    import optuna

    from tuner.search.samplers import _grid

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    cls = _grid(optuna.samplers.GridSampler)
    study = optuna.create_study(sampler=cls({"x": [1, 2, 3]}, seed=0), direction="maximize")
    objective = lambda t: float(t.suggest_categorical("x", [1, 2, 3]))  # noqa: E731
    study.optimize(objective, n_trials=2)  # two grid points measured, one left
    left = ({1, 2, 3} - {t.params["x"] for t in study.trials}).pop()
    study.enqueue_trial({"x": 3 if left != 3 else 1})  # the retry of a measured point
    study.optimize(objective, n_trials=1)
    study.optimize(objective, n_trials=1)  # the last point is still proposed and measured
    assert {t.params["x"] for t in study.trials} == {1, 2, 3}
