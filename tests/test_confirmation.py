"""Signal, not noise: the noise floor, the race among the best, ties and headroom, common
random numbers across trials, the edge located by a monotone fit, and the edge above
max-num-seqs x replicas."""
from __future__ import annotations

import math

import numpy as np
import optuna
import pytest
from fakes import FakeBackend, NoisyBackend, small_workload
from optuna.trial import TrialState
from test_search import SPACE, fake_space

from tuner.search import evaluate_config, monotone_crossing, run_search
from tuner.search.goodput import MAX_REPLAYS
from tuner.serving.config import Deployment, ServeConfig
from tuner.study import best_feasible_trial, confirmation, confirmation_study, count_finished
from tuner.study import repeats as repeats_of
from tuner.study.race import (
    EQUIVALENT,
    Candidate,
    NoiseFloor,
    candidates,
    decide,
    headroom_tie,
    noise_floor,
    paired_noise,
    race,
    undecided,
)
from tuner.study.record import TrialRecord
from tuner.traffic.workload import Workload


def cfg(gmu: float = 0.9, seqs: int = 64, eager: bool = False) -> dict:
    return {"gpu_memory_utilization": gmu, "max_num_seqs": seqs, "enforce_eager": eager}


# -- the noise floor ------------------------------------------------------------------------
def test_noise_floor_pools_log_deviations_and_leans_on_the_prior_until_repeats_exist():
    assert noise_floor([], False) == NoiseFloor(0.02, 0, "prior")
    assert noise_floor([[500.0]], True).rel_sd == 0.01  # a single measurement is no repeat
    # one repeat of 100 vs 110: deviations +-ln(1.1)/2, ss = ln(1.1)^2 / 2 on 1 dof, shrunk
    # toward the 2 % prior with 2 dof: sqrt((2 x 0.02^2 + ss) / 3)
    floor = noise_floor([[100.0, 110.0]], False)
    assert floor.source == "repeats" and floor.dof == 1
    assert floor.rel_sd == pytest.approx(math.sqrt((2 * 0.02**2 + math.log(1.1) ** 2 / 2) / 3), rel=1e-9)
    # a repeat that failed (0) is no deviation around a value
    assert noise_floor([[100.0, 0.0]], False).source == "prior"
    # tight repeats pull the floor under the prior
    assert noise_floor([[1000.0, 1001.0, 999.0]] * 5, False).rel_sd < 0.01


def test_band_is_z_sd_root_two_for_single_measurements_and_shrinks_with_repeats():
    floor = NoiseFloor(0.02)
    assert floor.band() == pytest.approx(2 * 0.02 * math.sqrt(2))
    assert floor.band(4, 4) == pytest.approx(floor.band() / 2)


def test_paired_noise_cancels_what_a_sample_does_to_every_configuration():
    # sample 2 is twice as fast for both: raw repeats look 50 % noisy, paired ones are exact
    rows = [[100.0, 200.0], [110.0, 220.0]]
    assert noise_floor(rows, False).rel_sd > 0.3
    paired = paired_noise(rows, False)
    assert paired.source == "paired repeats" and paired.dof == 1
    assert paired.rel_sd == pytest.approx(0.02 * math.sqrt(2 / 3))  # nothing left but the prior
    # a disagreement between the two: residuals of +-d/4 in each of the four cells
    d = math.log(1.1)
    shaken = paired_noise([[100.0, 200.0], [110.0, 200.0]], False)
    assert shaken.rel_sd == pytest.approx(math.sqrt((2 * 0.02**2 + 4 * (d / 4) ** 2) / 3))
    # one configuration, or one sample: nothing to pair
    assert paired_noise([[100.0, 200.0]], False) == noise_floor([[100.0, 200.0]], False)


# -- candidates and the decision ------------------------------------------------------------
def test_candidates_are_the_best_and_those_within_its_noise_band():
    noise = NoiseFloor(0.02)  # band of two single measurements: 5.66 %
    pool = [Candidate(1, cfg(), [1000.0]), Candidate(2, cfg(), [960.0]), Candidate(3, cfg(), [930.0]),
            Candidate(4, cfg(), [0.0])]
    assert [c.number for c in candidates(pool, noise)] == [1, 2]
    assert [c.number for c in candidates(pool, NoiseFloor(0.04))] == [1, 2, 3]
    assert [c.number for c in candidates(pool, NoiseFloor(0.04), limit=2)] == [1, 2]


def test_an_equivalent_tie_goes_to_the_configuration_with_headroom_and_says_why():
    noise = NoiseFloor(0.01)
    lead = Candidate(7, cfg(gmu=0.95, seqs=256), [1000.0, 1004.0, 996.0])
    spare = Candidate(9, cfg(gmu=0.85, seqs=256), [996.0, 998.0, 994.0])   # 0.4 % under: equivalent
    conf = decide([lead, spare], noise, rounds=2)
    assert conf.leader == 7 and conf.winner == 9 and conf.ties == [7] and conf.equivalent == [7]
    assert conf.band == (994.0, 998.0) and conf.mean == pytest.approx(996.0)
    assert "preferred for headroom: gpu-memory-utilization 0.85 vs 0.95" in conf.reason


def test_a_statistical_tie_beyond_one_percent_is_listed_but_not_recommended():
    noise = NoiseFloor(0.03)  # band of two means of 3: 4.9 %
    lead = Candidate(1, cfg(gmu=0.95), [1000.0, 1000.0, 1000.0])
    close = Candidate(2, cfg(gmu=0.80), [975.0, 975.0, 975.0])  # 2.5 % under: tied, not equivalent
    far = Candidate(3, cfg(gmu=0.80), [900.0, 900.0, 900.0])    # 10 % under: out
    conf = decide([lead, close, far], noise)
    assert conf.winner == 1 and conf.ties == [2] and conf.equivalent == []
    assert 3 in conf.out and "beyond the noise band" in conf.out[3]
    assert 0.025 > EQUIVALENT
    # the reason says what the race could tell: 2 x 3 % x sqrt(1/3 + 1/3) = 4.9 %
    assert "(noise sd 3.0%; 3 measurements each tell gaps over 4.9%)" in conf.reason
    # fewer measurements of the tie (ruled out of nothing, measured less): the band widens to
    # 2 x 3 % x sqrt(1/3 + 1/2) = 5.5 %
    conf = decide([lead, Candidate(2, cfg(gmu=0.80), [975.0, 975.0])], noise)
    assert "2-3 measurements each tell gaps over 5.5%" in conf.reason


def test_fewer_sequences_then_cuda_graphs_break_a_tie_at_equal_memory():
    noise = NoiseFloor(0.01)
    eager = Candidate(1, cfg(eager=True, seqs=64), [1000.0, 1000.0])
    more = Candidate(2, cfg(eager=False, seqs=128), [999.0, 999.0])
    graphs = Candidate(3, cfg(eager=False, seqs=64), [998.0, 998.0])
    assert decide([eager, more], noise).winner == 1        # fewer max-num-seqs first
    assert decide([eager, more, graphs], noise).winner == 3  # then CUDA graphs over eager
    assert "CUDA graphs instead of eager" in decide([eager, graphs], noise).reason


def test_fewer_api_servers_break_a_tie_last_and_a_real_gain_keeps_them():
    # four API server processes that measure the same as one (a workload the front end never
    # caps) cost three CPU cores for nothing; where they measured more, they stay
    noise = NoiseFloor(0.01)
    four = Candidate(1, {**cfg(seqs=64), "api_server_count": 4}, [1000.0, 1000.0])
    one = Candidate(2, cfg(seqs=64), [999.0, 999.0])
    conf = decide([four, one], noise)
    assert conf.leader == 1 and conf.winner == 2 and "1 API server process instead of 4 (CPU cores left to the host)" in conf.reason  # noqa: E501
    # the headroom knobs come first: fewer max-num-seqs wins over fewer API servers
    fewer_seqs = Candidate(3, {**cfg(seqs=32), "api_server_count": 4}, [998.0, 998.0])
    assert decide([four, one, fewer_seqs], noise).winner == 3
    faster = Candidate(4, {**cfg(seqs=64), "api_server_count": 4}, [1200.0, 1200.0])
    assert decide([faster, one], noise).winner == 4


def test_a_tie_that_differs_in_a_speed_knob_or_whose_cap_bound_is_not_traded_for_headroom():
    noise = NoiseFloor(0.01)
    lead = Candidate(7, {**cfg(gmu=0.95), "kv_cache_dtype": "fp8"}, [1000.0, 1004.0, 996.0])
    other_dtype = Candidate(9, {**cfg(gmu=0.85), "kv_cache_dtype": "auto"}, [996.0, 998.0, 994.0])
    conf = decide([lead, other_dtype], noise, rounds=2)
    assert conf.winner == 7 and conf.ties == [9] and conf.equivalent == []  # tied, but not by design
    assert not headroom_tie(other_dtype, lead)
    # fewer max-num-seqs is headroom only where that cap never held the edge
    spare = Candidate(3, cfg(gmu=0.95, seqs=32), [996.0, 998.0, 994.0])
    assert decide([Candidate(7, cfg(gmu=0.95), lead.values), spare], noise).winner == 3
    bound = Candidate(3, cfg(gmu=0.95, seqs=32), spare.values, capped=True)
    conf = decide([Candidate(7, cfg(gmu=0.95), lead.values), bound], noise)
    assert conf.winner == 7 and conf.ties == [3]
    # more max-num-seqs, or lower memory, is judged as before even for a capped tie
    assert headroom_tie(Candidate(4, cfg(gmu=0.85), [1.0], capped=True), Candidate(7, cfg(gmu=0.95), [1.0]))


def test_a_candidate_ruled_out_in_the_race_cannot_lead_on_its_fewer_samples():
    # out after round 1 (on an easy sample); the one still in then met a hard sample
    still_in = Candidate(1, cfg(), [1000.0, 1040.0, 800.0])   # mean 947
    ruled_out = Candidate(2, cfg(gmu=0.8), [990.0, 960.0])    # mean 975, on the first two samples
    conf = decide([still_in, ruled_out], NoiseFloor(0.02), rounds=2, out={2: "under trial 1's mean"})
    assert conf.leader == 1 and conf.winner == 1 and 2 in conf.out


def test_the_race_drops_a_rival_the_repeats_put_below_the_band_and_keeps_the_true_tie():
    truth = {1: 1000.0, 2: 1000.0, 3: 940.0}
    wobble = {1: (1.01, 0.99, 1.0, 1.0), 2: (0.99, 1.01, 1.0, 1.0), 3: (1.03, 0.99, 1.0, 1.0)}
    entrants = [Candidate(n, cfg(gmu=0.9 if n == 1 else 0.8), [truth[n] * wobble[n][0]]) for n in (1, 2, 3)]
    calls = []

    def measure(c, r):
        calls.append((c.number, r))
        return truth[c.number] * wobble[c.number][r]

    conf = race(entrants, measure, NoiseFloor(0.02), rounds=3)
    assert 3 in conf.out and "under trial 1's mean after 1 repeat" in conf.out[3]  # (969 + 931) / 2 vs 1000
    assert {conf.winner, *conf.ties} == {1, 2}
    assert conf.winner == 2  # equivalent within 1 %, lower gpu-memory-utilization
    # paired rounds: everyone still in is measured in round r before round r + 1 starts
    rounds = [r for _, r in calls]
    assert rounds == sorted(rounds)
    assert (3, 2) not in calls and (3, 3) not in calls  # out: not measured again


def test_a_tie_in_a_speed_knob_is_raced_past_the_set_rounds_until_the_repeats_tell_it():
    # 3.5 % apart in truth, 2 % noise per start: three measurements each leave them tied
    truth = {1: 1000.0, 2: 965.0}
    wobble = {1: (0.98, 1.01, 0.99, 1.0, 1.01, 0.99), 2: (1.02, 0.99, 1.01, 1.0, 0.99, 1.01)}
    calls = []

    def measure(c, r):
        calls.append((c.number, r))
        return truth[c.number] * wobble[c.number][r]

    def entrants(other: dict) -> list[Candidate]:
        return [Candidate(1, {**cfg(), "kv_cache_dtype": "fp8"}, [truth[1] * wobble[1][0]]),
                Candidate(2, other, [truth[2] * wobble[2][0]])]

    assert undecided(entrants({**cfg(), "kv_cache_dtype": "auto"}))
    assert not undecided(entrants({**cfg(gmu=0.8), "kv_cache_dtype": "fp8"}))  # headroom only
    # with the set rounds only, trial 2 is still tied with the leader
    two = race(entrants({**cfg(), "kv_cache_dtype": "auto"}), measure, NoiseFloor(0.02), rounds=2)
    assert two.rounds == 2 and two.ties == [2] and 2 not in two.out
    calls.clear()
    conf = race(entrants({**cfg(), "kv_cache_dtype": "auto"}), measure, NoiseFloor(0.02), rounds=2, max_rounds=5)
    assert conf.winner == 1 and 2 in conf.out and conf.ties == []
    assert 2 < conf.rounds <= 5 and max(r for _, r in calls) == conf.rounds
    # a tie in headroom knobs only is decided by the headroom rule after the set rounds
    calls.clear()
    conf = race(entrants({**cfg(gmu=0.8), "kv_cache_dtype": "fp8"}), measure, NoiseFloor(0.02), rounds=2,
                max_rounds=5)
    assert conf.rounds == 2 and max(r for _, r in calls) == 2
    # a speed-knob tie whose band is under 1 % stops too: more repeats could only tell a gap
    # no recommendation turns on. The simulator's prior sd is 1 %; paired with near-equal
    # residuals the sd after 3 rounds is 1 % x sqrt(2/5) = 0.63 %, band 2 x 0.63 % x sqrt(2/4)
    # = 0.9 % (after 2 rounds: 0.71 %, band 1.15 %, so it goes on once)
    calls.clear()
    calm = {1: (1.001, 0.999, 1.0, 1.001, 0.999, 1.0), 2: (0.999, 1.001, 1.0, 0.999, 1.001, 1.0)}
    conf = race([Candidate(1, {**cfg(), "kv_cache_dtype": "fp8"}, [1000.0 * calm[1][0]]),
                 Candidate(2, {**cfg(), "kv_cache_dtype": "auto"}, [997.0 * calm[2][0]])],
                lambda c, r: calls.append(r) or (1000.0 if c.number == 1 else 997.0) * calm[c.number][r],
                NoiseFloor(0.01), rounds=2, max_rounds=5, simulated=True)
    assert conf.rounds == 3 and max(calls) == 3 and conf.ties == [2]


def test_a_candidate_that_fails_a_repeat_is_out_and_an_interrupt_decides_nothing():
    entrants = [Candidate(1, cfg(), [1000.0]), Candidate(2, cfg(gmu=0.8), [998.0])]
    conf = race(entrants, lambda c, r: 0.0 if c.number == 2 else 1000.0, NoiseFloor(0.02), rounds=2)
    assert conf.winner == 1 and "failed the target" in conf.out[2]

    def interrupted(c, r):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        race(entrants, interrupted, NoiseFloor(0.02), rounds=2)


def test_a_lone_candidate_is_measured_every_round_for_its_band():
    conf = race([Candidate(5, cfg(), [1000.0])], lambda c, r: 1000.0 + 10 * r, NoiseFloor(0.02), rounds=3)
    assert conf.winner == 5 and conf.measurements[5] == [1000.0, 1010.0, 1020.0, 1030.0]
    assert conf.band == (1000.0, 1030.0) and conf.rounds == 3


def test_every_trial_replays_the_same_sample_and_the_winner_is_confirmed_on_new_ones(tmp_path):
    storage = f"sqlite:///{tmp_path}/s.db"
    space = fake_space(SPACE.replace("requests: 60}", "requests: 60, load: rate}"))
    backend = NoisyBackend(sd=0.02)
    out = run_search(space, backend=backend, workload=small_workload(), budget=8, storage=storage,
                     sampler="random", seed=5, confirm=2)
    study = out.study
    searched = study.trials  # the study's trials are its configurations; the repeats are the companion's
    repeats = confirmation_study(study).trials
    assert not any("confirm_of" in t.user_attrs for t in searched)
    # common random numbers: every searched trial at seed 5, the repeats at 6 and 7
    assert {t.user_attrs["run"]["load_seed"] for t in searched if "run" in t.user_attrs} == {5}
    assert {t.user_attrs["run"]["load_seed"] for t in repeats} <= {6, 7} and repeats
    assert count_finished(study) == 8  # repeats are outside the budget
    conf = confirmation(study)
    assert conf is not None and out.confirmation is not None and conf.winner == out.best.number
    assert best_feasible_trial(study).number == conf.winner
    assert len(conf.measurements[conf.winner]) >= 2 and conf.band[0] <= conf.mean <= conf.band[1]
    # the repeats are stored trials of the candidates' configurations, feasible or not
    for t in repeats:
        first = study.trials[t.user_attrs["confirm_of"]]
        assert t.params == first.params and t.user_attrs["config"] == first.user_attrs["config"]
    # resuming measures nothing new: the confirmation covers the trials the study holds
    starts = len(backend.started)
    again = run_search(space, backend=backend, workload=small_workload(), budget=8, storage=storage,
                       sampler="random", seed=5, confirm=2)
    assert len(backend.started) == starts and again.best.number == conf.winner


def test_an_interrupted_confirmation_keeps_its_repeats_and_the_next_run_reuses_them(tmp_path):
    storage = f"sqlite:///{tmp_path}/s.db"

    class Stops(NoisyBackend):
        left = 10**9

        def start(self, deployment, config):
            if len(self.started) >= self.left:
                raise KeyboardInterrupt
            return super().start(deployment, config)

    backend = Stops(sd=0.02)
    first = run_search(fake_space(), backend=backend, workload=small_workload(), budget=6, storage=storage,
                       sampler="random", seed=1, confirm=0)
    assert first.confirmation is None
    backend.left = len(backend.started) + 1  # one repeat, then a stop signal
    with pytest.raises(KeyboardInterrupt):
        run_search(fake_space(), backend=backend, workload=small_workload(), budget=6, storage=storage,
                   sampler="random", seed=1, confirm=2)
    study = optuna.load_study(study_name=first.name, storage=storage)
    kept = repeats_of(study, storage)
    assert not any("confirm_of" in t.user_attrs for t in study.trials)
    assert len(kept) == 1 and kept[0].state == TrialState.COMPLETE and confirmation(study) is None
    backend.left = 10**9
    done = run_search(fake_space(), backend=backend, workload=small_workload(), budget=6, storage=storage,
                      sampler="random", seed=1, confirm=2)
    study = optuna.load_study(study_name=first.name, storage=storage)
    rounds = [(t.user_attrs["confirm_of"], t.user_attrs["confirm_round"]) for t in repeats_of(study, storage)]
    assert len(rounds) == len(set(rounds))  # the kept repeat was reused, not measured again
    assert done.confirmation is not None and done.new_trials == 0


def test_reordered_keeps_the_requests_turn_order_and_arrival_times():
    n = 12
    wl = Workload(arrival_s=np.arange(n) * 0.5, prompt_tokens=np.arange(100, 100 + n),
                  output_tokens=np.arange(10, 10 + n), session=[f"s{i % 4}" for i in range(n)],
                  turn=np.array([i // 4 for i in range(n)]), source="t")
    a, b = wl.reordered(1), wl.reordered(2)
    assert np.array_equal(a.arrival_s, wl.arrival_s)
    assert sorted(a.prompt_tokens) == sorted(wl.prompt_tokens)
    assert a.fingerprint() != wl.fingerprint() and a.fingerprint() != b.fingerprint()
    for s in {f"s{i}" for i in range(4)}:
        turns = [t for t, sess in zip(a.turn, a.session) if sess == s]
        assert turns == sorted(turns) == [0, 1, 2]
        rows = [i for i, sess in enumerate(a.session) if sess == s]
        assert rows == list(range(rows[0], rows[0] + 3))  # a conversation stays together
    assert np.array_equal(wl.reordered(1).prompt_tokens, a.prompt_tokens)  # seeded


# -- the edge -------------------------------------------------------------------------------
def test_monotone_crossing_interpolates_and_ignores_a_noisy_dip():
    assert monotone_crossing([(10, 1.0), (20, 3.0)], 2.0, 10, 20) == pytest.approx(15.0, abs=0.01)
    # a P95 that dipped at 15 users (noise) is held at the running maximum
    x = monotone_crossing([(10, 1.0), (15, 0.9), (20, 3.0)], 2.0, 15, 20)
    assert x is not None and 15 < x < 20
    assert monotone_crossing([(10, 1.0), (20, 3.0)], 5.0, 10, 20) is None  # no crossing inside
    assert monotone_crossing([(10, math.inf), (20, 3.0)], 2.0, 10, 20) is None


def test_the_edge_is_located_within_the_tolerance_when_replays_allow():
    backend = FakeBackend(ttft_per_user=0.01)  # P95 ~ 0.0105 x users: the 1 s edge near 95 users
    ev = evaluate_config(backend, Deployment(), ServeConfig(max_num_seqs=256, gpu_memory_utilization=0.9),
                         small_workload(600), 1.0, max_replays=10, edge_tolerance=0.05)
    edge = ev.record.edge
    assert edge.located and edge.failing_level - edge.level <= max(1, 0.05 * edge.level)
    loads = ev.record.loads
    assert all(p.p95_ttft_s <= 1.0 for p in loads if p.passed)
    assert all(p.level > edge.level for p in loads if not p.passed)


class CliffBackend(FakeBackend):
    """P95 TTFT (nominal) 0.01 s x users up to 40 users, then 0.2 s more per user: the
    1 s target is crossed at 43 users, past a cliff, as a server whose KV cache fills up."""

    def start(self, deployment, config):
        inst = super().start(deployment, config)
        run = inst.run

        def cliff(workload, load, *, stop=None):
            users = load.users
            inst.ttft_per_user = (0.01 * users + 0.2 * max(0.0, users - 40)) / users
            return run(workload, load, stop=stop)

        inst.run = cliff
        return inst


def test_a_replay_stopped_far_over_the_target_places_the_edge_past_a_cliff():
    """From the top (256 users) the P95 is far over the target, and the first pass is the
    step down to a tenth (26 users). A replay stopped early knows only a lower bound of
    its P95; kept in the fit, a bound far over the target points the next loads near the
    edge (43 users): the five default replays end within 20 % under it. Left out, the fit
    had one point, the loads halved the gap from the top down to 55 users and the edge
    stayed at 26 users, 40 % under."""
    ev = evaluate_config(CliffBackend(), Deployment(), ServeConfig(max_num_seqs=256, gpu_memory_utilization=0.9),
                         small_workload(600), 1.0)
    loads = ev.record.loads
    assert len(loads) <= MAX_REPLAYS and loads[0].level == 256 and loads[0].stopped_early
    assert 0.8 * 43 <= ev.record.edge.level <= 43
    assert all(p.level > 43 for p in loads if not p.passed) and all(p.level <= 43 for p in loads if p.passed)


def test_without_a_prediction_a_closed_loop_trial_starts_at_the_best_trials_edge(tmp_path):
    # P95 ~ 0.05 s x users: the 1 s edge near 19 users, below every cap (30: half the workload)
    out = run_search(fake_space(), backend=FakeBackend(ttft_per_user=0.05), workload=small_workload(),
                     budget=8, storage=f"sqlite:///{tmp_path}/s.db", sampler="random", seed=3, confirm=0,
                     predictor=None)
    best_edge, best_value, checked = None, 0.0, 0
    for t in sorted(out.study.trials, key=lambda t: t.number):
        rec = TrialRecord.from_trial(t)
        if rec.loads and not rec.is_repeat:
            first = rec.loads[0].level
            if best_edge is None:
                assert first == rec.edge.cap  # nothing measured yet: from the top
            elif rec.edge is None or rec.edge.cap > best_edge:
                assert first == best_edge  # where the question "better than the best?" is decided
                checked += 1
        if rec.feasible and t.value and (best_edge is None or t.value > best_value):
            best_edge, best_value = rec.edge.level, t.value
    assert checked >= 2


def test_a_configuration_that_holds_at_its_cap_is_tried_above_it():
    backend = FakeBackend(ttft_per_user=0.01)  # 16 seqs: P95 0.17 s at the cap, 1 s near 95 users
    ev = evaluate_config(backend, Deployment(), ServeConfig(max_num_seqs=16, gpu_memory_utilization=0.9),
                         small_workload(600), 1.0, max_replays=8)
    edge = ev.record.edge
    assert edge.cap == 16 and edge.beyond_cap and edge.level > 16
    # a configuration already under the incumbent at its cap is not: that costs replays
    ev = evaluate_config(FakeBackend(ttft_per_user=0.01), Deployment(),
                         ServeConfig(max_num_seqs=16, gpu_memory_utilization=0.9), small_workload(600), 1.0,
                         max_replays=8, incumbent=10**9)
    assert len(ev.record.loads) == 1 and not ev.record.edge.beyond_cap


# -- exploration ------------------------------------------------------------------
def test_a_configuration_proposed_again_gives_its_slot_to_a_neighbour_of_the_best(tmp_path):
    out = run_search(fake_space(), backend=FakeBackend(ttft_per_user=0.05), workload=small_workload(),
                     budget=16, storage=f"sqlite:///{tmp_path}/s.db", sampler="random", seed=2, confirm=0,
                     predictor=None)
    trials = sorted(out.study.trials, key=lambda t: t.number)
    copies = [t.number for t in trials if "repeat_of" in t.user_attrs]
    explored = [t for t in trials if t.user_attrs.get("proposed_by") == "neighbour of the best"]
    assert copies and explored
    assert all(t.state.name != "WAITING" for t in trials)  # nothing queued past the budget
    for t in explored:
        assert t.number - 1 in copies  # the trial after a copy
        earlier = [u.params for u in trials if u.number < t.number]
        assert t.params not in earlier  # something not measured yet
        # one knob (or the layout) away from a trial that was the best when it was queued
        assert any(sum(u.params[k] != t.params[k] for k in t.params) == 1 for u in trials
                   if u.number < t.number and u.params.keys() == t.params.keys())


def test_trials_that_differ_only_in_knobs_without_effect_race_once(tmp_path):
    # No prompt shares a prefix and the longest request is ~500 tokens: prefix caching and
    # max-model-len 4096 vs 8192 cannot change the simulated server (tuner.study.effective), so
    # four of the eight configurations run one server twice each; only the KV dtype
    # changes speed. A race among the best would otherwise spend its places on copies.
    from tuner.backends.sim import SimBackend
    from tuner.study.effective import trial_group

    space = fake_space("""\
name: folds
deployment: {model: qwen2.5-7b, gpu: H100-SXM, gpus: 1}
workload: {target_ttft_s: 1s, requests: 60}
parameters:
  enable_prefix_caching: {choices: [true, false]}
  max_model_len: {choices: [4096, 8192]}
  kv_cache_dtype: {choices: [auto, fp8]}
layouts: [tp1x1]
""")
    out = run_search(space, backend=SimBackend(), workload=small_workload(), budget=8,
                     storage=f"sqlite:///{tmp_path}/s.db", sampler="random", seed=0, confirm=1, predictor=None)
    records = {t.number: TrialRecord.from_trial(t) for t in out.study.trials}
    searched = [n for n, r in records.items() if r.feasible and not r.is_repeat and not r.is_confirmation]
    groups = {n: trial_group(records[n], started=True)[0] for n in searched}
    entrants = list(out.confirmation.measurements)
    assert len({records[n].config.to_dict()["enable_prefix_caching"] for n in searched}) == 2  # copies existed
    assert len(set(groups.values())) < len(searched)
    # one entrant per effective configuration: named by the group's best-measured trial,
    # entering with the group's mean (each member was its own start), not its luckiest
    assert len({groups[n] for n in entrants}) == len(entrants)
    for n in entrants:
        same = [m for m in searched if groups[m] == groups[n]]
        assert out.study.trials[n].value == max(out.study.trials[m].value for m in same)
        values = [out.study.trials[m].value for m in same]
        assert out.confirmation.measurements[n][0] == pytest.approx(math.exp(np.mean(np.log(values))))
        assert min(values) * (1 - 1e-12) <= out.confirmation.measurements[n][0] <= max(values) * (1 + 1e-12)
    # and the recommendation names the trials that are its configuration here
    same = sorted(m for m in searched if groups[m] == groups[out.confirmation.winner] and m != out.confirmation.winner)
    assert same and f"{', '.join(map(str, same))} are the same configuration for this workload" in out.confirmation.reason  # noqa: E501


# -- feasibility confirmed, not assumed ---------------------------------------------------------
MARGIN_SPACE = """\
name: margin
deployment: {model: qwen2.5-7b, gpu: H100-SXM, gpus: 1}
workload: {target_ttft_s: 1s, requests: 60}
parameters:
  max_num_seqs: {choices: [16, 32, 64]}
layouts: [tp1x1]
"""


def margin_study(tmp_path, base: dict[int, float], seed: int = 9, feasibility: float = 0.9):
    # max-num-seqs 64 serves 3,000 tok/s per user but its true P95 TTFT at one user is
    # 1.07 s, 7 % over the 1 s target; the TTFT noise is drawn per server START (sd 10 %),
    # so a lucky start passes every replay it makes. Seeds 8 and 9 draw a lucky search start.
    from fakes import PerStartNoise

    from tuner.space import parse_space

    tmp_path.mkdir(exist_ok=True)
    backend = PerStartNoise(base, {16: 50.0, 32: 30.0, 64: 3000.0}, sd=0.10, seed=seed)
    space = parse_space(MARGIN_SPACE, path="margin.yaml").bind(Deployment(gpu_count=1), num_heads=28)
    out = run_search(space, backend=backend, workload=small_workload(), budget=3, storage=f"sqlite:///{tmp_path}/s.db",
                     sampler="grid", seed=0, confirm=2, predictor=None, feasibility=feasibility)
    lucky = [t for t in out.study.trials if t.user_attrs["config"]["max_num_seqs"] == 64 and "confirm_of" not in t.user_attrs]  # noqa: E501
    assert [f for s, f in backend.draws if s == 64][0] < 1 / 1.07 and lucky[0].value == 3000.0  # the lucky start passed
    return out, lucky[0].number


def test_a_configuration_that_passed_on_a_lucky_start_and_missed_on_a_repeat_is_not_recommended(tmp_path):
    out, lucky = margin_study(tmp_path, {16: 0.1, 32: 0.1, 64: 1.07})
    conf = out.confirmation
    assert conf.held and conf.winner != lucky and out.best.number == conf.winner
    # out for the target: its repeat's miss (at one user per replica) leaves it under --feasibility
    assert "failed the target" in conf.out[lucky] or "feasibility" in conf.out[lucky]
    # the next-best configuration was raced, and it met the target on every measurement
    values = conf.measurements[conf.winner]
    assert len(values) >= 3 and min(values) > 0
    assert conf.worst_p95_s is not None and conf.worst_p95_s <= 1.0 and conf.margin == pytest.approx(1 - conf.worst_p95_s)  # noqa: E501
    assert "SLO margin: worst P95 TTFT" in conf.reason and confirmation(out.study).worst_p95_s == conf.worst_p95_s


def test_when_no_candidate_holds_the_target_nothing_is_recommended_and_the_closest_is_named(tmp_path):
    out, lucky = margin_study(tmp_path, {16: 1.07, 32: 1.07, 64: 1.07})
    conf = out.confirmation
    assert not conf.held and out.best is None and best_feasible_trial(out.study) is None
    assert lucky in conf.measurements and 0.0 in conf.measurements[lucky]
    assert f"closest: trial {conf.winner}" in conf.reason and conf.worst_p95_s > 1.0


def test_a_lucky_pass_is_not_taught_to_the_sampler_as_a_sure_success(tmp_path):
    out, lucky = margin_study(tmp_path, {16: 0.1, 32: 0.1, 64: 1.07})
    trial = out.study.trials[lucky]
    (told,) = trial.constraints.values()  # Optuna's one constraint (P95 TTFT's): > 0 is not feasible to TPE
    p95 = trial.user_attrs["boundary"]["p95_ttft_s"]
    assert p95 <= 1.0 < trial.user_attrs["boundary"]["upper_p95_ttft_s"] and told > 0
    sure = [t for t in out.study.trials if t.user_attrs["config"]["max_num_seqs"] == 16 and "confirm_of" not in t.user_attrs]  # noqa: E501
    assert sure and "boundary" not in sure[0].user_attrs  # 0.1 s against 1 s: sure


def test_race_keeps_a_candidate_near_the_target_only_while_its_feasibility_is_above_the_threshold():
    near = Candidate(1, cfg(seqs=64), [3000.0], floor_p95s=[0.95])
    far = Candidate(2, cfg(seqs=16), [2900.0], floor_p95s=[0.5])

    def measure(c, r):
        c.floor_p95s.append(0.96 if c.number == 1 else 0.5)
        return c.values[0]

    conf = race([near, far], measure, NoiseFloor(0.02), rounds=2, target=1.0, feasibility_min=0.9)
    assert conf.winner == 2 and "feasibility" in conf.out[1]
    conf = race([near, far], measure, NoiseFloor(0.02), rounds=2, target=1.0, feasibility_min=0.5)
    assert 1 not in conf.out or "feasibility" not in conf.out[1]


def test_trials_of_one_effective_configuration_enter_the_race_with_their_mean_and_are_the_studys_replicates(
        monkeypatch):
    # two trials that differ only in a knob the workload never reached (tuner.study.effective
    # folds them: stood in here), each measured on its own start with its own noise draw
    from optuna.trial import create_trial

    from tuner.search.confirm import distinct

    config = ServeConfig(max_num_seqs=16, max_model_len=4096)
    trials = [create_trial(value=v, user_attrs=TrialRecord(config=config.replace(max_model_len=n), feasible=True).to_attrs())  # noqa: E501
              for v, n in ((1800.0, 4096), (1400.0, 8192))]
    for number, t in enumerate(trials):
        t.number = number
    records = {t.number: TrialRecord.from_trial(t) for t in trials}
    from tuner.search import confirm as confirm_module  # the module (tuner.search is the verb)

    monkeypatch.setattr(confirm_module, "trial_group", lambda rec, started: ("one server", {}))  # where it is used
    (entrant, members, mean), = distinct(trials, records)
    assert entrant.number == 0 and members == [0, 1]  # named by its best-measured trial
    assert mean == pytest.approx(math.sqrt(1800.0 * 1400.0))  # but entering with the pair's mean, not the luckier
