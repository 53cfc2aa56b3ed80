"""The measured points read back from measurement rows: :class:`LoadPoint` (one measured
load) and :class:`Startup` (one measured start), the metrics they carry (:data:`METRICS`,
:data:`REPORTED`) and how a profile names a point (:func:`point_name`)."""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from tuner.calibrate.probes import label
from tuner.serving.config import ServeConfig

#: The metrics fitted and checked per load point (RunResult.summary() keys).
METRICS = ("output_tokens_per_s", "ttft_p95_s", "tpot_mean_s")
#: Also compared (reported, not fitted): prompt + output tokens/s and mean TTFT.
REPORTED = METRICS + ("tokens_per_s", "ttft_mean_s")


@dataclass(frozen=True)
class LoadPoint:
    """One measured load: a trial's config at ``users`` closed-loop users over rows
    ``offset .. offset+requests`` of :func:`calibration_workload`, or (a probe) the
    workload reference and load of :mod:`tuner.calibrate.probes`; ``model`` when not the fit's."""

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


def point_name(p: LoadPoint) -> str:
    """``trial: probe label``, how a profile names one load point in ``fit_points``."""
    return f"{p.trial}: {p.label}"

