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

import numpy as np

from tuner.config import Deployment, ServeConfig
from tuner.errors import BackendError, ConfigRejected, InputError
from tuner.load import Concurrency

if TYPE_CHECKING:
    from tuner.backends.base import Backend
    from tuner.traffic.workload import Workload

MEASUREMENTS = "measurements.jsonl"

#: Workload of every load point: prompt and output lengths drawn uniformly (seeded), the
#: same rows for the real server and the simulator. Outputs are forced (ignore_eos).
PROMPT_RANGE = (128, 1024)
OUTPUT_RANGE = (32, 256)
WORKLOAD_SEED = 2026


@dataclass(frozen=True, slots=True)
class Trial:
    """One configuration of the design and the closed-loop loads (users) it is measured at.
    ``loads`` empty means startup only (the refusal case, or a KV-size-only point)."""

    name: str
    config: ServeConfig
    loads: tuple[int, ...] = ()
    expect_refusal: bool = False
    purpose: str = ""

    def __post_init__(self) -> None:
        if not self.name or any(c in self.name for c in " /\\"):
            raise InputError(f"trial name {self.name!r} must be a non-empty word")
        if any(u < 1 for u in self.loads):
            raise InputError(f"trial {self.name}: loads are user counts >= 1, got {self.loads}")


def calibration_workload(n: int, *, seed: int = WORKLOAD_SEED, offset: int = 0) -> Workload:
    """``n`` requests (rows ``offset .. offset+n`` of one seeded sequence) with uniform
    prompt and output lengths; arrivals are all 0 (closed-loop loads ignore them)."""
    from tuner.traffic.workload import Workload

    rng = np.random.default_rng(seed)
    total = offset + n
    prompts = rng.integers(PROMPT_RANGE[0], PROMPT_RANGE[1] + 1, size=total)
    outputs = rng.integers(OUTPUT_RANGE[0], OUTPUT_RANGE[1] + 1, size=total)
    return Workload(arrival_s=np.zeros(n), prompt_tokens=prompts[offset:], output_tokens=outputs[offset:],
                    source=f"calibration(seed={seed}, offset={offset})")


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
def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return [_jsonable(v) for v in obj.tolist()]
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        v = float(obj)
        return None if math.isnan(v) or math.isinf(v) else round(v, 7)
    return obj


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


def _estimate_trial_s(trial: Trial) -> float:
    """Seconds a trial takes on an H200-class GPU (startup 50-105 s with graphs, less
    eager; the loads about 10-20 s each): used to decide whether it fits the time left."""
    start = 70.0 if trial.config.enforce_eager else 105.0
    if trial.expect_refusal:
        return 60.0
    per_load = 25.0 if trial.config.enforce_eager else 15.0
    return start + per_load * len(trial.loads) + 10.0


def measure(
    backend: Backend,
    deployment: Deployment,
    trials: Sequence[Trial],
    out_dir: str | Path,
    *,
    budget_s: float | None = None,
    log: Callable[[str], None] = print,
    meta: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Run the trials not yet in ``out_dir/measurements.jsonl`` and append their rows.

    Rows (one JSON object per line, flushed as they come): ``startup`` (the config, the
    facts parsed from vLLM's startup log, or the refusal's kind, message and estimated
    maximum model length), ``load`` (users, requests, the run's summary, per-request
    prompt/output tokens, TTFT and E2E), ``trial_end``. With ``budget_s``, a trial is started
    only if its estimated time fits what is left, and a load run is cut at the budget
    (the rows then say ``stopped_early``). Returns every row of the file."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / MEASUREMENTS
    rows = read_measurements(path)
    done = _done_trials(rows)
    t0 = time.monotonic()
    deadline = t0 + budget_s if budget_s is not None else math.inf
    salt = sum(1 for r in rows if r.get("kind") == "load")

    def emit(row: dict[str, Any]) -> None:
        row = _jsonable({"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **row})
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
        left = deadline - time.monotonic()
        need = _estimate_trial_s(trial)
        if need > left:
            log(f"calibrate: {trial.name} needs ~{need:.0f} s, {left:.0f} s left; stopping here")
            break
        cfg = trial.config
        log(f"calibrate: {trial.name}: starting {_flags(cfg)}")
        t_start = time.monotonic()
        try:
            instance = backend.start(deployment, cfg)
        except ConfigRejected as err:
            emit({"kind": "startup", "trial": trial.name, "config": cfg.to_dict(), "ok": False,
                  "expect_refusal": trial.expect_refusal, "rejected_kind": err.kind, "message": err.message,
                  "estimated_max_model_len": err.estimated_max_model_len,
                  "wall_s": time.monotonic() - t_start})
            log(f"calibrate: {trial.name}: refused ({err.kind}): {err.message[:300]}")
            if not trial.expect_refusal and err.kind in ("crash", "timeout", "bad_flag"):
                # the server itself is broken (not this configuration): stop and show why
                _log_tail(err.log_path, log)
                log("calibrate: stopping: an unexpected start failure; fix the setup and run again")
                break
            emit({"kind": "trial_end", "trial": trial.name})
            continue
        except BackendError as err:
            emit({"kind": "startup", "trial": trial.name, "config": cfg.to_dict(), "ok": False,
                  "rejected_kind": "backend_error", "message": str(err), "wall_s": time.monotonic() - t_start})
            log(f"calibrate: {trial.name}: backend error: {err}; stopping")
            break
        with instance:
            info = {k: v for k, v in instance.info.items() if k not in ("argv", "endpoints")}
            emit({"kind": "startup", "trial": trial.name, "config": cfg.to_dict(), "ok": True,
                  "expect_refusal": trial.expect_refusal, "facts": info,
                  "argv": instance.info.get("argv"), "wall_s": time.monotonic() - t_start})
            log(f"calibrate: {trial.name}: KV cache {info.get('kv_cache_tokens')} tokens, "
                f"started in {time.monotonic() - t_start:.0f} s")
            offset = 0
            for users in trial.loads:
                n = requests_for(users, cfg.enforce_eager)
                work = calibration_workload(n, offset=offset)
                offset += n
                salt += 1
                opts = getattr(backend, "replay_options", None)
                if isinstance(opts, dict) and not hasattr(instance, "runs"):
                    opts["salt"] = salt  # fresh prompt ids: no prefix-cache hits across runs
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
        if time.monotonic() <= deadline:
            emit({"kind": "trial_end", "trial": trial.name})
    return rows


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
