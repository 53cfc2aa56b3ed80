"""Calibrate the simulator against a real vLLM on a real GPU.

Three steps, each a plain function that notebooks and ``tuner calibrate`` call alike:

1. :func:`design_trials` — a small designed set of server configurations spanning
   ``gpu_memory_utilization``, ``max_num_seqs``, ``max_num_batched_tokens`` and eager vs
   CUDA graphs, with three closed-loop loads each (1 user for the decode floor, a middle
   load, saturation), plus one configuration vLLM must refuse for ``max_model_len``.
2. :func:`measure` — starts each configuration through a backend (the tuner's own
   :class:`~tuner.backends.vllm.VllmBackend`; ``tuner sim-serve`` behind it for a dry run),
   records vLLM's startup lines (KV cache size, model loading, graph memory) or its refusal,
   replays each load with the tuner's replayer and appends one JSON line per observation
   to ``measurements.jsonl``. Resumable: trials already in the file are skipped, so one
   command can be re-run until every trial is done (a GPU lease in slices).
3. :func:`fit` — least squares (``scipy.optimize.least_squares``) of the simulator's
   step-time constants (:class:`tuner.sim.calibration.Calibration`) and the memory
   planner's empirical constants (:data:`tuner.sim.memory.EMPIRICAL`) to the measurements;
   :func:`write_profile` writes the profile YAML (the calibration's own format, plus a
   ``memory`` section, ``match`` keys and the fit's error per metric) beside the raw data.

Everything here needs no GPU except :func:`measure` with a real vLLM.
"""
from __future__ import annotations

import json
import math
import os
import signal
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.progress import Observer, observer_or_headless

import numpy as np

from tuner.config import Deployment, ServeConfig
from tuner.errors import BackendError, ConfigRejected, EnvironmentFault, InputError
from tuner.estimation import Param, fit_map, prior_starts
from tuner.jsonsafe import json_safe
from tuner.load import Concurrency

if TYPE_CHECKING:
    from tuner.search.backend import Backend
    from tuner.traffic.workload import Workload

MEASUREMENTS = "measurements.jsonl"

#: Workload of every load point: prompt and output lengths drawn uniformly (seeded), the
#: same rows for the real server and the simulator. Outputs are forced (ignore_eos).
PROMPT_RANGE = (128, 1024)
OUTPUT_RANGE = (32, 256)
WORKLOAD_SEED = 2026


@dataclass(frozen=True, slots=True)
class Probe:
    """One measured load on a started configuration: a workload reference and the load
    it is offered under, both as JSON (:mod:`tuner.probes`)."""

    workload: dict[str, Any]
    load: dict[str, Any]
    expected_s: float = 20.0    # replay time on the target GPU, to fit a probe into a lease

    @property
    def label(self) -> str:
        from tuner.probes import label

        return label(self.workload, self.load)


@dataclass(frozen=True, slots=True)
class Trial:
    """One configuration of the design and what it is measured at: closed-loop ``loads``
    (users, on :func:`calibration_workload`) or general ``probes`` (any workload, any
    load). Both empty means startup only (the refusal case, or a KV-size-only point).
    ``model`` names the model shape (a preset) when a campaign spans several."""

    name: str
    config: ServeConfig
    loads: tuple[int, ...] = ()
    expect_refusal: bool = False
    purpose: str = ""
    probes: tuple[Probe, ...] = ()
    model: str | None = None
    start_s: float | None = None   # expected start time (default: 105 s with graphs, 70 s eager)

    def __post_init__(self) -> None:
        if not self.name or any(c in self.name for c in " /\\"):
            raise InputError(f"trial name {self.name!r} must be a non-empty word")
        if any(u < 1 for u in self.loads):
            raise InputError(f"trial {self.name}: loads are user counts >= 1, got {self.loads}")


def calibration_workload(n: int, *, seed: int = WORKLOAD_SEED, offset: int = 0) -> Workload:
    """``n`` requests (rows ``offset .. offset+n`` of one seeded sequence) with uniform
    prompt and output lengths (:data:`PROMPT_RANGE`, :data:`OUTPUT_RANGE`); arrivals are
    all 0 (closed-loop loads ignore them). The ``uniform`` shape of :mod:`tuner.probes`."""
    from tuner.probes import synthetic

    return synthetic("uniform", n, seed=seed, offset=offset)


def requests_for(users: int, eager: bool) -> int:
    """Requests offered at ``users`` concurrent users: a few at 1 user (the decode floor is
    steady after one request; eager steps are ~4x slower), 4 per user for middle loads and
    2 per user at saturation (the ramp-down is part of the protocol, simulated alike)."""
    if users == 1:
        return 5 if eager else 10
    return 4 * users if users <= 64 else 2 * users


# ----------------------------------------------------------------------------- design
def _gmu_for_kv(deployment: Deployment, config: ServeConfig, kv_bytes: float) -> float:
    """The gpu_memory_utilization whose planned KV memory is about ``kv_bytes`` (bisection
    on :func:`tuner.sim.memory.plan_memory`, rounded to 0.005)."""
    from tuner.sim.memory import plan_memory

    lo, hi = 0.01, 0.99
    for _ in range(40):
        mid = (lo + hi) / 2
        plan = plan_memory(deployment, config.replace(gpu_memory_utilization=mid), strict=False)
        lo, hi = (mid, hi) if plan.kv_bytes < kv_bytes else (lo, mid)
    return round(round(hi / 0.005) * 0.005, 3)


def design_trials(deployment: Deployment, *, max_model_len: int = 4096) -> list[Trial]:
    """The designed trial set for ``deployment``'s GPU and model, most informative first
    (a lease that ends early still has the anchors). gpu_memory_utilization values that
    depend on the GPU's size (the KV-limited point, the refusal) are solved with the
    memory planner so the design carries over to other GPUs."""
    from tuner.sim.memory import plan_memory
    from tuner.sim.model import load_model

    model = load_model(deployment.model)
    mml = max_model_len
    kv_tok = model.kv_bytes_per_token(1, 2)
    base = ServeConfig(gpu_memory_utilization=0.9, max_model_len=mml)
    long_len = model.max_position_embeddings
    refuse_cfg = ServeConfig(max_model_len=long_len, enforce_eager=True)
    # about 55% of one max-length request's KV: refused, with an estimate near 0.55 x max
    gmu_refuse = _gmu_for_kv(deployment, refuse_cfg, 0.55 * long_len * kv_tok)
    limited = ServeConfig(max_model_len=mml, max_num_seqs=512)
    # ~200k tokens: 512 users x ~700 tokens of context do not fit, so the scheduler preempts
    gmu_limited = _gmu_for_kv(deployment, limited, 200_000 * kv_tok)
    trials = [
        Trial("base", base, (1, 32, 512), purpose="vLLM defaults at gmu 0.9: the anchor"),
        Trial("eager", base.replace(enforce_eager=True), (1, 32, 512),
              purpose="eager vs CUDA graphs decode gap"),
        Trial("refuse", refuse_cfg.replace(gpu_memory_utilization=gmu_refuse), (), expect_refusal=True,
              purpose="max-model-len refusal and vLLM's estimated maximum model length"),
        Trial("seqs64", base.replace(max_num_seqs=64, max_num_batched_tokens=2048), (1, 16, 128),
              purpose="small batch cap, 2048-token chunks"),
        Trial("kvlimited", limited.replace(gpu_memory_utilization=gmu_limited), (1, 64, 512),
              purpose="KV-limited: preemption at saturation"),
        Trial("seqs16", base.replace(max_num_seqs=16), (1, 8, 32), purpose="tiny batch cap"),
        Trial("mbt1024", ServeConfig(gpu_memory_utilization=0.5, max_model_len=mml, max_num_seqs=256,
                                     max_num_batched_tokens=1024), (1, 64, 384),
              purpose="gmu 0.5, small prefill chunks"),
        Trial("eager128", ServeConfig(gpu_memory_utilization=0.7, max_model_len=mml, max_num_seqs=128,
                                      max_num_batched_tokens=512, enforce_eager=True), (1, 32, 192),
              purpose="eager with 512-token chunks"),
        Trial("mml8k", ServeConfig(gpu_memory_utilization=0.3, max_model_len=2 * mml, max_num_seqs=512,
                                   max_num_batched_tokens=4096), (1, 128, 512),
              purpose="gmu 0.3, longer max-model-len"),
        Trial("bs32", ServeConfig(gpu_memory_utilization=0.6, max_model_len=4 * mml, block_size=32), (),
              purpose="startup only: block size 32, max-model-len 16k"),
    ]
    # keep only what the model allows (a short-context model skips the long lengths)
    out = []
    for t in trials:
        if (t.config.max_model_len or 0) > long_len:
            continue
        if not t.expect_refusal:
            try:
                plan_memory(deployment, t.config)
            except ConfigRejected:
                continue
        out.append(t)
    return out


# ----------------------------------------------------------------------------- measure
def read_measurements(path: str | Path) -> list[dict[str, Any]]:
    """The JSON lines of a measurements file (a missing file is empty); a torn last line
    (a run killed mid-write) is skipped."""
    p = Path(path)
    if p.is_dir():
        p = p / MEASUREMENTS
    if not p.exists():
        return []
    rows = []
    for k, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except ValueError as err:
            if k == len(p.read_text().splitlines()):
                continue
            raise InputError(f"bad JSON line: {err}", path=p, line=k) from err
    return rows


def _done_trials(rows: list[dict[str, Any]]) -> set[str]:
    return {r["trial"] for r in rows if r.get("kind") == "trial_end"}


def _missing_probes(trial: Trial, rows: list[dict[str, Any]]) -> list[Probe]:
    """The trial's probes without a complete row yet (any earlier start of it counts)."""
    import json

    have = {(json.dumps(r.get("workload"), sort_keys=True), json.dumps(r.get("load"), sort_keys=True))
            for r in rows if r.get("kind") == "load" and r.get("trial") == trial.name and r.get("ok")
            and not r.get("stopped_early") and r.get("load") is not None}
    return [p for p in trial.probes
            if (json.dumps(p.workload, sort_keys=True), json.dumps(p.load, sort_keys=True)) not in have]


def _start_s(trial: Trial) -> float:
    return trial.start_s if trial.start_s is not None else (70.0 if trial.config.enforce_eager else 105.0)


def _estimate_trial_s(trial: Trial) -> float:
    """Seconds a trial takes on an H200-class GPU (startup 50-105 s with graphs, less
    eager; the loads about 10-20 s each): used to decide whether it fits the time left."""
    start = 70.0 if trial.config.enforce_eager else 105.0
    if trial.expect_refusal:
        return 60.0
    per_load = 25.0 if trial.config.enforce_eager else 15.0
    return start + per_load * (len(trial.loads) + len(trial.probes)) + 10.0


def measure(
    backend: Backend,
    deployment: Deployment,
    trials: Sequence[Trial],
    out_dir: str | Path,
    *,
    budget_s: float | None = None,
    observer: Observer | None = None,
    meta: dict[str, Any] | None = None,
    deployment_for: Callable[[Trial], Deployment] | None = None,
) -> list[dict[str, Any]]:
    """Run the trials not yet in ``out_dir/measurements.jsonl`` and append their rows.

    Rows (one JSON object per line, flushed as they come): ``startup`` (the config, the
    facts parsed from vLLM's startup log, or the refusal's kind, message and estimated
    maximum model length), ``load`` (users, requests, the run's summary, per-request
    prompt/output tokens, TTFT and E2E), ``trial_end``. With ``budget_s``, a trial is started
    only if its estimated time fits what is left, and a load run is cut at the budget
    (the rows then say ``stopped_early``). ``deployment_for`` gives the deployment of a
    trial whose ``model`` differs from ``deployment``'s (a campaign over several model
    shapes). Probe rows carry the workload reference and the load (:mod:`tuner.probes`);
    for rows of a shared trace the per-request lengths are not written (the reference
    rebuilds them from the trace). Returns every row of the file."""
    log = observer_or_headless(observer).on_phase
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / MEASUREMENTS
    rows = read_measurements(path)
    done = _done_trials(rows)
    t0 = time.monotonic()
    deadline = t0 + budget_s if budget_s is not None else math.inf

    def emit(row: dict[str, Any]) -> None:
        row = json_safe({"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **row}, digits=7)
        with open(path, "a") as fh:
            fh.write(json.dumps(row, separators=(",", ":")) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        rows.append(row)

    if meta and not any(r.get("kind") == "meta" for r in rows):
        emit({"kind": "meta", **meta})

    def over_budget(control: Any) -> bool:
        return time.monotonic() > deadline

    for trial in trials:
        if trial.name in done:
            continue
        todo = _missing_probes(trial, rows)
        if trial.probes and not todo:
            emit({"kind": "trial_end", "trial": trial.name})
            continue
        left = deadline - time.monotonic()
        # a probe trial needs its start and its first missing probe; the rest resume next time
        need = _estimate_trial_s(trial) if not trial.probes else _start_s(trial) + todo[0].expected_s
        if need > left:
            log(f"calibrate: {trial.name} needs ~{need:.0f} s, {left:.0f} s left; stopping here")
            break
        cfg = trial.config
        dep = deployment_for(trial) if deployment_for is not None else deployment
        log(f"calibrate: {trial.name}: starting {_flags(cfg)}" + (f" ({trial.model})" if trial.model else ""))
        t_start = time.monotonic()
        try:
            instance = backend.start(dep, cfg)
        except ConfigRejected as err:
            emit({"kind": "startup", "trial": trial.name, "config": cfg.to_dict(), "ok": False,
                  "expect_refusal": trial.expect_refusal, "rejected_kind": err.kind, "message": err.message,
                  "estimated_max_model_len": err.estimated_max_model_len, "model": trial.model,
                  "wall_s": time.monotonic() - t_start})
            log(f"calibrate: {trial.name}: refused ({err.kind}): {err.message[:300]}")
            if not trial.expect_refusal and err.kind in ("crash", "timeout", "bad_flag"):
                # the server itself is broken (not this configuration): stop and show why
                _log_tail(err.log_path, log)
                log("calibrate: stopping: an unexpected start failure; fix the setup and run again")
                break
            emit({"kind": "trial_end", "trial": trial.name})
            continue
        except (BackendError, EnvironmentFault) as err:
            kind = "environment" if isinstance(err, EnvironmentFault) else "backend_error"
            emit({"kind": "startup", "trial": trial.name, "config": cfg.to_dict(), "ok": False,
                  "rejected_kind": kind, "message": str(err), "model": trial.model,
                  "wall_s": time.monotonic() - t_start})
            log(f"calibrate: {trial.name}: {kind.replace('_', ' ')}: {err}; stopping")
            break
        with instance:
            info = {k: v for k, v in instance.info.items() if k not in ("argv", "endpoints")}
            if "available_kv_gib" not in info and info.get("log_lines"):
                # the simulator hands its startup lines over instead of a log file
                from tuner.backends.vllm_args import parse_startup

                info = {**parse_startup("\n".join(info["log_lines"])), **info}
            emit({"kind": "startup", "trial": trial.name, "config": cfg.to_dict(), "ok": True,
                  "expect_refusal": trial.expect_refusal, "facts": info, "model": trial.model,
                  "argv": instance.info.get("argv"), "wall_s": time.monotonic() - t_start})
            log(f"calibrate: {trial.name}: KV cache {info.get('kv_cache_tokens')} tokens, "
                f"started in {time.monotonic() - t_start:.0f} s")
            offset = 0
            for users in trial.loads:
                n = requests_for(users, cfg.enforce_eager)
                work = calibration_workload(n, offset=offset)
                offset += n
                # each run sends fresh prompts (the Instance contract, tuner.search.backend): no
                # prefix-cache hits across runs
                t_run = time.monotonic()
                try:
                    res = instance.run(work, Concurrency(users), stop=over_budget)
                except BackendError as err:
                    emit({"kind": "load", "trial": trial.name, "users": users, "requests": n, "ok": False,
                          "message": str(err)})
                    log(f"calibrate: {trial.name} c={users}: {err}")
                    break
                summ = res.summary()
                emit({"kind": "load", "trial": trial.name, "config": cfg.to_dict(), "users": users,
                      "requests": n, "offset": offset - n, "ok": True, "stopped_early": res.stopped_early,
                      "wall_s": time.monotonic() - t_run, "summary": summ, "server": res.server,
                      "prompt_tokens": res.prompt_tokens, "output_tokens": res.output_tokens,
                      "send_s": res.send_s, "ttft_s": res.ttft_s, "e2e_s": res.e2e_s,
                      "error": res.error})
                log(f"calibrate: {trial.name} c={users}: {summ['output_tokens_per_s']:.0f} out tok/s, "
                    f"P95 TTFT {summ['ttft_p95_s'] * 1e3:.1f} ms, TPOT {summ['tpot_mean_s'] * 1e3:.2f} ms"
                    f" ({n} requests, {time.monotonic() - t_run:.1f} s)")
                if res.stopped_early:
                    break
            cut = False
            for probe in todo:
                if probe.expected_s > deadline - time.monotonic():
                    log(f"calibrate: {trial.name}: {probe.label} needs ~{probe.expected_s:.0f} s; resuming next time")
                    cut = True
                    break
                if not _run_probe(instance, backend, trial, probe, emit, log, over_budget):
                    cut = True
                    break
            if cut:
                break
        if time.monotonic() <= deadline:
            emit({"kind": "trial_end", "trial": trial.name})
    return rows


def _run_probe(instance: Any, backend: Any, trial: Trial, probe: Probe, emit: Callable[[dict[str, Any]], None],
               log: Callable[[str], None], stop: Callable[[Any], bool]) -> bool:
    """One probe's replay and its row; False when the trial should stop (an error or the budget)."""
    from tuner.probes import build, load_from

    work = build(probe.workload)
    load = load_from(probe.load)
    t_run = time.monotonic()
    try:
        res = instance.run(work, load, stop=stop)
    except BackendError as err:
        emit({"kind": "load", "trial": trial.name, "workload": probe.workload, "load": probe.load, "ok": False,
              "message": str(err), "model": trial.model})
        log(f"calibrate: {trial.name} {probe.label}: {err}")
        return False
    summ = res.summary()
    row: dict[str, Any] = {
        "kind": "load", "trial": trial.name, "config": trial.config.to_dict(), "model": trial.model,
        "workload": probe.workload, "load": probe.load, "requests": len(work), "ok": True,
        "stopped_early": res.stopped_early, "wall_s": time.monotonic() - t_run, "summary": summ,
        "server": res.server, "send_s": res.send_s, "ttft_s": res.ttft_s, "e2e_s": res.e2e_s, "error": res.error}
    if probe.workload.get("kind") != "trace":  # a trace's lengths stay in the trace
        row.update(prompt_tokens=res.prompt_tokens, output_tokens=res.output_tokens)
    emit(row)
    log(f"calibrate: {trial.name} {probe.label}: {summ['output_tokens_per_s']:.0f} out tok/s, "
        f"P95 TTFT {summ['ttft_p95_s'] * 1e3:.1f} ms, TPOT {summ['tpot_mean_s'] * 1e3:.2f} ms "
        f"({len(work)} requests, {time.monotonic() - t_run:.1f} s)")
    return not res.stopped_early


def _log_tail(path: str | None, log: Callable[[str], None], lines: int = 25) -> None:
    if not path:
        return
    try:
        tail = Path(path).read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return
    for line in tail:
        log(f"  | {line}")


def _flags(cfg: ServeConfig) -> str:
    parts = [f"{k}={v}" for k, v in cfg.to_dict().items()
             if v is not None and k not in ("tensor_parallel_size", "replicas", "kv_cache_dtype",
                                            "enable_prefix_caching")
             and not (k == "enforce_eager" and not v)]
    return " ".join(parts)


def install_sigterm_handler() -> None:
    """Turn SIGTERM into KeyboardInterrupt so ``with instance:`` stops the servers when a
    driver is killed by ``timeout`` (vLLM runs in its own session and would outlive us)."""
    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, handler)


# ----------------------------------------------------------------------------- analysis
#: The metrics fitted and checked per load point (RunResult.summary() keys).
METRICS = ("output_tokens_per_s", "ttft_p95_s", "tpot_mean_s")
#: Also compared (reported, not fitted): prompt + output tokens/s and mean TTFT.
REPORTED = METRICS + ("tokens_per_s", "ttft_mean_s")


@dataclass(frozen=True)
class LoadPoint:
    """One measured load: a trial's config at ``users`` closed-loop users over rows
    ``offset .. offset+requests`` of :func:`calibration_workload`, or (a probe) the
    workload reference and load of :mod:`tuner.probes`; ``model`` when not the fit's."""

    trial: str
    config: ServeConfig
    users: int
    requests: int
    offset: int
    measured: dict[str, float]
    workload: dict[str, Any] | None = None
    load: dict[str, Any] | None = None
    model: str | None = None

    @property
    def key(self) -> tuple[Any, ...]:
        """What identifies the point across runs (a replicate matches on it)."""
        import json

        if self.load is None:
            return (self.trial, self.users)
        return (self.trial, json.dumps(self.workload, sort_keys=True), json.dumps(self.load, sort_keys=True))

    @property
    def what(self) -> tuple[Any, ...]:
        """The same load on the same configuration and model, whatever the trial's name:
        a fresh start of a trial under another name replicates it."""
        import json

        return (json.dumps(self.config.to_dict(), sort_keys=True), self.model,
                json.dumps(self.workload, sort_keys=True), json.dumps(self.load, sort_keys=True), self.users)

    @property
    def label(self) -> str:
        if self.load is None:
            return f"uniform x{self.requests} @ {self.users} users"
        from tuner.probes import label

        return label(self.workload or {}, self.load)


@dataclass(frozen=True)
class Startup:
    """One measured start: vLLM's KV cache size, or its refusal."""

    trial: str
    config: ServeConfig
    ok: bool
    kv_cache_tokens: int | None = None
    available_kv_gib: float | None = None
    model_load_gib: float | None = None
    graph_capture_gib: float | None = None
    rejected_kind: str | None = None
    message: str = ""
    estimated_max_model_len: int | None = None
    model: str | None = None
    peak_activation_gib: float | None = None
    num_gpu_blocks: int | None = None       # the pool itself (/metrics cache_config_info)
    non_torch_gib: float | None = None      # "... GiB for non-torch memory"


def _latest_by_trial(rows: Iterable[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Rows of each trial from its last ``startup`` row on (a trial restarted after an
    interrupted call keeps only its complete last attempt)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        t = r.get("trial")
        if t is None:
            continue
        if r.get("kind") == "startup":
            out[t] = [r]
        elif t in out:
            out[t].append(r)
    return out


def startups(rows: Iterable[dict[str, Any]]) -> list[Startup]:
    out = []
    for trial, rs in _latest_by_trial(rows).items():
        r = rs[0]
        facts = r.get("facts") or {}
        out.append(Startup(
            trial=trial, config=ServeConfig.from_dict(r["config"]), ok=bool(r["ok"]),
            kv_cache_tokens=facts.get("kv_cache_tokens"), available_kv_gib=facts.get("available_kv_gib"),
            model_load_gib=facts.get("model_load_gib"), graph_capture_gib=facts.get("graph_capture_gib"),
            rejected_kind=r.get("rejected_kind"), message=r.get("message") or "",
            estimated_max_model_len=r.get("estimated_max_model_len"), model=r.get("model"),
            peak_activation_gib=facts.get("peak_activation_gib"), num_gpu_blocks=facts.get("num_gpu_blocks"),
            non_torch_gib=facts.get("non_torch_gib")))
    return out


def load_points(rows: Iterable[dict[str, Any]]) -> list[LoadPoint]:
    """Complete load rows: closed-loop ones of each trial's last start; probe rows of any
    start of the trial (a campaign resumes a trial's probes across leases), the last row
    of each probe winning."""
    rows = list(rows)
    out = []
    probes: dict[tuple[Any, ...], LoadPoint] = {}
    for r in rows:
        if r.get("kind") == "load" and r.get("load") is not None and r.get("ok") and not r.get("stopped_early"):
            pt = _point(r["trial"], r)
            probes[pt.key] = pt
    for trial, rs in _latest_by_trial(rows).items():
        for r in rs:
            if r.get("kind") != "load" or not r.get("ok") or r.get("stopped_early") or r.get("load") is not None:
                continue
            out.append(_point(trial, r))
    return out + list(probes.values())


def _point(trial: str, r: dict[str, Any]) -> LoadPoint:
    load = r.get("load")
    users = int(r["users"]) if "users" in r else int((load or {}).get("users", 0))
    return LoadPoint(trial=trial, config=ServeConfig.from_dict(r["config"]), users=users,
                     requests=int(r["requests"]), offset=int(r.get("offset", 0)),
                     measured={k: float(r["summary"][k]) for k in REPORTED if k in r["summary"]},
                     workload=r.get("workload"), load=load, model=r.get("model"))


def load_rows(rows: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each complete load row by its point's name (:func:`point_name`): the per-request
    ``send_s``, ``ttft_s`` and ``e2e_s`` behind a :class:`LoadPoint`'s summary."""
    return {point_name(_point(r["trial"], r)): r for r in rows
            if r.get("kind") == "load" and r.get("ok") and not r.get("stopped_early")}


def simulate_point(point: LoadPoint, deployment: Deployment, calib: Any = None) -> Any:
    """The simulator's run (a :class:`~tuner.result.RunResult`) of the same workload rows and
    load as ``point``, on the point's own model shape when it names one."""
    from tuner.sim.engine import simulate

    if point.load is None:
        work, load = calibration_workload(point.requests, offset=point.offset), Concurrency(point.users)
    else:
        from tuner.probes import load_from

        work, load = _built(point.workload), load_from(point.load)
    return simulate(_dep_model(deployment, point.model), point.config, work, load, profile=calib)


def predict_load(point: LoadPoint, deployment: Deployment, calib: Any = None) -> dict[str, float]:
    """The simulator's summary for the same workload rows and load as ``point``."""
    return simulate_point(point, deployment, calib).summary()


def _dep_model(deployment: Deployment, model: str | None) -> Deployment:
    import dataclasses

    return deployment if not model or model == deployment.model else dataclasses.replace(deployment, model=model)


_BUILT: dict[str, Any] = {}


def _built(ref: dict[str, Any] | None) -> Any:
    """:func:`tuner.probes.build`, once per reference (a fit simulates each point often)."""
    import json

    from tuner.probes import build

    key = json.dumps(ref, sort_keys=True)
    if key not in _BUILT:
        _BUILT[key] = build(ref or {})
    return _BUILT[key]


def predict_startup(config: ServeConfig, deployment: Deployment) -> dict[str, Any]:
    """The memory planner's answer: ``kv_cache_tokens`` or the refusal's kind and
    ``estimated_max_model_len``."""
    from tuner.sim.memory import plan_memory

    try:
        plan = plan_memory(deployment, config)
    except ConfigRejected as err:
        return {"ok": False, "kind": err.kind, "estimated_max_model_len": err.estimated_max_model_len,
                "message": err.message}
    return {"ok": True, "kv_cache_tokens": plan.kv_cache_tokens, "available_kv_gib": plan.kv_bytes / 2**30,
            "num_gpu_blocks": plan.num_gpu_blocks}


def mape(pred: Sequence[float], meas: Sequence[float]) -> float:
    """Mean absolute percentage error, in percent."""
    p, m = np.asarray(pred, dtype=float), np.asarray(meas, dtype=float)
    return float(np.mean(np.abs(p - m) / np.abs(m)) * 100.0)


def compare_loads(points: Sequence[LoadPoint], deployment: Deployment, calib: Any = None) -> list[dict[str, Any]]:
    """Per point: measured and predicted value of each metric."""
    out = []
    for pt in points:
        pred = predict_load(pt, deployment, calib)
        out.append({"trial": pt.trial, "name": point_name(pt), "model": pt.model or deployment.model,
                    "users": pt.users, "requests": pt.requests,
                    "workload": (pt.workload or {}).get("kind", "uniform"), "load": (pt.load or {}).get("kind",
                                                                                                    "concurrency"),
                    **{f"{k}_measured": pt.measured[k] for k in REPORTED if k in pt.measured},
                    **{f"{k}_predicted": float(pred[k]) for k in REPORTED if k in pt.measured}})
    return out


def summarize(table: Sequence[dict[str, Any]]) -> dict[str, float]:
    """MAPE per metric and the Spearman rank correlation of saturation throughput across
    configurations (each trial's highest load) over a :func:`compare_loads` table."""
    from scipy.stats import spearmanr

    out: dict[str, float] = {}
    for k in METRICS:
        out[f"{k}_mape"] = mape([r[f"{k}_predicted"] for r in table], [r[f"{k}_measured"] for r in table])
    top: dict[str, dict[str, Any]] = {}
    for r in table:
        if r["trial"] not in top or r["users"] > top[r["trial"]]["users"]:
            top[r["trial"]] = r
    thr = "output_tokens_per_s"
    if len(top) >= 3:
        rho = spearmanr([r[f"{thr}_measured"] for r in top.values()], [r[f"{thr}_predicted"] for r in top.values()])
        out["throughput_spearman_saturation"] = float(rho.statistic)
    if len(table) >= 3:
        rho = spearmanr([r[f"{thr}_measured"] for r in table], [r[f"{thr}_predicted"] for r in table])
        out["throughput_spearman_all"] = float(rho.statistic)
    return out


# ----------------------------------------------------------------------------- fit: memory
GiB = 1 << 30


def fit_memory(points: Sequence[Startup], deployment: Deployment, *, graph_fraction: float | None = None,
               ) -> tuple[dict[str, float], dict[str, Any]]:
    """Least squares of the memory planner's empirical constants to measured starts (each
    on its own model shape: ``Startup.model``, else the deployment's).

    vLLM's ``available KV = ceil(total x gmu) - weights - peak activation - non-torch``
    (``v1/worker/gpu_worker.py``). "Model loading took X GiB" gives each start's weights
    (the median overhead over the shapes' bytes is kept for the planner); the rest,
    ``budget - weights - available``, is fitted as ``fixed + a x tokens x hidden + b x
    max_num_seqs x vocab + m x tokens x experts_per_token x hidden (MoE) + g x
    graph_estimate`` (``tokens``: :func:`tuner.sim.memory.activation_tokens`) with every coefficient >= 0 and ``g`` in [0, 1]
    (the share of the planner's CUDA-graph estimate that really comes out of the KV
    budget). Where vLLM also logged the peak activation ("Actual usage is ... GiB for peak
    activation"), that value is a second residual of the start. ``graph_fraction`` fixes
    ``g`` instead of fitting it (what the starts show directly: an eager and a graph start
    of one configuration with the same KV cache mean 0)."""
    from scipy.optimize import least_squares

    from tuner.sim.hardware import get_gpu
    from tuner.sim.memory import EMPIRICAL, _cudagraph_sizes, activation_tokens, default_batch_limits
    from tuner.versions import parse_version
    from tuner.sim.model import load_model

    gpu = get_gpu(deployment.gpu)
    version = parse_version(deployment.vllm_version)
    ok = [s for s in points if s.ok and s.available_kv_gib is not None]
    if not ok:
        raise InputError("no successful start with 'Available KV cache memory' to fit the memory planner to")
    # vLLM logs its non-torch memory ("... GiB for non-torch memory"): the median of the
    # starts that logged it, else the planner's estimate
    logged = [s.non_torch_gib for s in ok if s.non_torch_gib is not None]
    non_torch = float(np.median(logged)) * GiB if logged else float(EMPIRICAL["non_torch_bytes"])
    eager_seen = any(s.config.enforce_eager for s in ok)
    overheads, rows, y, act_rows, act_y = [], [], [], [], []
    for s in ok:
        model = load_model(s.model or deployment.model)
        shapes = model.weight_bytes_per_rank(None, 1)
        weights = s.model_load_gib * GiB if s.model_load_gib else shapes
        if s.model_load_gib:
            overheads.append(weights - shapes)
        c = s.config
        mml = c.max_model_len or model.max_position_embeddings
        d_seqs, d_tokens = default_batch_limits(gpu, version, mml)
        seqs = c.max_num_seqs or d_seqs
        mbt = c.max_num_batched_tokens or (min(d_tokens, seqs * mml) if c.max_num_seqs else d_tokens)
        graphs = 0.0 if c.enforce_eager else (EMPIRICAL["cudagraph_bytes_per_layer_per_size"]
                                              * model.num_layers * _cudagraph_sizes(seqs))
        tokens = activation_tokens(mbt, d_tokens, c.enforce_eager)
        moe = tokens * model.num_experts_per_tok * model.hidden_size if model.is_moe else 0.0
        # compiled and eager profile runs peak apart (tuner.sim.memory._activation_slope)
        eager = bool(c.enforce_eager and eager_seen)
        act = [1.0, 0.0 if eager else tokens * model.hidden_size, seqs * model.vocab_size, moe,
               tokens * model.hidden_size if eager else 0.0]
        budget = math.ceil(gpu.memory_bytes * (c.gpu_memory_utilization or 0.92))
        rows.append([*act, graphs])
        y.append(budget - weights - non_torch - s.available_kv_gib * GiB)
        if s.peak_activation_gib is not None:
            act_rows.append([*act, 0.0])
            act_y.append(s.peak_activation_gib * GiB)
    a = np.array(rows + act_rows)
    target = np.array(y + act_y)
    # columns: fixed, compiled per token x hidden, per logit, MoE, eager per token x hidden, graphs
    scale = np.array([GiB, 1.0, 1.0, 1.0, 1.0, 1.0])

    def resid(x: np.ndarray) -> np.ndarray:
        return (a @ (x * scale) - target) / GiB

    x0 = np.array([0.5, EMPIRICAL["activation_bytes_per_token_per_hidden"], EMPIRICAL["sampler_bytes_per_logit"],
                   1.0, EMPIRICAL["activation_bytes_per_token_per_hidden"], 0.5])
    lo, hi = [0, 0, 0, 0, 0, 0], [20, 64, 16, 256, 64, 1]
    if graph_fraction is not None:
        x0[5] = graph_fraction
        lo[5], hi[5] = graph_fraction, graph_fraction + 1e-12
    sol = least_squares(resid, x0, bounds=(lo, hi))
    fixed, per_tok, per_logit, per_moe, per_tok_eager, g = sol.x
    weight_overhead = max(0.0, float(np.median(overheads))) if overheads else 0.0
    memory = {
        "weight_overhead_bytes": round(weight_overhead),
        "activation_fixed_bytes": round(fixed * GiB),
        "activation_bytes_per_token_per_hidden": round(float(per_tok), 4),
        "sampler_bytes_per_logit": round(float(per_logit), 4),
        "moe_activation_bytes_per_token_per_hidden": round(float(per_moe), 4),
        "cudagraph_kv_fraction": round(float(g), 3),
        "non_torch_bytes": round(non_torch),
    }
    if eager_seen:
        memory["eager_activation_bytes_per_token_per_hidden"] = round(float(per_tok_eager), 4)
    kv = sol.fun[:len(rows)]
    info = {"starts": len(ok), "residual_gib_rms": float(np.sqrt(np.mean(kv ** 2))),
            "residual_gib_max": float(np.max(np.abs(kv))), "peak_activations": len(act_rows)}
    return memory, info


# ----------------------------------------------------------------------------- fit: step time
#: Step-time constants the fit moves: (name, scale of x, lower, upper, prior sd in units of
#: x). The prior's centre is the GPU class table's value (``tuner/data/calibration/<class>.yaml``,
#: whose sources say where each comes from); its sd says how far we would believe the data
#: moves it: HBM efficiency of decode GEMVs 0.7-0.9 of peak, GEMM efficiency 0.45-0.75, a
#: step overhead of a fraction of a millisecond to about 1.5 ms, a few microseconds per
#: request, eager launches within a factor of two of the class table, API latency up to
#: tens of milliseconds.
STEP_PARAMS = (
    ("hbm_efficiency", 1.0, 0.3, 1.0, 0.10),
    ("flops_efficiency", 1.0, 0.15, 1.0, 0.15),
    ("step_overhead_s", 1e-3, 0.0, 5.0, 0.5),
    ("per_seq_overhead_s", 1e-6, 0.0, 60.0, 4.0),
    ("launch_eager", 1e-6, 0.0, 2000.0, 300.0),
    ("launch_piecewise", 1e-6, 0.0, 500.0, 60.0),
    ("request_latency_s", 1e-3, 0.0, 50.0, 20.0),
    ("frontend_per_token_s", 1e-6, 0.0, 500.0, 40.0),
    ("frontend_per_request_s", 1e-3, 0.0, 20.0, 2.0),
    ("moe_flops_efficiency", 1.0, 0.05, 1.0, 0.3),
)
#: Run-to-run noise of each metric (sd of its log) when no replicate runs say otherwise:
#: the H200 replicate (``h200-vllm-0.26.0/replicate.jsonl``) gave 0.08-0.10.
DEFAULT_NOISE = {"output_tokens_per_s": 0.08, "ttft_p95_s": 0.08, "tpot_mean_s": 0.08}
#: Smallest noise a metric is credited with (two runs that happen to agree prove little).
MIN_NOISE = 0.02
#: Relative finite-difference step of the Jacobian: the simulator is a discrete-event
#: model, so its outputs move in small jumps; 3 % steps see the trend, not the jumps.
DIFF_STEP = 0.03


def _with_params(base: Any, x: np.ndarray) -> Any:
    vals = {name: float(v * scale) for (name, scale, *_), v in zip(STEP_PARAMS, x)}
    launch = dict(base.launch_per_layer_s)
    ratio = launch["compiled"] / launch["piecewise"] if launch.get("piecewise") else 2.0
    launch["eager"] = vals.pop("launch_eager")
    launch["piecewise"] = vals.pop("launch_piecewise")
    launch["compiled"] = launch["piecewise"] * ratio
    return base.replace(launch_per_layer_s=launch, **vals)


def _params_of(calib: Any) -> np.ndarray:
    vals = {"hbm_efficiency": calib.hbm_efficiency, "flops_efficiency": calib.flops_efficiency,
            "step_overhead_s": calib.step_overhead_s, "per_seq_overhead_s": calib.per_seq_overhead_s,
            "launch_eager": calib.launch_per_layer_s["eager"],
            "launch_piecewise": calib.launch_per_layer_s["piecewise"],
            "request_latency_s": getattr(calib, "request_latency_s", 0.0),
            "frontend_per_token_s": getattr(calib, "frontend_per_token_s", 0.0),
            "frontend_per_request_s": getattr(calib, "frontend_per_request_s", 0.0),
            "moe_flops_efficiency": getattr(calib, "moe_flops_efficiency", 1.0)}
    return np.array([min(max(vals[n] / s, lo), hi) for n, s, lo, hi, _ in STEP_PARAMS])


def step_params(prior: Any) -> list[Param]:
    """The fitted constants as :class:`tuner.estimation.Param`, their priors centred on
    ``prior`` (a :class:`~tuner.sim.calibration.Calibration`, normally the class table)."""
    return [Param(name, scale, lo, hi, float(x), sd)
            for (name, scale, lo, hi, sd), x in zip(STEP_PARAMS, _params_of(prior))]


def replicate_pairs(rows: Iterable[dict[str, Any]], exclude: Iterable[str] = ()) -> list[tuple[LoadPoint, LoadPoint]]:
    """Load points measured twice on separate starts of the same configuration (a trial
    started again under another name, e.g. ``q7-base`` and ``q7-base-again``). A point named
    in ``exclude`` (``excluded_points.txt``) pairs with nothing: campaign 2's MoE probes that
    JIT-compiled the fused-MoE kernel differ from their warm campaign-4 twins by the compile,
    not by the start."""
    skip = set(exclude)
    by: dict[tuple[Any, ...], list[LoadPoint]] = {}
    for p in load_points(list(rows)):
        if point_name(p) not in skip:
            by.setdefault(p.what, []).append(p)
    return [(ps[0], q) for ps in by.values() if len({x.trial for x in ps}) > 1 for q in ps[1:]
            if q.trial != ps[0].trial]


def measurement_noise(first: Iterable[dict[str, Any]], again: Iterable[dict[str, Any]] = (),
                      *, pairs: Sequence[tuple[LoadPoint, LoadPoint]] = ()) -> dict[str, float]:
    """Run-to-run noise per metric (sd of the log of one run) from load points measured
    twice: ``first`` and ``again`` are measurement rows (pairs match by trial and load),
    ``pairs`` more pairs (:func:`replicate_pairs`). The log ratio of two runs has twice
    one run's variance."""
    seen = {p.key: p for p in load_points(list(first))}
    out = dict(DEFAULT_NOISE)
    pairs = [(seen[p.key], p) for p in load_points(list(again)) if p.key in seen] + list(pairs)
    if len(pairs) >= 3:
        for k in METRICS:
            d = np.array([math.log(b.measured[k] / a.measured[k]) for a, b in pairs])
            out[k] = max(MIN_NOISE, float(np.sqrt(np.mean(d**2) / 2)))
    return out


def fit_step_time(points: Sequence[LoadPoint], deployment: Deployment, base: Any, *,
                  noise: dict[str, float] | None = None, starts: int = 1, seed: int = 0,
                  max_nfev: int | None = None, log: Callable[[str], None] | None = None,
                  start: Any | None = None) -> tuple[Any, dict[str, Any]]:
    """MAP fit (:func:`tuner.estimation.fit_map`) of the step-time constants to the
    measured load points, run to convergence: residuals are the log ratios
    predicted/measured of :data:`METRICS`, each over its run-to-run ``noise``; priors are
    centred on ``base``. ``starts`` > 1 also starts from draws of the priors (the info
    says whether they found the same optimum); ``start`` (a calibration, e.g. a shipped
    profile's) replaces those starts by one at its constants, the priors unchanged: a fit
    that moves away from it says the constants are not this data's optimum. Returns the fitted calibration and an
    info dict whose ``estimates`` give each constant's value, sd, 95 % interval and
    whether the data determined it."""
    sigma = {**DEFAULT_NOISE, **(noise or {})}
    calls = [0]

    def resid(x: np.ndarray) -> np.ndarray:
        calib = _with_params(base, x)
        out = []
        for pt in points:
            pred = predict_load(pt, deployment, calib)
            for k in METRICS:
                out.append(math.log(max(pred[k], 1e-9) / pt.measured[k]) / sigma[k])
        calls[0] += 1
        if log and calls[0] % 25 == 0:
            log(f"calibrate: fit evaluation {calls[0]}, chi-square {float(np.sum(np.square(out))):.2f}")
        return np.array(out)

    params = step_params(base)
    first = prior_starts(params, starts, seed) if start is None else [_params_of(start)]
    outcome = fit_map(resid, params, starts=first, diff_step=DIFF_STEP, max_nfev=max_nfev)
    info = {**outcome.info, "evaluations": calls[0], "noise": sigma,
            "estimates": {e.name: e.to_dict() for e in outcome.estimates}}
    return _with_params(base, outcome.x), info


# ----------------------------------------------------------------------------- fit + profile
@dataclass(frozen=True)
class FitResult:
    """A fitted profile and how well it does on the points it was fitted to and on the
    points held back."""

    calibration: Any
    memory: dict[str, float]
    fit_trials: tuple[str, ...]
    check_trials: tuple[str, ...]
    table: list[dict[str, Any]]            # compare_loads rows of every point, with "set"
    kv_table: list[dict[str, Any]]         # per start: measured vs predicted KV tokens / refusal
    errors: dict[str, dict[str, float]]    # "fit" / "check" -> summarize()
    info: dict[str, Any] = field(default_factory=dict)


def compare_startups(points: Sequence[Startup], deployment: Deployment) -> list[dict[str, Any]]:
    """Per start: measured and predicted KV cache tokens (or the refusal), each on its model."""
    out = []
    for s in points:
        dep = _dep_model(deployment, s.model)
        pred = predict_startup(s.config, dep)
        row: dict[str, Any] = {"trial": s.trial, "model": s.model or deployment.model, "measured_ok": s.ok,
                               "predicted_ok": pred["ok"]}
        if s.ok and pred["ok"] and s.num_gpu_blocks:
            # the pool in blocks: for full attention the logged "GPU KV cache size" is the
            # same figure in tokens, but a start whose layers had a sliding window logs the
            # tokens its concurrency implies (the window caps a request's blocks), not the pool
            row.update(measured=s.kv_cache_tokens, predicted=pred["kv_cache_tokens"],
                       measured_blocks=s.num_gpu_blocks, predicted_blocks=pred["num_gpu_blocks"],
                       error_pct=100.0 * (pred["num_gpu_blocks"] - s.num_gpu_blocks) / s.num_gpu_blocks)
        elif s.ok and pred["ok"]:
            row.update(measured=s.kv_cache_tokens, predicted=pred["kv_cache_tokens"],
                       error_pct=100.0 * (pred["kv_cache_tokens"] - s.kv_cache_tokens) / s.kv_cache_tokens)
        elif not s.ok and not pred["ok"]:
            m, p = s.estimated_max_model_len, pred.get("estimated_max_model_len")
            row.update(measured=m, predicted=p, kind=s.rejected_kind, predicted_kind=pred["kind"],
                       error_pct=100.0 * (p - m) / m if m and p is not None else math.nan)
        else:
            row.update(measured=s.kv_cache_tokens or s.estimated_max_model_len,
                       predicted=pred.get("kv_cache_tokens") or pred.get("estimated_max_model_len"),
                       error_pct=math.nan)
        out.append(row)
    return out


def point_name(p: LoadPoint) -> str:
    """``trial: probe label``, how a profile names one load point in ``fit_points``."""
    return f"{p.trial}: {p.label}"


def fit(rows: Sequence[dict[str, Any]], deployment: Deployment, *, fit_trials: Sequence[str] | None = None,
        fit_points: Sequence[str] | None = None, noise: dict[str, float] | None = None, starts: int = 1,
        max_nfev: int | None = None, graph_fraction: float | None = None, exclude: Sequence[str] = (),
        observer: Observer | None = None, start: Any | None = None) -> FitResult:
    """Fit memory and step-time constants on ``fit_trials`` (default: the first half of the
    trials with loads, in design order: the anchor, eager, a small batch cap, KV-limited)
    and check on the rest. ``fit_points`` instead names what the fit sees, point by point
    (:func:`point_name`, ``"q7-base: mix x5 @ 1 users"``) or whole trials; the memory fit
    sees the starts of the trials named. The memory fit runs first; the step-time fit sees
    its weights. The step-time fit runs to convergence (``max_nfev`` caps it) from
    ``starts`` starts (or from ``start``'s constants, :func:`fit_step_time`); ``noise`` is
    each metric's run-to-run noise (:func:`measurement_noise`).
    Points named in ``exclude`` are neither fitted nor checked (a replay a known artefact
    spoiled; the profile says why). ``observer`` sees the fit's progress (None: headless)."""
    import tempfile

    log = None if observer is None else observer.on_phase

    from tuner.sim.calibration import load_calibration
    from tuner.sim.hardware import get_gpu

    dropped = set(exclude)
    loads, started = [p for p in load_points(rows) if point_name(p) not in dropped], startups(rows)
    with_loads = list(dict.fromkeys(p.trial for p in loads))
    if fit_points is not None:
        chosen = set(fit_points)
        in_fit = lambda p: p.trial in chosen or point_name(p) in chosen  # noqa: E731
        fit_trials = tuple(dict.fromkeys([p.trial for p in loads if in_fit(p)]
                                         + [t for t in chosen if ":" not in t]))
    else:
        if fit_trials is None:
            fit_trials = with_loads[: max(1, len(with_loads) // 2)]
        in_fit = lambda p: p.trial in set(fit_trials)  # noqa: E731
    fit_set = set(fit_trials)
    check = tuple(t for t in dict.fromkeys([s.trial for s in started] + with_loads)
                  if t not in fit_set or any(p.trial == t and not in_fit(p) for p in loads))
    memory, mem_info = fit_memory([s for s in started if s.trial in fit_set], deployment,
                                  graph_fraction=graph_fraction)
    base = load_calibration(get_gpu(deployment.gpu))
    with tempfile.TemporaryDirectory() as tmp:
        # the memory constants reach plan_memory through Deployment.calibration
        prof = Path(tmp) / "profile.yaml"
        _write_yaml(prof, base, memory, match={}, extra={})
        dep = _dep_with(deployment, str(prof))
        calib, step_info = fit_step_time([p for p in loads if in_fit(p)], dep, base, noise=noise,
                                         starts=starts, max_nfev=max_nfev, log=log, start=start)
        table = []
        for pt, row in zip(loads, compare_loads(loads, dep, calib)):
            row["set"] = "fit" if in_fit(pt) else "check"
            table.append(row)
        kv_table = compare_startups(started, dep)
    for row in kv_table:
        row["set"] = "fit" if row["trial"] in fit_set else "check"
    errors = {name: summarize([r for r in table if r["set"] == name]) for name in ("fit", "check")
              if any(r["set"] == name for r in table)}
    kv_err = [abs(r["error_pct"]) for r in kv_table
              if r["measured_ok"] and not math.isnan(r.get("error_pct", math.nan))]
    refusal_err = [abs(r["error_pct"]) for r in kv_table
                   if not r["measured_ok"] and not math.isnan(r.get("error_pct", math.nan))]
    errors["kv"] = {"max_abs_error_pct": max(kv_err) if kv_err else math.nan,
                    "starts": float(len(kv_err)),
                    "refusals_matched": float(sum(1 for r in kv_table if not r["measured_ok"] and not r["predicted_ok"])),
                    "refusal_max_model_len_error_pct": max(refusal_err) if refusal_err else math.nan}
    return FitResult(calibration=calib.replace(calibrated=True), memory=memory, fit_trials=tuple(fit_trials),
                     check_trials=check, table=table, kv_table=kv_table, errors=errors,
                     info={"memory": mem_info, "step_time": step_info,
                           **({"fit_points": list(fit_points)} if fit_points is not None else {}),
                           **({"excluded": list(exclude)} if exclude else {})})


def read_names(path: str | Path) -> list[str]:
    """Point or trial names, one a line (``#`` starts a comment; the text after `` # `` on a
    line is a reason, kept out of the name): ``fit_points.txt``, ``excluded_points.txt``."""
    out = []
    for raw in Path(path).read_text(encoding="utf-8").splitlines():
        line = raw.split(" # ", 1)[0].strip()
        if line and not line.startswith("#"):
            out.append(line)
    return out


def campaign_rows(folder: str | Path) -> list[dict[str, Any]]:
    """Every measurement of a profile folder: ``measurements.jsonl``, then each later
    campaign on the same GPU and vLLM version in name order, whether a file beside it
    (``campaign2.jsonl``) or a folder of its own (``campaign3/measurements.jsonl``, kept
    with its logs); ``replicate.jsonl`` stays apart, it repeats trials under the same names."""
    p = Path(folder)
    rows = read_measurements(p / MEASUREMENTS)
    later = [f for f in p.glob("campaign*.jsonl") if f.is_file()]
    later += [d / MEASUREMENTS for d in p.glob("campaign*") if d.is_dir() and (d / MEASUREMENTS).is_file()]
    for extra in sorted(later, key=lambda f: f.relative_to(p).parts[0].removesuffix(".jsonl")):
        rows += read_measurements(extra)
    return rows


def _dep_with(deployment: Deployment, calibration: str | None) -> Deployment:
    import dataclasses

    return dataclasses.replace(deployment, calibration=calibration)


def _round(v: float) -> float:
    return float(f"{v:.4g}")


def _write_yaml(path: Path, calib: Any, memory: dict[str, float], *, match: dict[str, str],
                extra: dict[str, Any], sources: dict[str, str] | None = None,
                estimates: dict[str, dict[str, Any]] | None = None) -> None:
    import yaml

    src = sources or {}
    est = estimates or {}

    def interval(name: str) -> dict[str, Any]:
        e = est.get(name)
        if not e:
            return {}
        return {"ci95": [_round(e["ci95"][0]), _round(e["ci95"][1])], "determined": e["determined"]}

    doc: dict[str, Any] = {"gpu_class": calib.gpu_class, "calibrated": True}
    for name in ("hbm_efficiency", "flops_efficiency", "step_overhead_s", "per_seq_overhead_s",
                 "request_latency_s", "frontend_per_token_s", "frontend_per_request_s", "moe_flops_efficiency",
                 "allreduce_latency_s", "link_efficiency"):
        doc[name] = {"value": _round(getattr(calib, name)), **interval(name),
                     "source": src.get(name, calib.sources.get(name, ""))}
    launch: dict[str, Any] = {"value": {k: _round(v) for k, v in calib.launch_per_layer_s.items()}}
    modes = {m: interval(f"launch_{m}") for m in calib.launch_per_layer_s if interval(f"launch_{m}")}
    if modes:
        launch["ci95"] = {m: v["ci95"] for m, v in modes.items()}
        launch["determined"] = {m: v["determined"] for m, v in modes.items()}
    launch["source"] = src.get("launch_per_layer_s", calib.sources.get("launch_per_layer_s", ""))
    doc["launch_per_layer_s"] = launch
    doc["memory"] = {k: (float(v) if isinstance(v, float) else int(v)) for k, v in memory.items()}
    if match:
        doc["match"] = match
    doc.update(extra)
    path.parent.mkdir(parents=True, exist_ok=True)
    from tuner.files import write_atomic

    write_atomic(path, yaml.safe_dump(doc, sort_keys=False, width=110))


def write_profile(result: FitResult, path: str | Path, *, gpu: str, vllm_version: str,
                  meta: dict[str, Any] | None = None) -> Path:
    """Write the fitted profile YAML (hopper.yaml's format: ``value`` + ``source`` per
    constant, plus ``memory``, ``match`` and ``fit``): what ``tuner estimate``, ``tuner
    search --backend sim`` and the pre-check load when GPU and vLLM version match. Each
    fitted constant also carries its 95 % interval and whether the data determined it
    (``determined: data``) or it stayed at the class table's prior (``prior``)."""
    p = Path(path)
    step = result.info.get("step_time") or {}
    fitted = ("fit: MAP least squares (class table as prior) on trials " + ", ".join(result.fit_trials)
              + " (tuner calibrate)")
    sources = {k: fitted for k in ("hbm_efficiency", "flops_efficiency", "step_overhead_s", "per_seq_overhead_s",
                                   "request_latency_s", "frontend_per_token_s", "frontend_per_request_s",
                                   "moe_flops_efficiency", "launch_per_layer_s")}
    clean = lambda d: {k: (None if isinstance(v, float) and math.isnan(v) else round(v, 4) if isinstance(v, float) else v)  # noqa: E731
                       for k, v in d.items()}
    how = {}
    if step:
        how = {"method": "maximum a posteriori least squares, run to convergence (tuner.estimation.fit_map)",
               "noise": {k: round(float(v), 4) for k, v in (step.get("noise") or {}).items()},
               "reduced_chi2": round(float(step.get("reduced_chi2", math.nan)), 3),
               "starts": int(step.get("starts", 1)),
               "start_spread_sd": round(float(step.get("start_spread_sd", 0.0)), 3),
               "start_costs": [round(float(c), 3) for c in step.get("start_costs", [])],
               "correlated": [f"{a} ~ {b}: {rho:+.2f}" for a, b, rho in step.get("correlated", [])],
               "evaluations": int(step.get("evaluations", 0))}
    chosen = {k: result.info[k] for k in ("fit_points", "excluded") if k in result.info}
    extra = {"fit": {"fit_trials": list(result.fit_trials), "check_trials": list(result.check_trials), **chosen, **how,
                     "errors": {k: clean(v) for k, v in result.errors.items()},
                     **({"meta": meta} if meta else {})}}
    _write_yaml(p, result.calibration, result.memory, match={"gpu": gpu, "vllm_version": vllm_version},
                extra=extra, sources=sources, estimates=step.get("estimates"))
    return p
