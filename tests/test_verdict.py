"""Verdicts near the target measured on a second start (issue 49: "a false infeasible is
final"): a configuration whose P95 TTFT sits a few percent under the target draws a slow
start, misses at every load, and was stored with value 0 and never measured again."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from fakes import Analytic, small_workload

from tuner.search import evaluate_config, run_search
from tuner.search.verdict import copy_source, settle, study_ttft_sd
from tuner.serving.config import Deployment, ServeConfig
from tuner.study.noise import PRIOR_DOF, TTFT_PRIOR_SD
from tuner.study.record import TrialRecord

SPACE = """\
name: flat
deployment: {model: qwen2.5-7b, gpu: H100-SXM, gpus: 1}
workload: {target_ttft_s: 1s, requests: 60}
parameters:
  max_num_seqs: {choices: [16, 64]}
layouts: [tp1x1]
"""


class Scripted:
    """A server whose P95 TTFT is flat in load up to ``knee`` users (``p95[max_num_seqs]`` s),
    rising past it, times a factor per START taken in turn from ``factors`` (1.0 once they
    run out): every replay of one start shares it, as a real server's TTFT level does.
    ``speed[max_num_seqs]`` tokens/s per user. Not simulated: its starts vary."""

    name = "scripted"
    restarts = True
    measures_gpu_time = False
    simulated = False
    time_scale = 1.0

    def __init__(self, p95: dict[int, float], speed: dict[int, float], factors: dict[int, list[float]],
                 knee: int = 8) -> None:
        self.p95, self.speed, self.factors, self.knee = p95, speed, {k: list(v) for k, v in factors.items()}, knee
        self.starts: list[tuple[int, float]] = []

    def preflight(self, deployment):
        pass

    def precheck(self, deployment, config):
        return {}

    def start(self, deployment, config):
        seqs = config.max_num_seqs
        left = self.factors.get(seqs) or []
        factor = left.pop(0) if left else 1.0
        self.starts.append((seqs, factor))
        base, knee = self.p95[seqs], self.knee
        inst = Analytic(lambda users: base * factor * (1.0 if users <= knee else 1.0 + 0.3 * (users - knee)))
        speed, run = self.speed[seqs], inst.run

        def scaled(workload, load, *, stop=None):
            result = run(workload, load, stop=stop)
            return dataclasses.replace(result, duration_s=result.duration_s * 100.0 / speed)

        inst.run = scaled  # type: ignore[method-assign]
        return inst


def study(tmp_path, backend, budget: int = 2, confirm: int = 0):
    from tuner.space import parse_space

    space = parse_space(SPACE, path="flat.yaml").bind(Deployment(gpu_count=1), num_heads=28)
    return run_search(space, backend=backend, workload=small_workload(), budget=budget,
                      storage=f"sqlite:///{tmp_path}/s.db", sampler="grid", seed=0, confirm=confirm, predictor=None)


def trial_of(out, seqs: int):
    return [t for t in out.study.trials if t.user_attrs["config"]["max_num_seqs"] == seqs][0]


def test_a_slow_start_near_the_target_is_measured_again_and_the_configuration_kept(tmp_path):
    # max-num-seqs 64 serves 30x more per user; its P95 sits 5 % under the 1 s target at every
    # load up to 8 users. Its first start draws x1.10 (P95 1.045 s: a miss at every load),
    # its second x0.97 (0.92 s: it holds 8 users)
    backend = Scripted({16: 0.3, 64: 0.95}, {16: 100.0, 64: 3000.0}, {64: [1.10, 0.97]})
    out = study(tmp_path, backend)
    best = trial_of(out, 64)
    rec = TrialRecord.from_trial(best)
    assert [f for s, f in backend.starts if s == 64] == [1.10, 0.97]  # two starts, one trial
    assert rec.feasible and best.value == rec.verdict["starts"][1]["value"] >= 3000.0 * 4
    starts = rec.verdict["starts"]
    assert [s["feasible"] for s in starts] == [False, True]
    assert starts[0]["p95_s"] == pytest.approx(0.95 * 1.10) and starts[1]["p95_s"] == pytest.approx(0.95 * 0.97)
    # the sampler is told the verdict with its uncertainty: the two starts' P95s over the target
    (told,) = best.constraints.values()
    assert told == pytest.approx(math.sqrt(0.95 * 1.10 * 0.95 * 0.97) - 1.0) == rec.verdict["constraint"]
    assert out.best.number == best.number
    # a trial that met the target surely (0.3 s against 1 s) made one start
    assert [s for s, _ in backend.starts].count(16) == 1 and TrialRecord.from_trial(trial_of(out, 16)).verdict is None


def test_two_starts_that_miss_within_the_noise_tell_the_sampler_how_near_and_the_verdict_is_not_final(tmp_path):
    backend = Scripted({16: 0.3, 64: 0.95}, {16: 100.0, 64: 3000.0}, {64: [1.10, 1.08, 0.97]})
    out = study(tmp_path, backend)
    miss = trial_of(out, 64)
    rec = TrialRecord.from_trial(miss)
    assert not rec.feasible and rec.verdict["near"] and "on another start: P95 TTFT" in rec.infeasible_reason
    (told,) = miss.constraints.values()
    assert 0 < told == pytest.approx(0.95 * math.sqrt(1.10 * 1.08) - 1.0)  # 4.6 % over, not "1.0: refused"
    # what it served at its lowest load (here one user, the replay stopped once the target was lost): not a 0
    # that teaches the sampler "bad"; its record still says it met nothing (tokens/s 0 at the target)
    held = [s["value"] for s in rec.verdict["starts"]]
    assert miss.value == pytest.approx(math.sqrt(held[0] * held[1])) and min(held) > 0 and rec.tokens_per_s == 0.0
    # a notebook's table still scores it 0: it met nothing
    from tuner.study.analysis import trials_frame

    frame = trials_frame(out.study).frame
    assert frame.loc[frame["number"] == miss.number, "value"].item() == 0.0
    # proposed again, it is measured again (a third start), not copied
    assert copy_source(out.study, miss) is None


def test_a_verdict_far_from_the_target_or_on_starts_that_do_not_vary_is_measured_once():
    far = Scripted({64: 0.95}, {64: 3000.0}, {64: [1.5, 0.97]})       # x1.5: beyond a start's noise
    ev = evaluate_config(far, Deployment(), ServeConfig(max_num_seqs=64), small_workload(), 1.0)
    calls = []

    def again():
        calls.append(1)
        return evaluate_config(far, Deployment(), ServeConfig(max_num_seqs=64), small_workload(), 1.0)

    assert settle(ev, again, 1.0, sd=0.10, starts_vary=True) is ev and not calls
    near = Scripted({64: 0.95}, {64: 3000.0}, {64: [1.10]})
    ev = evaluate_config(near, Deployment(), ServeConfig(max_num_seqs=64), small_workload(), 1.0)
    assert settle(ev, again, 1.0, sd=0.10, starts_vary=False) is ev and not calls  # the simulator: the same run
    assert settle(ev, again, 1.0, sd=0.10, starts_vary=True) is not ev and calls == [1]


def test_a_pass_above_one_user_per_replica_is_sure_and_measured_once(tmp_path):
    # P95 0.95 s flat to 8 users: the edge (8 users) is above the floor, a lower load holds its margin
    backend = Scripted({16: 0.3, 64: 0.95}, {16: 100.0, 64: 3000.0}, {64: [0.99]})
    out = study(tmp_path, backend)
    assert [s for s, _ in backend.starts].count(64) == 1 and TrialRecord.from_trial(trial_of(out, 64)).feasible


def test_the_studys_own_ttft_noise_pools_its_pairs_of_starts_with_the_prior():
    from optuna.trial import create_trial

    def trial(d):
        return create_trial(value=1.0, user_attrs=TrialRecord(verdict={"pair_log_ratio": d}).to_attrs())

    assert study_ttft_sd([], simulated=False) == TTFT_PRIOR_SD
    # one pair 0.2 apart in log: a start's variance is half the pair's, 0.02; with the prior's 2 dof of 0.01
    assert study_ttft_sd([trial(0.2)], simulated=False) == pytest.approx(math.sqrt((PRIOR_DOF * 0.01 + 0.02) / 3))
    quiet = [trial(d) for d in np.full(20, 0.02)]
    assert study_ttft_sd(quiet, simulated=False) < 0.04  # starts that agree narrow the band


def test_a_race_candidate_whose_repeat_misses_within_the_noise_stays_and_wins(tmp_path):
    # issue 49's second way: the best configuration (8 users, 30x the tokens/s of the other) draws one slow
    # repeat (x1.10: a miss at every load, down to one user) among its confirmation's repeats
    backend = Scripted({16: 0.3, 64: 0.9}, {16: 100.0, 64: 3000.0}, {64: [0.95, 1.0, 1.17, 1.0]})
    out = study(tmp_path, backend, confirm=3)
    conf = out.confirmation
    best = trial_of(out, 64).number
    assert conf.held and conf.winner == best and best not in conf.out
    assert conf.measurements[best].count(0.0) == 1
    assert "met the target on 3 of 4 measurements" in conf.reason
