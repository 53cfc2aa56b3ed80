from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import optuna
import pytest
from fakes import Analytic, LateWatch

from tuner.backends.vllm import VllmBackend
from tuner.core.errors import InputError, NoFeasibleConfig
from tuner.plan import Figures, Sweep, load_plan, plan_capacity, plan_key, rescale, write_plan_files
from tuner.search import run_search
from tuner.serving.capacity import CapacityEstimate, max_load_meeting
from tuner.serving.config import Deployment, ServeConfig
from tuner.serving.demand import (
    Demand,
    conversations_per_min,
    cost_figures,
    parse_demand,
    parse_fraction,
    replicas_needed,
    requests_per_conversation,
)
from tuner.serving.result import RunResult
from tuner.space import parse_space
from tuner.traffic.workload import Workload

# Article 004, section 5: users and P95 TTFT (s)
ARTICLE_USERS = [5, 10, 20, 50, 80, 120, 160]
ARTICLE_P95 = [0.62, 0.84, 1.1, 2.3, 4.6, 8.2, 13.6]


# -- interpolation ------------------------------------------------------------------------
def test_crossing_on_the_articles_table_lies_between_the_bracketing_loads():
    c = max_load_meeting(ARTICLE_USERS, ARTICLE_P95, 5.0)
    assert c.status == "between"
    assert 80 < c.level < 120  # 80 users meet 5 s (4.6), 120 miss (8.2)


def test_pchip_recovers_the_crossing_of_a_smooth_monotone_curve():
    def p95(u):
        return 0.002 * u**2  # reaches 5 s at 50 users

    levels = [5, 10, 20, 40, 60, 80]
    c = max_load_meeting(levels, [p95(u) for u in levels], 5.0)
    assert c.level == pytest.approx(50, rel=0.03)


def test_crossing_grows_with_the_target():
    found = [max_load_meeting(ARTICLE_USERS, ARTICLE_P95, t).level for t in (1.0, 2.0, 3.0, 5.0, 8.0, 12.0)]
    assert found == sorted(found)
    assert all(a < b for a, b in zip(found, found[1:]))


def test_target_below_the_first_point_and_above_the_last():
    below = max_load_meeting(ARTICLE_USERS, ARTICLE_P95, 0.5)
    assert below.status == "below" and below.level is None
    above = max_load_meeting(ARTICLE_USERS, ARTICLE_P95, 20.0)
    assert above.status == "above" and above.level == 160


def test_a_dip_after_a_miss_is_not_spare_capacity():
    # 20 users miss 5 s; the lower reading at 30 is noise: the answer stays below 20
    c = max_load_meeting([10, 20, 30, 40], [1.0, 6.0, 4.0, 8.0], 5.0)
    assert 10 < c.level < 20


def test_failed_runs_count_as_misses_and_a_repeated_level_reads_its_worse_value():
    c = max_load_meeting([10, 20, 30], [1.0, 2.0, math.inf], 5.0)
    assert c.level == 20  # no curve beyond a failed run: the last good load
    # 20 users measured 3.0 and 5.0 against 4.0: they do not meet it (the mean, 4.0, would say
    # they do, the old rule of the plan: 20). Read as 5.0, the fit through (10, 1), (20, 5),
    # (30, 9) is a line (PCHIP keeps collinear points straight): 4.0 at 10 + 3 / 0.4 = 17.5
    c = max_load_meeting([10, 20, 20, 30], [1.0, 3.0, 5.0, 9.0], 4.0)
    assert c.status == "between" and c.level == pytest.approx(17.5)
    with pytest.raises(InputError):
        max_load_meeting([1, 2], [1.0], 1.0)


# -- conversations, demand, headroom, cost ------------------------------------------------
def test_conversations_per_minute_as_the_article_counts_them():
    # the article: 5000 tokens/s at 300 tokens per conversation -> 1000 per minute
    assert conversations_per_min(tokens_per_s=5000, requests_per_s=99, tokens_per_conversation=300) == 1000
    # 3 requests per conversation at 2 requests/s -> 40 conversations per minute
    assert conversations_per_min(tokens_per_s=1, requests_per_s=2, requests_per_conversation=3) == pytest.approx(40)


def test_requests_per_conversation_from_session_ids():
    assert requests_per_conversation(["a", "a", "b", None]) == pytest.approx(4 / 3)
    assert requests_per_conversation([None, None]) is None
    assert requests_per_conversation(None) is None


def test_demand_parsing():
    assert parse_demand("1200/min") == Demand(1200, "conversations")
    assert parse_demand("20/s") == Demand(1200, "conversations")
    assert parse_demand("72000/h").per_min == pytest.approx(1200)
    assert parse_demand("20req/s") == Demand(1200, "requests")
    assert parse_demand("1200 conv/min") == Demand(1200, "conversations")
    assert parse_demand("600") == Demand(600, "conversations")
    with pytest.raises(InputError, match="cannot read demand"):
        parse_demand("lots")
    assert parse_fraction("20%") == pytest.approx(0.2)
    assert parse_fraction("0.5") == 0.5
    with pytest.raises(InputError):
        parse_fraction("-5%")


def test_replicas_hand_worked():
    # 2500/min with 20% headroom is 3000/min to provision; 1000/min each -> exactly 3
    assert replicas_needed(2500, 1000, 0.2) == 3
    assert replicas_needed(2501, 1000, 0.2) == 4
    assert replicas_needed(1000, 1000, 0.0) == 1
    assert replicas_needed(1000, 1000, 0.2) == 2  # headroom forces a second replica
    assert replicas_needed(10, 1000, 0.2) == 1
    assert replicas_needed(0, 1000, 0.2) == 0
    with pytest.raises(InputError):
        replicas_needed(100, 1000, -0.1)


def test_cost_hand_worked():
    # 8 GPUs at 2.00/GPU-hour = 16/hour; 1e6/3600 tokens/s is a million tokens an hour
    c = cost_figures(2.0, 8, tokens_per_s=1e6 / 3600, output_tokens_per_s=0.5e6 / 3600, replicas=3)
    assert c["cost_per_hour"] == 16
    assert c["total_cost_per_hour"] == 48
    assert c["cost_per_million_tokens"] == pytest.approx(16)
    assert c["cost_per_million_output_tokens"] == pytest.approx(32)


def wl(n: int = 400, sessions=None) -> Workload:
    return Workload(arrival_s=np.zeros(n), prompt_tokens=np.full(n, 200), output_tokens=np.full(n, 100),
                    session=sessions, source="test")


def plan(f, **kw):
    kw.setdefault("workload", wl())
    return plan_capacity(kw.pop("target", 5.0), config=ServeConfig(tensor_parallel_size=2),
                         deployment=Deployment(gpu_count=2), backend=Analytic(f), **kw)


def test_linear_server_gives_the_exact_crossing_and_verifies_it():
    est = plan(lambda u: 0.05 * u)  # 5 s at 100 users
    assert est.max_concurrency == 100 and est.bound == "interpolated" and est.verified
    assert est.ttft_p95_s <= 5.0
    verify = [p for p in est.sweep if p.role == "verify"]
    # 100 (the crossing) held; 120 broke: 105, a quarter of the gap up, broke within 5 % of 100
    assert [p.level for p in verify] == [100, 105] and not verify[1].meets(5.0)
    assert est.tokens_per_s == pytest.approx(100 * 100)  # the analytic server's 100 tok/s per user
    # workload mean is 300 tokens per request: one conversation = one request
    assert est.conversations_per_min == pytest.approx(est.tokens_per_s * 60 / 300)


def test_a_missed_verification_steps_down_and_says_so():
    est = plan(lambda u: 0.05 * u if u < 85 else 9.0)  # a cliff just above the measured 80
    assert est.max_concurrency < 85 and est.ttft_p95_s <= 5.0
    assert any("missed" in n and "stepped down" in n for n in est.notes)
    assert sum(p.role == "verify" for p in est.sweep) >= 2


def _no_gap(est, target: float = 5.0) -> None:
    """The answer is a load that was run and held, and a load that was run and broke lies
    within the search's edge width above it (5 %, at least one user): nothing left unverified
    between the last load that held and the first that broke."""
    from tuner.search import edge_width

    answer = next(p for p in est.sweep if p.level == est.max_load)
    assert answer.meets(target), est.sweep
    broke = min(p.level for p in est.sweep if not p.meets(target) and p.level > est.max_load)
    assert broke - est.max_load <= edge_width(est.max_load, est.load_kind), sorted(p.level for p in est.sweep)


def test_an_interpolation_that_lands_on_the_load_that_held_still_looks_between_it_and_the_break():
    """The issue's shape: P95 TTFT flat near the target up to 13 users, then a cliff. 5, 10
    and 20 users are run; the curve crosses the target right after 10, where the plan used to
    answer without running anything in between (10 users where 13 hold)."""
    est = plan(lambda u: 4.9 if u <= 13 else 40.0, sweep=Sweep(levels=[5, 10, 20]))
    assert est.max_concurrency == 13 and est.verified
    _no_gap(est)


def test_a_coarse_ladder_leaves_no_gap_between_the_answer_and_the_first_load_that_broke():
    knee = lambda u: 0.5 + 0.01 * u if u <= 13 else 1.64 + 4.0 * (u - 14)  # noqa: E731  # 14 holds, 15 breaks
    for levels in ([5, 10, 20], [1, 100], [2, 40], [5, 50]):
        est = plan(knee, target=2.0, sweep=Sweep(levels=levels))
        assert est.max_concurrency == 14, (levels, sorted(p.level for p in est.sweep))
        _no_gap(est, 2.0)
    est = plan(lambda r: 0.5 * r, sweep=Sweep(rates=[1, 64]))  # open loop: 5 s at 10 req/s
    assert est.max_load == pytest.approx(10, rel=0.05) and est.max_load <= 10
    _no_gap(est)


def test_a_server_that_never_breaks_is_extended_then_reported_as_a_lower_bound():
    est = plan(lambda u: 0.1, workload=wl(600))
    levels = sorted(p.level for p in est.sweep)
    assert levels[-1] == 300  # extended x1.5 from 160, capped at half the 600 requests
    assert est.bound == "at_least" and est.max_concurrency == 300
    assert any("at least" in n for n in est.notes)


def test_a_server_that_misses_at_the_lowest_load_is_infeasible():
    backend = Analytic(lambda u: 6.0)
    with pytest.raises(NoFeasibleConfig, match="even at the lowest load"):
        plan_capacity(5.0, config=ServeConfig(), workload=wl(), backend=backend)
    assert min(backend.runs) == 1  # halved down to one user first


def test_demand_headroom_cost_and_json_keys():
    est = plan(lambda u: 0.05 * u, figures=Figures(tokens_per_conversation=300, demand="2500/min", headroom=0.2,
                                                gpu_hour_cost=2.0))
    assert est.conversations_per_min == pytest.approx(2000)  # 10,000 tok/s x 60 / 300
    assert est.replicas == 2  # 2500 x 1.2 = 3000 per minute over 2000 each
    assert est.cost_per_hour == 4.0 and est.total_cost_per_hour == 8.0  # TP2 = 2 GPUs
    data = json.loads(json.dumps(est.to_dict(), allow_nan=False))
    for key in ("max_concurrency", "requests_per_s", "tokens_per_s", "output_tokens_per_s",
                "conversations_per_min", "replicas", "sweep"):
        assert key in data
    assert isinstance(data["sweep"], list) and {"level", "ttft_p95_s", "tokens_per_s"} <= set(data["sweep"][0])
    assert CapacityEstimate.from_dict(data) == est


def test_sessions_count_requests_per_conversation():
    sessions = [f"c{i // 4}" for i in range(400)]  # 4 turns each
    est = plan(lambda u: 0.05 * u, workload=wl(400, sessions))
    assert est.conversation_basis == "requests" and est.requests_per_conversation == 4
    assert est.conversations_per_min == pytest.approx(est.requests_per_s * 60 / 4)


def test_repeats_give_ranges_around_the_headline():
    est = plan(lambda u: 0.05 * u, sweep=Sweep(repeats=3))
    assert est.repeats == 3 and {p.repeat for p in est.sweep} == {0, 1, 2}
    for key in ("max_concurrency", "tokens_per_s", "conversations_per_min"):
        lo, hi = est.ranges[key]
        assert lo <= getattr(est, key) <= hi


def test_open_loop_rates():
    est = plan(lambda r: 0.5 * r, sweep=Sweep(rates=[1, 2, 4, 8, 16]))  # 5 s at 10 req/s
    assert est.load_kind == "rate" and est.max_load == pytest.approx(10, rel=1e-6)
    assert est.max_concurrency == pytest.approx(est.requests_per_s * est.e2e_mean_s)


def test_time_scale_restores_simulated_time():
    n = 4
    r = RunResult(send_s=np.zeros(n), ttft_s=np.full(n, 0.1), e2e_s=np.full(n, 1.0), prompt_tokens=np.full(n, 10),
                  output_tokens=np.full(n, 10), error=[None] * n, duration_s=2.0)
    s = rescale(r, 20.0).summary()
    assert s["ttft_p95_s"] == pytest.approx(2.0) and s["tokens_per_s"] == pytest.approx(r.summary()["tokens_per_s"] / 20)  # noqa: E501
    assert VllmBackend(vllm_cmd="python -m tuner sim-serve --speed 25").time_scale == 25
    assert VllmBackend(vllm_cmd="vllm serve --speed 25").time_scale == 1.0


def test_files_are_written(tmp_path):
    est = plan(lambda u: 0.05 * u)
    md, png = write_plan_files(est, tmp_path)
    assert md.read_text().count("| sweep |") == 6 and png.stat().st_size > 10_000  # 5-120 users: 160 not run
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# -- the study as storage -----------------------------------------------------------------
def test_plan_is_stored_in_a_real_study_and_read_back(tmp_path):
    from tuner.space import load_space

    storage = f"sqlite:///{tmp_path}/s.db"
    space = load_space("default")
    space = space.bind(space.deployment, num_heads=28)
    small = wl(80)
    out = run_search(space, workload=small, budget=2, storage=storage, study="s")
    assert out.best is not None
    est = plan_capacity(2.0, study="s", storage=storage, workload=small, sweep=Sweep(levels=[2, 4, 8], max_extensions=1))  # noqa: E501
    assert est.study == "s" and est.trial == out.best.number
    again = optuna.load_study(study_name="s", storage=storage)
    assert plan_key(est.trial, 2.0) in again.user_attrs
    back = load_plan(again, trial=est.trial, target_ttft_s="2s")
    assert back == est
    assert load_plan("s", storage=storage, target_ttft_s=99) is None


def test_the_default_sweep_stops_one_point_after_the_target_breaks(tmp_path):
    from tuner.space import load_space

    storage = f"sqlite:///{tmp_path}/b.db"
    space = load_space("default")
    small = wl(400)
    out = run_search(space.bind(space.deployment, num_heads=28), workload=small, budget=1, storage=storage, study="b")
    assert out.best is not None
    backend = Analytic(lambda u: 0.05 * u)  # 5 s at 100 users: 80 meet it, 120 is the first over
    plan_capacity(5.0, study="b", storage=storage, workload=small, backend=backend)
    stored = load_plan("b", storage=storage, target_ttft_s=5.0)
    main = sorted(p.level for p in stored.sweep if p.role == "sweep")
    over = [p.level for p in stored.sweep if p.role == "sweep" and not p.meets(5.0)]
    assert over == [max(main)] == [120]  # exactly one point over the target, at the high end
    assert 160 not in backend.runs and max(backend.runs) == 120
    assert any("160 not run" in n for n in stored.notes)
    assert stored.bound == "interpolated" and stored.max_load == 100 and stored.workload.matches_study


def test_levels_given_are_all_run_and_a_miss_at_the_first_default_level_goes_down():
    est = plan(lambda u: 0.05 * u, sweep=Sweep(levels=[20, 150, 200]))
    assert sorted(p.level for p in est.sweep if p.role == "sweep") == [20, 150, 200]
    backend = Analytic(lambda u: 0.5 * u)  # 5 s at 10 users: 5 users meet it
    est = plan_capacity(1.0, config=ServeConfig(), workload=wl(), backend=backend)
    assert [p.level for p in est.sweep if p.role == "sweep"] == [5]  # 10, 20, ... never run
    assert est.max_load == 2 and max(backend.runs) == 5


def test_a_plan_stored_before_the_workload_record_reads_back():
    est = plan(lambda u: 0.05 * u)
    old = est.to_dict()
    old["workload"] = {"source": "test", "requests": 400, "fingerprint": est.workload.fingerprint}
    back = CapacityEstimate.from_dict(old)
    assert back.workload.match == "unchecked" and not back.workload.matches_study
    assert back.workload.requests == 400 and back.workload.file is None


def test_a_study_on_a_trace_is_planned_on_that_trace(tmp_path):
    from tuner.traffic import load_trace

    rows = [f"2023-11-16 18:15:{i // 4:02d}.{i % 4 * 25:02d}0000,{100 + 7 * i},{20 + i % 30}" for i in range(80)]
    path = tmp_path / "azure.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n", encoding="utf-8")
    trace = load_trace(str(path))
    storage = f"sqlite:///{tmp_path}/t.db"
    space = parse_space(AGREEMENT_SPACE.replace("V100-32GB-SXM2", "H100-SXM").replace("dtype: float16", "dtype: auto"),
                        path="t.yaml")
    run_search(space.bind(space.deployment, num_heads=28), workload=trace, budget=1, storage=storage, study="t")
    est = plan_capacity(2.0, study="t", storage=storage, sweep=Sweep(levels=[2, 4], max_extensions=1, repeats=2))
    assert est.workload.source == trace.source and est.workload.requests == 80
    assert est.workload.fingerprint == trace.fingerprint() and est.workload.matches_study


def test_missing_study_and_trial_are_bad_input(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError, match="no study"):
        plan_capacity(5.0)
    storage = f"sqlite:///{tmp_path}/e.db"
    optuna.create_study(study_name="empty", storage=storage)
    with pytest.raises(NoFeasibleConfig):
        plan_capacity(5.0, study="empty", storage=storage)
    with pytest.raises(InputError, match="no trial 7"):
        plan_capacity(5.0, study="empty", storage=storage, trial=7)


# -- through real processes and HTTP --------------------------------------------------------
# A plan made through tuner sim-serve, started by the vLLM backend and replayed by the
# streaming client, against the same plan on the in-process simulator. One V100 (decode
# steps of ~40-60 ms: slow enough that HTTP and event-loop overheads stay small against
# them), 32 running sequences, short outputs, so each run takes seconds in real time.
AGREEMENT_SPACE = """\
name: sim-serve-agreement
deployment: {model: qwen2.5-7b, gpu: V100-32GB-SXM2, gpus: 1, dtype: float16}
workload: {target_ttft_s: 8s, requests: 32}   # the study (one replay passes); the plan asks for 2 s
parameters:
  max_num_seqs: 32
  max_model_len: 2048
layouts: [tp1x1]
"""
SPEED = 1.0  # sim-serve in real time: faster speeds let per-step overheads show (TPOT +15-25% at 2x here)
PLAN_FIGURES = ("max_concurrency", "requests_per_s", "tokens_per_s", "output_tokens_per_s", "conversations_per_min")


def agreement_workload(n: int = 32) -> Workload:
    # A 2 s target: P95 TTFT here is the first wave's prefill queue (~0.16 s a user, for 32
    # requests as for 64), so the crossing lands at 11 users, where one user of jitter
    # between real and virtual time is under the 10 % the plans must agree within (with a
    # 1 s target it sat at 5-6 users: one user was 20 %). Levels 8 and 16 bracket it.
    rng = np.random.default_rng(0)
    return Workload(arrival_s=np.zeros(n), prompt_tokens=rng.integers(200, 400, n),
                    output_tokens=rng.integers(20, 40, n), source="agreement")


#: Steps ending this late at P95 (a fifth of a ~40 ms decode step) mean a starved CPU, not a wrong
#: plan (an idle 2-core machine sees ~2-5 ms, where the plans agree within 2 %).
LATE_S = 0.008


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_plan_on_sim_serve_agrees_with_the_in_process_simulator(tmp_path):
    pytest.importorskip("aiohttp")
    from tuner.backends import get_backend

    space = parse_space(AGREEMENT_SPACE, path="agreement.yaml")
    space = space.bind(space.deployment, num_heads=28)
    wl = agreement_workload()
    storage = f"sqlite:///{tmp_path}/s.db"
    # the configuration to plan: the study's one trial, on the in-process simulator (a
    # search through sim-serve is tests/faults' and the live tier's)
    out = run_search(space, backend="sim", workload=wl, budget=1, storage=storage, study="agree", max_replays=2)
    assert out.best is not None
    options = {"vllm_cmd": f"{sys.executable} -m tuner sim-serve --speed {SPEED:g}", "log_dir": str(tmp_path / "logs")}
    watched = LateWatch(get_backend("vllm", **options))
    real = plan_capacity(2.0, study="agree", storage=storage, workload=wl, sweep=Sweep(levels=[8, 16], max_extensions=1),  # noqa: E501
                         backend=watched)
    sim = plan_capacity(2.0, study="agree", storage=storage, workload=wl, sweep=Sweep(levels=[8, 16], max_extensions=1),
                        backend="sim", store=False)
    assert real.backend == "vllm" and sim.backend == "sim"
    assert sim.max_concurrency >= 11  # the crossing where one user is under 10 % of the answer
    # through real processes the plan completes: the target broke between the levels, the
    # answer was verified at the target, every request was served, and the study keeps it
    assert real.bound == "interpolated" and real.ttft_p95_s <= 2.0
    assert {p.level for p in real.sweep if p.role == "sweep"} == {8.0, 16.0}
    assert any(p.role == "verify" for p in real.sweep) and all(p.error_rate == 0 for p in real.sweep)
    assert load_plan("agree", storage=storage, target_ttft_s=2.0) == real
    # a busy machine only makes the real path slower (a step never ends before its simulated
    # time): it never holds more than the simulator says, beyond one user of jitter
    for key in PLAN_FIGURES:
        ours, ref = getattr(real, key), getattr(sim, key)
        assert ours <= ref * 1.10, f"{key}: sim-serve {ours:.4g} > in-process {ref:.4g} + 10%"
    if watched.late_p95_s > LATE_S:
        pytest.skip(f"two-sided agreement not checked: sim-serve could not keep real time (steps ended "
                    f"{watched.late_p95_s * 1e3:.1f} ms late at P95, over {LATE_S * 1e3:g} ms), the machine is "
                    "busy; the stored, feasible plan and the one-sided bound were checked "
                    "(benchmarks/plan_agreement.py prints the agreement)")
    # while the server kept real time, the two plans agree within 10 %
    for key in PLAN_FIGURES:
        ours, ref = getattr(real, key), getattr(sim, key)
        assert ours == pytest.approx(ref, rel=0.10), f"{key}: sim-serve {ours:.4g} vs in-process {ref:.4g}"


def test_an_edge_above_half_the_default_requests_grows_the_workload_until_it_is_bracketed():
    from tuner.plan import PLAN_REQUESTS

    edge = 1.6 * PLAN_REQUESTS  # 5 s at 1,600 users: the default 1,000 requests hold no more than 500
    est = plan_capacity(5.0, config=ServeConfig(), backend=Analytic(lambda u: 5.0 * u / edge))
    assert est.bound == "interpolated" and est.verified
    assert est.max_concurrency == pytest.approx(edge, abs=1)
    assert est.workload.requests >= 2 * edge  # users stay at most half the requests
    assert any("went on with" in n for n in est.notes)
    levels = sorted(p.level for p in est.sweep)
    assert len(levels) == len(set(levels))  # the load the small workload capped was measured again, not twice


def test_growth_stops_at_its_cap_and_says_how_to_go_further():
    from tuner.plan.sweep import MAX_REQUESTS

    est = plan_capacity(5.0, config=ServeConfig(), backend=Analytic(lambda u: 0.1))
    assert est.bound == "at_least" and est.workload.requests <= MAX_REQUESTS
    assert est.max_concurrency == est.workload.requests // 2
    assert any(f"{MAX_REQUESTS:,} requests is the most" in n for n in est.notes)


def test_a_files_rows_cannot_grow_and_the_note_says_to_give_a_longer_trace():
    est = plan(lambda u: 0.1, workload=wl(600))
    assert est.bound == "at_least" and est.workload.requests == 600
    assert any("give a longer trace" in n for n in est.notes)


def test_a_request_count_given_is_kept_and_the_note_says_to_raise_it():
    est = plan_capacity(5.0, config=ServeConfig(), backend=Analytic(lambda u: 0.1), sweep=Sweep(requests=300))
    assert est.bound == "at_least" and est.workload.requests == 300 and est.max_concurrency >= 150
    assert any("give a larger -n" in n for n in est.notes)


# -- the plan of a study's trial agrees with the search on it --------------------------------
PREFILL_HEAVY = Path(__file__).parents[1] / "fixtures" / "prefill-heavy-100.jsonl"


@pytest.mark.parametrize("levels", [None, [5, 50], [1, 100]], ids=["default", "5,50", "1,100"])
def test_plan_agrees_with_the_search_on_the_trial_it_plans(tmp_path, levels):
    """A 100-request window of a prefill-heavy trace: the search's winner held its edge at some
    users; plan on that study and trial finds the same load within the 5 % both locate it to,
    and tokens/s there within the noise the search states for its winner (its confirmation
    band, widened by two run-to-run sd), whatever ladder it started from."""
    import tuner
    from tuner.search import SearchSettings, edge_width
    from tuner.study.record import TrialRecord

    storage = f"sqlite:///{tmp_path}/p.db"
    out = tuner.search(workload={"trace": str(PREFILL_HEAVY)}, storage=storage, study="p",
                       settings=SearchSettings(budget=6, seed=0))
    rec = TrialRecord.from_trial(out.best)
    assert rec.edge is not None and rec.edge.located, rec.edge
    est = tuner.plan(study="p", storage=storage, trial=out.best.number,
                     sweep=Sweep(levels=levels) if levels else Sweep(), store=False)
    assert est.workload.matches_study and est.verified
    assert abs(est.max_load - rec.edge.level) <= edge_width(rec.edge.level, "concurrency"), (est.max_load, rec.edge)
    conf = out.confirmation
    lo, hi = conf.band
    assert lo * (1 - 2 * conf.noise.rel_sd) <= est.tokens_per_s <= hi * (1 + 2 * conf.noise.rel_sd)
    assert any(n.startswith(f"the search held {rec.edge.level:g} users on trial {out.best.number}") and "agrees" in n
               for n in est.notes), est.notes
    _no_gap(est, est.target_ttft_s)
