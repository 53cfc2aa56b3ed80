"""Measuring a campaign: :func:`measure` starts each trial through a backend, records
vLLM's startup facts or its refusal, replays each load and probe and appends one JSON line
per observation (resumable, within a time budget); :func:`install_sigterm_handler` for the
drivers that run it under ``timeout``."""
from __future__ import annotations

import json
import math
import os
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.backends.vllm_args import parse_startup
from tuner.calibrate.measurements import MEASUREMENTS, read_measurements
from tuner.calibrate.probes import build, load_from
from tuner.calibrate.trials import Probe, Trial, calibration_workload, requests_for
from tuner.core.errors import BackendError, ConfigRejected, EnvironmentFault
from tuner.core.jsonsafe import json_safe
from tuner.plan.sweep import rescale
from tuner.runtime.progress import Observer, observer_or_headless
from tuner.serving.config import Deployment, ServeConfig
from tuner.serving.load import Concurrency, Poisson, TraceReplay

if TYPE_CHECKING:
    from tuner.search.backend import Backend


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
    shapes). Probe rows carry the workload reference and the load (:mod:`tuner.calibrate.probes`);
    for rows of a shared trace the per-request lengths are not written (the reference
    rebuilds them from the trace). Returns every row of the file."""
    campaign = _Campaign(backend, Path(out_dir), observer_or_headless(observer).on_phase, budget_s)
    done = _done_trials(campaign.rows)
    if meta and not any(r.get("kind") == "meta" for r in campaign.rows):
        campaign.emit({"kind": "meta", **meta})
    for trial in trials:
        if trial.name in done:
            continue
        if not campaign.run_trial(trial, lambda t: deployment_for(t) if deployment_for is not None else deployment):
            break
    return campaign.rows


class _Campaign:
    """One :func:`measure` call: its rows (``measurements.jsonl``, appended as they come),
    its log and its deadline; :meth:`run_trial` measures one trial."""

    def __init__(self, backend: Backend, out: Path, log: Callable[[str], None], budget_s: float | None) -> None:
        out.mkdir(parents=True, exist_ok=True)
        self.backend, self.log = backend, log
        self.path = out / MEASUREMENTS
        self.rows = read_measurements(self.path)
        self.deadline = time.monotonic() + budget_s if budget_s is not None else math.inf

    def emit(self, row: dict[str, Any]) -> None:
        row = json_safe({"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **row}, digits=7)
        with open(self.path, "a") as fh:
            fh.write(json.dumps(row, separators=(",", ":")) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        self.rows.append(row)

    def over_budget(self, control: Any) -> bool:
        return time.monotonic() > self.deadline

    def run_trial(self, trial: Trial, deployment_of: Callable[[Trial], Deployment]) -> bool:
        """Start ``trial`` (on its deployment, ``deployment_of(trial)``), replay its loads and missing probes, and write their
        rows; False when the campaign stops here (the budget, or a setup that is broken)."""  # noqa: E501
        todo = _missing_probes(trial, self.rows)
        if trial.probes and not todo:
            self.emit({"kind": "trial_end", "trial": trial.name})
            return True
        left = self.deadline - time.monotonic()
        # a probe trial needs its start and its first missing probe; the rest resume next time
        need = _estimate_trial_s(trial) if not trial.probes else _start_s(trial) + todo[0].expected_s
        if need > left:
            self.log(f"calibrate: {trial.name} needs ~{need:.0f} s, {left:.0f} s left; stopping here")
            return False
        dep = deployment_of(trial)
        self.log(f"calibrate: {trial.name}: starting {_flags(trial.config)}"
                 + (f" ({trial.model})" if trial.model else ""))
        t_start = time.monotonic()
        try:
            instance = self.backend.start(dep, trial.config)
        except ConfigRejected as err:
            return self._refused(trial, err, t_start)
        except (BackendError, EnvironmentFault) as err:
            kind = "environment" if isinstance(err, EnvironmentFault) else "backend_error"
            self.emit({"kind": "startup", "trial": trial.name, "config": trial.config.to_dict(), "ok": False,
                       "rejected_kind": kind, "message": str(err), "model": trial.model,
                       "wall_s": time.monotonic() - t_start})
            self.log(f"calibrate: {trial.name}: {kind.replace('_', ' ')}: {err}; stopping")
            return False
        with instance:
            self._started(trial, instance, t_start)
            self._loads(trial, instance)
            if not self._probes(trial, instance, todo):
                return False
        if time.monotonic() <= self.deadline:
            self.emit({"kind": "trial_end", "trial": trial.name})
        return True

    def _refused(self, trial: Trial, err: ConfigRejected, t_start: float) -> bool:
        """The row of a start vLLM refused; False when the server itself is broken."""
        self.emit({"kind": "startup", "trial": trial.name, "config": trial.config.to_dict(), "ok": False,
                   "expect_refusal": trial.expect_refusal, "rejected_kind": err.kind, "message": err.message,
                   "estimated_max_model_len": err.estimated_max_model_len, "model": trial.model,
                   "wall_s": time.monotonic() - t_start})
        self.log(f"calibrate: {trial.name}: refused ({err.kind}): {err.message[:300]}")
        if not trial.expect_refusal and err.kind in ("crash", "timeout", "bad_flag"):
            # the server itself is broken (not this configuration): stop and show why
            _log_tail(err.log_path, self.log)
            self.log("calibrate: stopping: an unexpected start failure; fix the setup and run again")
            return False
        self.emit({"kind": "trial_end", "trial": trial.name})
        return True

    def _started(self, trial: Trial, instance: Any, t_start: float) -> None:
        """The row of a start: vLLM's startup facts."""
        info = {k: v for k, v in instance.info.items() if k not in ("argv", "endpoints")}
        if "available_kv_gib" not in info and info.get("log_lines"):
            # the simulator hands its startup lines over instead of a log file

            info = {**parse_startup("\n".join(info["log_lines"])), **info}
        self.emit({"kind": "startup", "trial": trial.name, "config": trial.config.to_dict(), "ok": True,
                   "expect_refusal": trial.expect_refusal, "facts": info, "model": trial.model,
                   "argv": instance.info.get("argv"), "wall_s": time.monotonic() - t_start})
        self.log(f"calibrate: {trial.name}: KV cache {info.get('kv_cache_tokens')} tokens, "
                 f"started in {time.monotonic() - t_start:.0f} s")

    def _loads(self, trial: Trial, instance: Any) -> None:
        """Replay each of the trial's loads (fresh prompts each), a row each."""
        cfg = trial.config
        offset = 0
        for users in trial.loads:
            n = requests_for(users, cfg.enforce_eager)
            work = calibration_workload(n, offset=offset)
            offset += n
            # each run sends fresh prompts (the Instance contract, tuner.search.backend): no
            # prefix-cache hits across runs
            t_run = time.monotonic()
            try:
                res = _timed(self.backend, instance.run(work, Concurrency(users), stop=self.over_budget))
            except BackendError as err:
                self.emit({"kind": "load", "trial": trial.name, "users": users, "requests": n, "ok": False,
                           "message": str(err)})
                self.log(f"calibrate: {trial.name} c={users}: {err}")
                return
            summ = res.summary()
            self.emit({"kind": "load", "trial": trial.name, "config": cfg.to_dict(), "users": users,
                       "requests": n, "offset": offset - n, "ok": True, "stopped_early": res.stopped_early,
                       "wall_s": time.monotonic() - t_run, "summary": summ, "server": res.server,
                       "prompt_tokens": res.prompt_tokens, "output_tokens": res.output_tokens,
                       "send_s": res.send_s, "ttft_s": res.ttft_s, "e2e_s": res.e2e_s,
                       "error": res.error})
            self.log(f"calibrate: {trial.name} c={users}: {summ['output_tokens_per_s']:.0f} out tok/s, "
                     f"P95 TTFT {summ['ttft_p95_s'] * 1e3:.1f} ms, TPOT {summ['tpot_mean_s'] * 1e3:.2f} ms"
                     f" ({n} requests, {time.monotonic() - t_run:.1f} s)")
            if res.stopped_early:
                return

    def _probes(self, trial: Trial, instance: Any, todo: list[Probe]) -> bool:
        """Replay the trial's missing probes; False when the budget or an error cut them."""
        for probe in todo:
            if probe.expected_s > self.deadline - time.monotonic():
                self.log(f"calibrate: {trial.name}: {probe.label} needs ~{probe.expected_s:.0f} s; resuming next time")
                return False
            if not _run_probe(instance, self.backend, trial, probe, self.emit, self.log, self.over_budget):
                return False
        return True


def _run_probe(instance: Any, backend: Any, trial: Trial, probe: Probe, emit: Callable[[dict[str, Any]], None],
               log: Callable[[str], None], stop: Callable[[Any], bool]) -> bool:
    """One probe's replay and its row; False when the trial should stop (an error or the budget)."""

    work = build(probe.workload)
    load = _faster(load_from(probe.load), float(getattr(backend, "time_scale", 1.0) or 1.0))
    t_run, cpu_run = time.monotonic(), time.process_time()
    try:
        res = _timed(backend, instance.run(work, load, stop=stop))
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
        "server": res.server, "send_s": res.send_s, "ttft_s": res.ttft_s, "e2e_s": res.e2e_s, "error": res.error,
        # the host as the replay left it: a start whose host was busier (other tenants' load,
        # the replayer's own CPU time) is told apart from one whose engine was slower
        "host": {"loadavg_1m": os.getloadavg()[0], "client_cpu_s": time.process_time() - cpu_run}}
    if probe.workload.get("kind") != "trace":  # a trace's lengths stay in the trace
        row.update(prompt_tokens=res.prompt_tokens, output_tokens=res.output_tokens)
    emit(row)
    log(f"calibrate: {trial.name} {probe.label}: {summ['output_tokens_per_s']:.0f} out tok/s, "
        f"P95 TTFT {summ['ttft_p95_s'] * 1e3:.1f} ms, TPOT {summ['tpot_mean_s'] * 1e3:.2f} ms "
        f"({len(work)} requests, {time.monotonic() - t_run:.1f} s)")
    return not res.stopped_early


def _faster(load: Any, scale: float) -> Any:
    """An open-loop load offered ``scale`` times faster to a server that runs that much faster
    than real time (its arrivals in the measured GPU's time stay the probe's)."""
    import dataclasses

    if scale == 1.0:
        return load
    if isinstance(load, Poisson):
        return dataclasses.replace(load, rate=load.rate * scale)
    if isinstance(load, TraceReplay):
        return dataclasses.replace(load, multiplier=load.multiplier * scale)
    return load


def _timed(backend: Any, result: Any) -> Any:
    """The run in the measured GPU's time: a server that runs N times faster than real time
    (``tuner sim-serve --speed N``, the backend's ``time_scale``) has every time multiplied by
    N, so that a dry run against it fits the constants of the GPU it simulates."""
    scale = float(getattr(backend, "time_scale", 1.0) or 1.0)
    if scale == 1.0:
        return result

    return rescale(result, scale)


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

