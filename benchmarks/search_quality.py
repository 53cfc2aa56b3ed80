"""How close does the search get to the best configuration, and at what GPU cost?

Scenario: article 004 (8 x V100-32GB SXM2, Qwen2.5-7B FP16, 2 s P95 TTFT, the built-in
article-004 mix) with the knobs of the default space, on the simulator.

Ground truth: every point of a discretised version of the default space is evaluated
ONCE with the product's objective (:func:`tuner.search.evaluate_config`; the simulator is
deterministic) and cached in ``studies/search_quality_grid.json``. The grid keeps the
default space's searched knobs and layouts, with gpu-memory-utilization at its ends
(0.85, 0.95) and the knobs that cannot matter for this workload fixed: prefix caching
(the synthetic mix shares no prefixes), block size 16 and max-model-len 8192 (no request
of the mix is longer than ~2,500 tokens). Searchers then look values up in that table:

* TPE (``tuner search``'s default sampler, with the TTFT constraint) at 15 and 40 trials;
* random search at 15 and 40 trials;
* the strategy of vLLM's ``benchmarks/auto_tune/auto_tune.sh``: fixed TP (its default
  TP=1, here with 8 replicas to use the GPUs), gpu-memory-utilization lowered from the top
  until the server starts with the largest max-num-seqs and max-num-batched-tokens, then a
  grid over max-num-seqs x max-num-batched-tokens; for each, one run at request rate inf,
  and if the latency limit (here P95 TTFT) fails, request rate int(throughput)+1 lowered
  by 1 req/s per run of 100 prompts until it holds. It is deterministic, so one run
  serves every seed; its pick is scored with the same objective as the others.

Printed: the fraction of the optimum each reaches per seed, and the simulated GPU time
(startup + replay seconds) of real 40-trial ``tuner search`` studies on both article
spaces, on a stand-in for real vLLM (the simulator, treated as a backend that costs GPU
time), vs the same 40 trials run naively (no pre-check: a refused start costs a start;
every replay to its end; repeats relaunched). The studies run with pre-check, early stop,
incumbent bound and reuse of repeats, and with the simulator as predictor
(:mod:`tuner.search.prediction`: start load, pruning, predicted twins) in five versions: none, the
stand-in's own constants, and three deliberately wrong ones, so that the savings do not
rest on a predictor that is the truth. Each study's best is shown as a share of the best
any study found on that space: what the savings cost in result.

Run: ``python benchmarks/search_quality.py [--jobs 2] [--seeds 10]`` (the first run
fills the cache: ~10 min on 2 cores; later runs take seconds).
"""
from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import optuna

from tuner.backends.sim import SimBackend
from tuner.core.errors import ConfigRejected
from tuner.search import CONSTRAINT, default_trials, evaluate_config, make_sampler, num_heads
from tuner.serving.config import ServeConfig
from tuner.serving.load import Concurrency, Poisson
from tuner.space import SearchSpace, choice_param, load_space, parse_layout
from tuner.study.record import TrialRecord
from tuner.traffic.synth import default_workload

CACHE = Path("studies") / "search_quality_grid.json"
REQUESTS = 400
GRID = {
    "gpu_memory_utilization": (0.85, 0.95),
    "max_num_seqs": (32, 64, 128, 256, 512),
    "max_num_batched_tokens": (2048, 4096, 8192, 16384),
    "enforce_eager": (False, True),
    "kv_cache_dtype": ("auto", "fp8"),
}
FIXED = (("max_model_len", 8192), ("block_size", 16), ("enable_prefix_caching", True))


def scenario() -> tuple[SearchSpace, object]:
    article = load_space("article-004-8xv100-32gb")
    default = load_space("default")
    for name in GRID:  # the grid is a discretisation of the default space
        param = next(p for p in default.params if p.name == name)
        assert all(param.contains(v) for v in GRID[name]), name
    params = tuple(choice_param(name, values) for name, values in GRID.items())
    space = SearchSpace(name="search-quality", deployment=article.deployment, workload=article.workload,
                        params=params, fixed=FIXED, layouts=None, path="benchmarks/search_quality.py")
    space = space.bind(article.deployment, num_heads(article.deployment))
    return space, default_workload(seed=0, n=REQUESTS)


def key_of(config: ServeConfig) -> str:
    return json.dumps(config.to_dict(), sort_keys=True)


def grid_points(space: SearchSpace) -> list[ServeConfig]:
    grid = space.grid()
    names = sorted(grid)
    return [space.config_from_params(dict(zip(names, values)))
            for values in itertools.product(*(grid[n] for n in names))]


def _evaluate(config: ServeConfig) -> tuple[str, dict]:
    space, workload = scenario()
    ev = evaluate_config(SimBackend(), space.deployment, config, workload, space.workload.target_ttft_s)
    record = {"value": ev.value, "feasible": ev.feasible, "constraint": ev.constraint, "gpu_s": ev.gpu_s,
              "replays": len(ev.record.loads), "rejected": ev.record.rejected_kind is not None,
              "startup_s": ev.record.run.startup_s}
    return key_of(config), record


def code_fingerprint() -> str:
    """Hash of the code and data the cached values depend on (the simulator changes)."""
    import hashlib

    import tuner

    root = Path(tuner.__file__).parent
    h = hashlib.sha256(f"{REQUESTS}{GRID}{FIXED}".encode())
    for path in sorted([*root.glob("sim/*.py"), *root.glob("data/**/*"), root / "backends" / "sim.py",
                        *root.glob("search/*.py"), root / "study" / "race.py", root / "traffic" / "synth.py"]):
        if path.is_file():
            h.update(path.read_bytes())
    return h.hexdigest()[:16]


def load_cache() -> dict:
    """The cached evaluations, unless the simulator or the search changed since."""
    code = code_fingerprint()
    cache = json.loads(CACHE.read_text()) if CACHE.is_file() else {}
    if cache.get("code") != code:
        cache = {"code": code, "table": {}}
    return cache


def fill(cache: dict, configs: list[ServeConfig], workers: int) -> None:
    todo = [c for c in configs if key_of(c) not in cache["table"]]
    if not todo:
        return
    print(f"evaluating {len(todo)} configurations on the simulator ({workers} workers)...", file=sys.stderr)
    t0 = time.perf_counter()
    with ProcessPoolExecutor(workers) as pool:
        for i, (key, record) in enumerate(pool.map(_evaluate, todo, chunksize=2), 1):
            cache["table"][key] = record
            if i % 20 == 0 or i == len(todo):
                CACHE.parent.mkdir(exist_ok=True)
                CACHE.write_text(json.dumps(cache))
                print(f"  {i}/{len(todo)} in {time.perf_counter() - t0:.0f} s", file=sys.stderr)


def run_sampler(space: SearchSpace, table: dict, sampler: str, trials: int, seed: int,
                defaults: bool = True) -> list[ServeConfig]:
    """The same loop as ``run_search`` (vLLM's defaults per layout first for TPE, then
    suggest, evaluate, constraint), values from the table."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize", sampler=make_sampler(sampler, seed=seed, space=space))
    if sampler == "tpe" and defaults:
        for params in default_trials(space):
            study.enqueue_trial(params)
    picked: list[ServeConfig] = []

    def objective(trial: optuna.Trial) -> float:
        config = space.suggest(trial)
        record = table[key_of(config)]
        trial.set_constraint(CONSTRAINT, record["constraint"])
        picked.append(config)
        return record["value"]

    study.optimize(objective, n_trials=trials)
    return picked


def best_of(table: dict, picked: list[ServeConfig]) -> float:
    return max((table[key_of(p)]["value"] for p in picked if table[key_of(p)]["feasible"]), default=0.0)


def auto_tune(space: SearchSpace, workload) -> tuple[str, float, float]:
    """vLLM auto_tune.sh's strategy on the simulator: (picked params, its own best
    throughput in tokens/s, its GPU seconds)."""
    backend = SimBackend()
    target = space.workload.target_ttft_s
    layout = "tp1x8"
    tp, replicas = parse_layout(layout)
    seqs_list, mbt_list = GRID["max_num_seqs"], GRID["max_num_batched_tokens"]
    base = dict(FIXED, enforce_eager=False, kv_cache_dtype="auto", tensor_parallel_size=tp, replicas=replicas)
    gpu_s = 0.0
    gmu = None
    for candidate in sorted(GRID["gpu_memory_utilization"], reverse=True):
        config = ServeConfig(**base, gpu_memory_utilization=candidate, max_num_seqs=seqs_list[-1],
                             max_num_batched_tokens=mbt_list[-1])
        try:
            gpu_s += backend.start(space.deployment, config).info["startup_s"]
            gmu = candidate
            break
        except ConfigRejected:
            gpu_s += 60.0  # a failed start still loads weights and profiles
    best: tuple[float, str] = (0.0, "")
    short = workload.take(slice(0, 100))
    for seqs, mbt in itertools.product(seqs_list, mbt_list):
        config = ServeConfig(**base, gpu_memory_utilization=gmu, max_num_seqs=seqs, max_num_batched_tokens=mbt)
        try:
            instance = backend.start(space.deployment, config)
        except ConfigRejected:
            gpu_s += 60.0
            continue
        gpu_s += instance.info["startup_s"]
        result = instance.run(workload, Concurrency(len(workload)))  # --request-rate inf
        gpu_s += result.duration_s
        summary = result.summary()
        rate = int(summary["requests_per_s"]) + 1
        while summary["ttft_p95_s"] > target and rate > 0:
            result = instance.run(short, Poisson(rate=rate, seed=0))
            gpu_s += result.duration_s
            summary = result.summary()
            rate -= 1
        if summary["ttft_p95_s"] <= target and summary["tokens_per_s"] > best[0]:
            best = (summary["tokens_per_s"], key_of(config))
    return best[1], best[0], gpu_s


def naive_gpu_s(records: list[dict]) -> float:
    """GPU seconds of trials run naively: a refused start costs a start (median of the
    starts that worked), every replay runs to its end, a repeated config runs again."""
    started = [r["startup_s"] for r in records if r.get("startup_s")]
    failed_start_s = statistics.median(started) if started else 60.0
    return sum(failed_start_s if r["rejected"] else r["gpu_s"] for r in records)


class StandIn(SimBackend):
    """The simulator standing in for real vLLM: the search treats it as a backend that
    costs GPU time (planner pre-check, a predictor), and it reports the startup and
    replay seconds a real one would take."""

    name = "sim-as-vllm"
    measures_gpu_time = True


#: Predictors of the GPU-time study: the simulator with the stand-in's own constants, and
#: deliberately wrong ones (a uniform error either way, and errors that differ by
#: configuration: eager launches x3, all-reduce links at half speed, GEMMs 20% slower).
PREDICTORS = ("none", "exact", "30% slow", "25% fast", "skewed")


def miscalibrated(base, kind: str):
    if kind == "exact":
        return base
    if kind == "30% slow":
        return base.replace(hbm_efficiency=base.hbm_efficiency * 0.7, flops_efficiency=base.flops_efficiency * 0.7,
                            step_overhead_s=base.step_overhead_s * 1.4, per_seq_overhead_s=base.per_seq_overhead_s * 1.4)  # noqa: E501
    if kind == "25% fast":
        return base.replace(hbm_efficiency=min(1.0, base.hbm_efficiency * 1.25),
                            flops_efficiency=min(1.0, base.flops_efficiency * 1.25),
                            step_overhead_s=base.step_overhead_s * 0.6, per_seq_overhead_s=base.per_seq_overhead_s * 0.6)  # noqa: E501
    if kind == "skewed":
        return base.replace(launch_per_layer_s={k: v * 3 for k, v in base.launch_per_layer_s.items()},
                            link_efficiency=base.link_efficiency * 0.5, flops_efficiency=base.flops_efficiency * 0.8)
    raise ValueError(kind)


def gpu_time_of_study(job: tuple[str, str, int]) -> dict:
    """A real 40-trial ``run_search`` study on the stand-in backend (pre-check, early stop,
    reuse of repeats, and the predictor ``kind``) vs the same trials run naively (each
    launched, no early stop): GPU seconds of both, trials pruned, best value found."""
    import tempfile

    from tuner.search import build_workload, run_search
    from tuner.search.prediction import Predictor
    from tuner.sim.calibration import load_calibration
    from tuner.sim.hardware import get_gpu

    space_name, kind, seed = job
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = load_space(space_name)
    space = space.bind(space.deployment, num_heads(space.deployment))
    workload = build_workload(space.workload)
    target = space.workload.target_ttft_s
    predictor = None
    if kind != "none":
        base = load_calibration(get_gpu(space.deployment.gpu), vllm_version=space.deployment.vllm_version)
        predictor = Predictor(space.deployment, workload, target, load_kind=space.workload.load,
                              profile=miscalibrated(base, kind))
    with tempfile.TemporaryDirectory() as tmp:
        out = run_search(space, backend=StandIn(), workload=workload, budget=TRIALS, seed=seed,
                         storage=f"sqlite:///{tmp}/s.db", predictor=predictor)
        done = [(t, rec) for t, rec in ((t, TrialRecord.from_trial(t)) for t in out.study.trials)
                if rec.config is not None]
        records = []
        for _, rec in done:
            ev = evaluate_config(SimBackend(), space.deployment, rec.config, workload, target,
                                 load_kind=space.workload.load, precheck=False, early_stop=False)
            records.append({"gpu_s": ev.gpu_s, "rejected": ev.record.rejected_kind is not None,
                            "startup_s": ev.record.run.startup_s})
        return {"space": space_name, "predictor": kind, "seed": seed,
                "smart_s": sum(rec.gpu_s or 0.0 for _, rec in done), "naive_s": naive_gpu_s(records),
                "refused": sum(1 for _, rec in done if rec.rejected_kind is not None),
                "pruned": sum(1 for t, _ in done if t.state.name == "PRUNED"),
                "best": float(out.best.value) if out.best is not None else 0.0}


TRIALS = 40
GPU_SPACES = ("article-004-8xv100-32gb", "article-000-v100-16gb")


def gpu_time_table(cache: dict, seeds: int, workers: int) -> list[dict]:
    """Every (space, predictor, seed) study, cached with the grid (same code fingerprint)."""
    rows = cache.setdefault("gpu_time", {})
    jobs = [(s, k, seed) for s in GPU_SPACES for k in PREDICTORS for seed in range(seeds)]
    todo = [j for j in jobs if "|".join(map(str, j)) not in rows]
    if todo:
        print(f"running {len(todo)} 40-trial studies on the stand-in backend ({workers} workers)...", file=sys.stderr)
        t0 = time.perf_counter()
        with ProcessPoolExecutor(workers) as pool:
            for i, row in enumerate(pool.map(gpu_time_of_study, todo), 1):
                rows["|".join(map(str, (row["space"], row["predictor"], row["seed"])))] = row
                CACHE.write_text(json.dumps(cache))
                print(f"  {i}/{len(todo)} in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return [rows["|".join(map(str, j))] for j in jobs]


def print_gpu_time(rows: list[dict]) -> None:
    print(f"\nsimulated GPU time (startup + replay) of a {TRIALS}-trial tuner search study on a stand-in for real "
          "vLLM, vs the same trials run naively (each launched, every replay to its end, repeats relaunched);\n"
          "predictor: the simulator guiding the search (start load, pruning); 'none' = pre-check + early stop only.\n"
          "best found: the study's best trial as a share of the best any study here found on that space.")
    print(f"{'space':<26} {'predictor':<10} {'GPU h: study / naive (median)':>30}  {'GPU time vs naive (per seed)':<30} "  # noqa: E501
          f"{'median':>7} {'worst':>6} {'pruned':>7} {'best found: median':>19} {'worst':>6}")
    for space in GPU_SPACES:
        known = max(r["best"] for r in rows if r["space"] == space)
        for kind in PREDICTORS:
            mine = [r for r in rows if r["space"] == space and r["predictor"] == kind]
            ratios = [r["smart_s"] / r["naive_s"] for r in mine]
            best = [r["best"] / known for r in mine]
            hours = (f"{statistics.median(r['smart_s'] for r in mine) / 3600:.2f} / "
                     f"{statistics.median(r['naive_s'] for r in mine) / 3600:.2f}")
            print(f"{space:<26} {kind:<10} {hours:>30}  {' '.join(f'{x:.0%}' for x in ratios):<30} "
                  f"{statistics.median(ratios):>7.0%} {max(ratios):>6.0%} "
                  f"{statistics.median(r['pruned'] for r in mine):>7.0f} "
                  f"{statistics.median(best):>19.1%} {min(best):>6.1%}")
    print("  goal: <= 40% of the naive GPU time")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2, help="worker processes filling the grid cache")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--gpu-seeds", type=int, default=3, help="seeds of the GPU-time studies per space and predictor")  # noqa: E501
    args = parser.parse_args()
    space, workload = scenario()
    points = grid_points(space)
    cache = load_cache()
    fill(cache, points, args.jobs)
    table = cache["table"]
    optimum_key = max(table, key=lambda k: (table[k]["feasible"], table[k]["value"]))
    optimum = table[optimum_key]["value"]
    feasible = sum(1 for r in table.values() if r["feasible"])
    print(f"scenario: {space.deployment.label()}, target P95 TTFT {space.workload.target_ttft_s:g} s, "
          f"{REQUESTS} requests of the article-004 mix")
    print(f"grid: {len(points)} configurations ({feasible} feasible); optimum {optimum:,.0f} tok/s at {optimum_key}")

    t0 = time.perf_counter()
    if "auto_tune" not in cache:  # deterministic: run once, keep with the grid
        cache["auto_tune"] = dict(zip(("pick", "own", "gpu_s"), auto_tune(space, workload)))
        CACHE.write_text(json.dumps(cache))
    at_pick, at_own, at_gpu = (cache["auto_tune"][k] for k in ("pick", "own", "gpu_s"))
    at_frac = table[at_pick]["value"] / optimum if at_pick else 0.0
    print(f"auto_tune.sh strategy: picks {at_pick} ({at_own:,.0f} tok/s by its own measure), "
          f"{at_frac:.1%} of the optimum, {at_gpu / 3600:.1f} simulated GPU-hours "
          f"({time.perf_counter() - t0:.0f} s)")

    rows = []
    for seed in range(args.seeds):
        row = {"seed": seed}
        for sampler in ("tpe", "random"):
            picked = run_sampler(space, table, sampler, 40, seed)
            row[f"{sampler}15"] = best_of(table, picked[:15]) / optimum
            row[f"{sampler}40"] = best_of(table, picked) / optimum
        bare = run_sampler(space, table, "tpe", 15, seed, defaults=False)
        row["bare15"] = best_of(table, bare) / optimum
        rows.append(row)
    print("\nfraction of the optimum reached (the auto_tune.sh strategy: "
          f"{at_frac:.1%} every seed)")
    defaults = [space.config_from_params(p) for p in default_trials(space)]
    print("defaults run first by tuner search (vLLM's defaults at each layout): "
          + ", ".join(f"{c.tensor_parallel_size}x{c.replicas} {table[key_of(c)]['value'] / optimum:.1%}" for c in defaults))  # noqa: E501
    print(f"{'seed':>4} {'TPE@15':>8} {'TPE@40':>8} {'random@15':>10} {'random@40':>10} {'TPE@15 w/o defaults':>20}")
    for r in rows:
        print(f"{r['seed']:>4} {r['tpe15']:>8.1%} {r['tpe40']:>8.1%} {r['random15']:>10.1%} {r['random40']:>10.1%}"
              f" {r['bare15']:>20.1%}")
    for col, goal in (("tpe15", 0.95), ("tpe40", 0.98), ("random15", 0.95), ("random40", 0.98), ("bare15", 0.95)):
        vals = [r[col] for r in rows]
        print(f"{col:>9}: median {statistics.median(vals):.1%}, worst {min(vals):.1%}, "
              f">= {goal:.0%} in {sum(v >= goal for v in vals)}/{len(vals)} seeds")
    for n in (15, 40):
        ahead = sum(r[f"tpe{n}"] >= max(r[f"random{n}"], at_frac) for r in rows)
        print(f"TPE@{n} at or ahead of random@{n} and the auto_tune.sh strategy in {ahead}/{len(rows)} seeds")

    # GPU time: real 40-trial studies on a stand-in backend, with and without a predictor
    print_gpu_time(gpu_time_table(cache, args.gpu_seeds, args.jobs))


if __name__ == "__main__":
    main()
