"""One kind of the fleet, planned (:func:`plan_kind`): its truth first, then the simulator's
search for its best flags (``tuner.search`` with the fleet's space and sampler, a small budget,
one engine at the smallest tensor-parallel size that starts), the larger tensor-parallel sizes
tried with those flags (kept when they give more tokens/s a GPU), and the engine's capacity at the
SLOs (``tuner.plan``'s load sweep). What it found is a :class:`~tuner.fleet.record.KindPlan`.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tuner.backends.sim import SimBackend
from tuner.core.errors import ConfigRejected
from tuner.fleet.bands import band_for
from tuner.fleet.inventory import Fleet, Kind
from tuner.fleet.record import KindPlan
from tuner.fleet.truth import CURRENT, ceiling, facts, lines_for, refusals, serves_instead, wheels_run
from tuner.plan import Figures, Sweep, plan_capacity
from tuner.runtime.progress import observer_or_headless
from tuner.search import SearchSettings, evaluate_config, serve_command
from tuner.search import workflow as search_pkg
from tuner.serving.config import Deployment, ServeConfig
from tuner.serving.load import Concurrency
from tuner.serving.slo import SloSet
from tuner.sim.engine import simulate
from tuner.sim.hardware import get_gpu
from tuner.sim.memory import plan_memory
from tuner.sim.model import load_model
from tuner.space import load_space
from tuner.space.param import choice_param
from tuner.study import closest_miss, miss_explanation, trial_config
from tuner.traffic.synth import default_workload

if TYPE_CHECKING:
    from tuner.runtime.progress import Observer
    from tuner.serving.demand import Demand
    from tuner.space import SearchSpace
    from tuner.traffic.workload import Workload


@dataclass(frozen=True, slots=True)
class Traffic:
    """What every kind is planned for: the SLOs (``p95:ttft<=5s`` first), the requests (a
    trace, else the built-in mix), how a conversation is counted, the demand and its headroom,
    knobs pinned on every kind, the seed."""

    slos: tuple[str, ...]
    demand: Demand
    headroom: float = 0.2
    tokens_per_conversation: float | None = None
    trace: Workload | None = None
    requests: int | None = None
    pins: dict[str, Any] = field(default_factory=dict)
    seed: int = 0

    @property
    def target_ttft_s(self) -> float:

        return float(SloSet.of(self.slos).target_ttft_s)  # type: ignore[arg-type]


def deployment_of(fleet: Fleet, kind: Kind, gpus: int = 1) -> Deployment:
    """The deployment of ``gpus`` of the kind serving the fleet's model."""
    return Deployment(model=fleet.model, gpu=kind.gpu, gpu_count=gpus, vllm_version=kind.vllm_version,
                      dtype=kind.dtype or fleet.dtype, quantization=kind.quantization or fleet.quantization,
                      calibration=kind.calibration)


def space_for(fleet: Fleet, pins: dict[str, Any]) -> SearchSpace:
    """The fleet's search space, with the choices of max-model-len the model cannot take dropped
    (vLLM refuses a length above the model's; keeping them spends a small budget on refusals)."""

    space = load_space(fleet.space)
    top = load_model(fleet.model).max_position_embeddings
    params = []
    for p in space.params:
        if p.name == "max_model_len" and p.choices:
            keep = [c for c in p.choices if c <= top] or [top]
            p = choice_param(p.name, keep) if len(keep) > 1 else None
            if p is None:
                pins = {"max_model_len": keep[0], **pins}
        if p is not None:
            params.append(p)
    space = dataclasses.replace(space, params=tuple(params))
    return space.pinned(pins) if pins else space


def lenient(space: SearchSpace, model_max: int) -> ServeConfig:
    """The configuration of the space that needs the least memory: the highest memory share,
    the shortest max-model-len, the fewest sequences, eager where it may (the batched tokens
    at vLLM's default, which V0 keeps at or above max-model-len)."""
    values: dict[str, Any] = {k: v for k, v in space.fixed if k != "max_num_batched_tokens"}
    for p in space.params:
        options = list(p.choices) if p.choices else [p.low, p.high]
        if p.name == "gpu_memory_utilization":
            values[p.name] = max(options)
        elif p.name in ("max_model_len", "max_num_seqs"):
            values[p.name] = min(int(v) for v in options)
        elif p.name == "enforce_eager" and True in options:
            values[p.name] = True
    values["max_model_len"] = min(int(values.get("max_model_len") or model_max), model_max)
    return ServeConfig(**{k: v for k, v in values.items() if k in ServeConfig.__dataclass_fields__})


def _smallest_tp(fleet: Fleet, kind: Kind, cfg: ServeConfig) -> tuple[list[int], int | None, tuple[Any, ...]]:
    """Tensor-parallel sizes to consider (powers of two up to ``max_tp`` dividing the heads),
    the smallest one whose lenient configuration starts, and the refusals at the largest."""

    heads = load_model(fleet.model).num_heads
    tps = [t for t in (1, 2, 4, 8, 16, 32, 64) if t <= kind.max_tp and heads % t == 0]
    for tp in tps:
        try:
            plan_memory(deployment_of(fleet, kind, tp), dataclasses.replace(cfg, tensor_parallel_size=tp))
        except ConfigRejected:
            continue
        return tps, tp, ()
    last = dataclasses.replace(cfg, tensor_parallel_size=tps[-1])
    return tps, None, refusals(deployment_of(fleet, kind, tps[-1]), last, (kind.vllm_version, CURRENT))


def plan_kind(fleet: Fleet, kind: Kind, traffic: Traffic, *, storage: str | None, observer: Observer | None = None,
              budget: int | None = None) -> KindPlan:
    """The kind's truth, band, best flags and layout, and one engine's capacity (see the module)."""

    obs = observer_or_headless(observer)
    clock, timings = time.process_time(), {}
    space = space_for(fleet, traffic.pins)
    base, kind, tps, tp = _truth(fleet, kind, space)
    timings["truth"] = time.process_time() - clock
    if tp is None:
        return dataclasses.replace(base, timings=timings)
    obs.on_phase(f"{kind.label}: searching flags (TP {tp})")
    found = _search(fleet, kind, traffic, space, tp, storage, budget or fleet.budget, obs)
    timings["search"] = time.process_time() - clock - timings["truth"]
    if found["best"] is None:
        return dataclasses.replace(base, reason=found["why"], study=found["study"], trials=found["trials"],
                                   timings=timings)
    cfg, tp, tp_notes = _wider(fleet, kind, traffic, found, tps, obs)
    timings["layout"] = time.process_time() - clock - sum(timings.values())
    obs.on_phase(f"{kind.label}: capacity at the SLOs")
    return _capacity(fleet, kind, traffic, base, cfg, found, base.notes + tp_notes, timings, clock, obs)


def _truth(fleet: Fleet, kind: Kind, space: SearchSpace) -> tuple[KindPlan, Kind, list[int], int | None]:
    """The kind's facts, vLLM lines and band; the tensor-parallel sizes to try and the smallest
    that starts (None, with vLLM's refusals and what the box serves instead, when none does).
    A bfloat16 checkpoint that the kind's vLLM refuses with ``dtype auto`` (before 0.9 below
    compute capability 8.0) is planned in float16, as vLLM's message says, with a note."""

    gpu, model = get_gpu(kind.gpu), load_model(fleet.model)
    loose = lenient(space, model.max_position_embeddings)
    base = KindPlan(label=kind.label, kind=kind.to_dict(), facts=facts(gpu), lines=lines_for(gpu, model.head_dim),
                    band=band_for(kind.gpu, kind.vllm_version, calibration=kind.calibration))
    tps, tp, refused = _smallest_tp(fleet, kind, loose)
    if tp is None and refused and refused[0].check == "dtype" and (kind.dtype or fleet.dtype) == "auto":
        note = (f"vLLM {kind.vllm_version} refuses dtype auto for this bfloat16 checkpoint here (\"{refused[0].message}"
                "\"): planned with --dtype float16")
        kind = dataclasses.replace(kind, dtype="float16")
        base = dataclasses.replace(base, kind=kind.to_dict(), notes=(note,))
        tps, tp, refused = _smallest_tp(fleet, kind, loose)
    if not wheels_run(gpu, kind.vllm_version):
        refused, tp = refusals(deployment_of(fleet, kind, tps[0] if tps else 1), loose, (kind.vllm_version,)), None
    if tp is None:
        cfg = dataclasses.replace(loose, tensor_parallel_size=1)
        base = dataclasses.replace(base, refusals=refused, instead=serves_instead(deployment_of(fleet, kind, 1), cfg),
                                   reason=refused[0].message if refused else "no tensor-parallel size starts")
    return base, kind, tps, tp


def _search(fleet: Fleet, kind: Kind, traffic: Traffic, space: SearchSpace, tp: int, storage: str | None,
            budget: int, obs: Observer) -> dict[str, Any]:

    dep = deployment_of(fleet, kind, tp)
    fields = {f.name: getattr(dep, f.name) for f in dataclasses.fields(dep) if f.name != "gpu_ids"}
    workload = {"slos": list(traffic.slos), "requests": fleet.requests if traffic.trace is None else None}
    pin = {"tensor_parallel_size": tp, "replicas": 1}
    prepared = search_pkg.prepare(space, deployment=fields, workload=workload, requests=traffic.trace, pin=pin)
    out = search_pkg.search(space, deployment=fields, workload=workload, requests=prepared.workload, pin=pin,
                            storage=storage, settings=SearchSettings(budget=budget, confirm=0, seed=traffic.seed),
                            observer=obs)
    why = None
    if out.best is None:
        miss = closest_miss(out.study)
        why = "no configuration met the SLOs" + (f": closest, {miss_explanation(miss)}" if miss is not None else "")
    return {"best": None if out.best is None else trial_config(out.best), "study": out.name, "why": why,
            "trials": out.finished, "workload": prepared.workload,
            "value": None if out.best is None else out.best.value}


def _wider(fleet: Fleet, kind: Kind, traffic: Traffic, found: dict[str, Any], tps: list[int],
           obs: Observer) -> tuple[ServeConfig, int, tuple[str, ...]]:
    """The search's flags at each larger tensor-parallel size while it gives more tokens/s a GPU
    (the search's own goodput measurement on its requests; the search's value at its own size)."""

    best: ServeConfig = found["best"]
    tp0 = best.tensor_parallel_size
    per_gpu = float(found["value"]) / tp0
    notes = [f"TP {tp0}: {found['value']:,.0f} tokens/s at the SLOs, {per_gpu:,.0f} a GPU"]
    for tp in [t for t in tps if t > tp0]:
        trial = dataclasses.replace(best, tensor_parallel_size=tp, replicas=1)
        obs.on_phase(f"{kind.label}: layout TP {tp}")
        ev = evaluate_config(SimBackend(), deployment_of(fleet, kind, tp), trial, found["workload"],
                             _slo_set(traffic), seed=traffic.seed)
        value = ev.value / tp if ev.feasible else 0.0
        notes.append(f"TP {tp}: {ev.value:,.0f} tokens/s at the SLOs, {value:,.0f} a GPU" if ev.feasible
                     else f"TP {tp}: {ev.record.infeasible_reason or 'misses the SLOs'}")
        if value <= per_gpu:
            break
        best, per_gpu = trial, value
    return best, best.tensor_parallel_size, tuple(notes)


def _slo_set(traffic: Traffic) -> Any:

    return SloSet.of(traffic.slos)


def _capacity(fleet: Fleet, kind: Kind, traffic: Traffic, base: KindPlan, cfg: ServeConfig, found: dict[str, Any],
              tp_notes: tuple[str, ...], timings: dict[str, float], clock: float, obs: Observer) -> KindPlan:

    tp = cfg.tensor_parallel_size
    dep = deployment_of(fleet, kind, tp)
    est = plan_capacity(traffic.target_ttft_s, config=cfg, deployment=dep, workload=traffic.trace,
                        sweep=Sweep(seed=traffic.seed, requests=traffic.requests),
                        figures=Figures(tokens_per_conversation=traffic.tokens_per_conversation, demand=traffic.demand,
                                        headroom=traffic.headroom, gpu_hour_cost=kind.gpu_hour_cost),
                        store=False, observer=obs, slos=list(traffic.slos[1:]))
    timings["capacity"] = time.process_time() - clock - sum(timings.values())
    plan = plan_memory(dep, cfg)
    one = simulate(dep, cfg, default_workload(seed=traffic.seed, n=4), Concurrency(1)).summary()
    band = band_for(kind.gpu, kind.vllm_version, calibration=kind.calibration, eager=cfg.enforce_eager,
                    closed=True)
    # what current vLLM would refuse of the same configuration (nothing, on most kinds)
    now = refusals(dep, cfg, (CURRENT,)) if kind.vllm_version != CURRENT else ()
    return dataclasses.replace(
        base, band=band, config=cfg.to_dict(), tp=tp, capacity=est.to_dict(), ceiling=ceiling(plan),
        decode_one_user=1.0 / one["tpot_mean_s"] if one.get("tpot_mean_s") else None, study=found["study"],
        trials=found["trials"], command=serve_command(dep, cfg), timings=timings,
        notes=tuple(plan.notes) + tp_notes, refusals=now)


__all__ = ["Traffic", "deployment_of", "lenient", "plan_kind", "space_for"]
