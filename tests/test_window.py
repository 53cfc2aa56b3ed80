"""--timeout starts a trial only when the study's own trial durations say it fits: a run
that stops for the window throws nothing away, says what is left, and the next run goes on."""
from __future__ import annotations

import datetime as dt

import optuna
import pytest
from fakes import FakeBackend, small_workload
from optuna.trial import TrialState
from test_blame import space

from tuner.search import driver, run_search
from tuner.study.record import RunFacts, TrialRecord


def test_a_trial_that_would_not_fit_is_not_started_and_the_next_run_goes_on(tmp_path, monkeypatch):
    real = driver.trial_estimate
    # the study's trials "took" a day each: after the first, none fits in the hour left
    monkeypatch.setattr(driver, "trial_estimate", lambda st: None if real(st) is None else 86400.0)
    storage = f"sqlite:///{tmp_path}/s.db"
    backend = FakeBackend()
    out = run_search(space(), backend=backend, workload=small_workload(), budget=4, sampler="grid", timeout_s=3600,
                     storage=storage, study="s", confirm=0, precheck=False)
    assert out.timed_out and out.finished == 1 and len(backend.started) == 1
    assert not [t for t in out.study.get_trials() if t.state == TrialState.FAIL]  # nothing started and thrown away
    assert any("3 of the budget's 4 trials are left" in n and "86400 s" in n for n in out.notes), out.notes
    monkeypatch.setattr(driver, "trial_estimate", real)
    again = run_search(space(), backend=backend, workload=small_workload(), budget=4, sampler="grid",
                       timeout_s=3600, storage=storage, study="s", confirm=0, precheck=False)
    assert again.finished == 4 and not again.timed_out
    assert len({(c.max_num_seqs, c.max_model_len) for c in backend.started}) == 4 == len(backend.started)


def _trial(seconds: float, started: bool, repeat_of: int | None = None) -> optuna.trial.FrozenTrial:
    t0 = dt.datetime(2026, 1, 1)
    rec = TrialRecord(run=RunFacts(startup_s=30.0 if started else None), repeat_of=repeat_of)
    return optuna.trial.FrozenTrial(
        number=0, state=TrialState.COMPLETE, value=1.0, values=None, datetime_start=t0,
        datetime_complete=t0 + dt.timedelta(seconds=seconds), params={}, distributions={},
        user_attrs=rec.to_attrs(), system_attrs={}, intermediate_values={}, trial_id=0)


def test_the_estimate_is_the_longest_trial_that_started_a_server():
    study = optuna.create_study()
    assert driver.trial_estimate(study) is None
    for seconds, started, repeat in ((180, True, None), (290, True, None), (5000, False, None), (9000, True, 0)):
        study.add_trial(_trial(seconds, started, repeat))
    assert driver.trial_estimate(study) == pytest.approx(290.0)  # not the pre-check refusal, not a copy


def test_gpu_time_thrown_away_is_recorded_per_trial_and_shown_by_studies_show(tmp_path, capsys, monkeypatch):
    import time

    from test_blame import KilledOnce

    from tuner.cli import main
    from tuner.study import gpu_time

    class Held(KilledOnce):  # a backend whose servers hold GPUs, like vLLM's
        measures_gpu_time = True

        def start(self, deployment, config):
            self.launched_at = time.monotonic()
            return super().start(deployment, config)

    storage = f"sqlite:///{tmp_path}/s.db"
    out = run_search(space(), backend=Held(), workload=small_workload(), budget=4, sampler="grid",
                     storage=storage, study="s", confirm=0, precheck=False, predictor=None)
    g = gpu_time(out.study)
    killed = [t for t in out.study.get_trials() if t.state == TrialState.FAIL]
    assert len(killed) == 1 and g["wasted_trials"] == 1
    assert g["wasted_s"] == pytest.approx(TrialRecord.from_trial(killed[0]).gpu_s) and g["wasted_s"] > 0
    assert g["start_s"] == pytest.approx(4 * 30.0)  # the fake's servers report 30 s starts
    assert g["total_s"] == pytest.approx(g["start_s"] + g["replay_s"] + g["wasted_s"])
    try:
        main(["studies", "show", "s", "--storage", storage])
    except SystemExit as exit_:
        assert not exit_.code
    shown = " ".join(capsys.readouterr().out.split())  # the console wraps long lines
    assert "GPU time:" in shown and "in 1 trials that measured nothing" in shown


def test_a_trace_one_trial_cannot_replay_in_the_window_is_sampled_with_one_line():
    import numpy as np

    from tuner.core.errors import InputError
    from tuner.search.window import fit_to_window
    from tuner.traffic.workload import Workload

    big = Workload(arrival_s=np.arange(100_000) * 0.01, prompt_tokens=np.full(100_000, 300),
                   output_tokens=np.full(100_000, 50))
    asked = []

    def cost():  # 1 ms a request: 100 s a load, 500 s for a trial's five loads
        asked.append(1)
        return 1e-3

    same, note = fit_to_window(big, None, 5, 0, cost)
    assert same is big and note is None and not asked  # no window: nothing to fit, nothing timed
    assert fit_to_window(big, 1000.0, 5, 0, cost) == (big, None)  # 500 s fit in half of 1000 s
    sample, note = fit_to_window(big, 30.0, 5, 7, cost)
    # 0.5 x 30 s / (5 x 1 ms) = 3,000 requests fit: the round count under it
    assert len(sample) == 2000 and "100,000 requests" in note and "2,000 of them" in note and "seed 7" in note
    again, _ = fit_to_window(big, 30.0, 5, 7, cost)
    assert np.array_equal(again.arrival_s, sample.arrival_s)  # the study's seed draws the same sample
    with pytest.raises(InputError) as err:
        fit_to_window(big, 0.5, 5, 0, cost)  # not even 200 requests fit
    assert "--timeout" in str(err.value)


def test_the_pilot_times_the_spaces_smallest_batch_which_the_simulator_takes_longest_over():
    """A batch of 16 needs 16 times the simulator's steps of one of 256 for the same requests:
    the pilot that sizes the sample runs the space's fewest sequences (a CI run once sized
    it on vLLM's default 256, and a trial of 16 took 8 times the estimate, cut by --timeout)."""
    from dataclasses import replace

    from tuner.search.window import costliest
    from tuner.serving.config import ServeConfig
    from tuner.space import SearchSpace
    from tuner.space.param import Param

    def with_seqs(param: Param | None = None, fixed: int | None = None) -> SearchSpace:
        return replace(space(), params=(param,) if param else (), fixed=(("max_num_seqs", fixed),) if fixed else ())

    assert costliest(None) == ServeConfig()
    assert costliest(with_seqs(Param("max_num_seqs", "ordinal", choices=(16, 64, 256)))).max_num_seqs == 16
    assert costliest(with_seqs(Param("max_num_seqs", "int", low=8, high=512, log=True))).max_num_seqs == 8
    assert costliest(with_seqs(fixed=48)).max_num_seqs == 48
    assert costliest(with_seqs()) == ServeConfig()


def test_a_request_no_max_model_len_holds_is_named_with_its_line(tmp_path):
    import numpy as np

    from tuner.core.errors import InputError
    from tuner.search.inputs import check_requests_fit, longest_context
    from tuner.traffic import load_trace, native
    from tuner.traffic.workload import Workload

    prompts = np.full(30, 500)
    prompts[11] = 99_999_999
    native.write(Workload(arrival_s=np.arange(30.0), prompt_tokens=prompts, output_tokens=np.full(30, 64)),
                 tmp_path / "t.jsonl")
    w = load_trace(tmp_path / "t.jsonl")
    sp = space()  # max_model_len choices 2048 and 4096
    assert longest_context(sp) == 4096
    with pytest.raises(InputError) as err:
        check_requests_fit(w, sp)
    text = str(err.value)
    assert text.startswith(f"{tmp_path / 't.jsonl'}:13: request 12 of 30") and "99,999,999" in text
    check_requests_fit(w.take(np.flatnonzero(np.arange(30) != 11)), sp)  # without it, every request fits


def test_a_seed_numpy_cannot_take_is_refused_naming_the_argument_and_the_flag(capsys):
    from tuner.cli import main
    from tuner.core.errors import InputError
    from tuner.search import SearchSettings

    for bad in (-1, 2**32):
        with pytest.raises(InputError) as err:
            SearchSettings(seed=bad)
        assert str(err.value).startswith("seed must be a whole number") and err.value.argument == "seed"
    assert SearchSettings(seed=2**32 - 1).seed == 2**32 - 1
    with pytest.raises(SystemExit) as done:
        main(["search", "--seed", str(2**32)])
    assert done.value.code == 2 and capsys.readouterr().err.startswith("tuner: --seed must be a whole number")
