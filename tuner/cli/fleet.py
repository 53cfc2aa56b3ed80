"""``tuner plan --fleet FLEET``: across the GPU kinds a fleet file names, which ones, how many,
with which flags, at what cost and how sure (:func:`tuner.fleet.plan_fleet`); ``tuner plan``
hands its options over here when ``--fleet`` is given (:func:`fleet_cmd`)."""
from __future__ import annotations

import json
import math
from typing import Any

from tuner.cli._knobs import pins
from tuner.cli.estimate import build_workload
from tuner.cli.fleet_text import print_plan
from tuner.cli.progress import Bar
from tuner.core.errors import InputError, NoFeasibleConfig
from tuner.core.units import parse_seconds
from tuner.fleet.inventory import read_fleet
from tuner.fleet.planner import plan_fleet
from tuner.serving.demand import parse_fraction
from tuner.serving.slo import split_slos

#: Options of ``tuner plan`` that describe one configuration or a study; a fleet file says
#: those per kind. Option -> what to do instead.
_CONFLICTS = {
    "study": "a fleet plan searches each kind itself", "trial": "a fleet plan searches each kind itself",
    "gpu": "the fleet file names the GPUs (kinds:)", "gpus": "the fleet file counts each kind's GPUs (count:)",
    "tensor_parallel_size": "each kind's layout is searched (max_tp: in the fleet file caps it)",
    "tp": "each kind's layout is searched", "replicas": "the integer program counts the engines",
    "vllm_version": "the fleet file gives each kind's (vllm_version:)",
    "gpu_hour_cost": "the fleet file gives each kind's price (gpu_hour_cost:)",
    "concurrency": "each kind's load is swept until the SLOs break", "rate": "each kind's load is swept",
    "rates": "each kind's load is swept", "repeats": "not for a fleet plan", "time_scale": "the simulator's time",
    "vllm_cmd": "a fleet plan runs on the simulator", "endpoint": "a fleet plan runs on the simulator",
    "api_key_file": "a fleet plan runs on the simulator",
}


class FleetBar(Bar):
    """The fleet plan's progress: a step a kind, the phase naming the kind and its trial."""

    def __init__(self, kinds: int) -> None:
        super().__init__("kinds", kinds)
        self.kind = ""
        self.started = False

    def on_phase(self, text: str) -> None:
        if text.startswith("kind "):
            if self.started:
                self.step(text)
            self.started, self.kind = True, text.split(": ", 1)[-1]
        super().on_phase(text if text.startswith(("kind ", self.kind)) else f"{self.kind}: {text}")

    def on_start(self, name: str, finished: int, budget: int) -> None:
        self.budget = budget

    def on_trial(self, trial: Any, best: Any, finished: int) -> None:
        super().on_phase(f"{self.kind}: trial {finished}/{getattr(self, 'budget', '?')}")

    def __exit__(self, *exc: object) -> None:
        if self.started and exc[0] is None:
            self.step("done")
        super().__exit__(*exc)


def fleet_cmd(fleet: str, values: dict[str, Any], knob_flags: dict[str, Any]) -> None:
    """``tuner plan --fleet``: ``values`` are ``tuner plan``'s options as given."""

    for name, why in _CONFLICTS.items():
        given = values.get(name)
        if given is not None and not (name == "repeats" and given == 1):
            raise InputError(f"--{name.replace('_', '-')} does not go with --fleet: {why}")
    if str(getattr(values.get("backend"), "value", values.get("backend"))) != "sim":
        raise InputError("--backend: a fleet plan runs on the simulator (each kind's flags searched there)",
                         hint="measure a kind on its GPU with tuner search --backend vllm, or fit it: tuner calibrate")
    if not values.get("demand"):
        raise InputError("--fleet needs --demand: the traffic to serve (3000/min conversations, 20req/s)")
    ttft, others = split_slos(list(values.get("slo") or []))
    if values.get("target_ttft") and ttft is None:
        ttft = parse_seconds(values["target_ttft"], what="--target-ttft")
    knobs, _ = pins(knob_flags, values.get("set_"))
    trace = None
    if values.get("trace"):
        trace = build_workload(values["trace"], None, None, values.get("num_requests"),
                               skip_bad=bool(values.get("skip_bad")))
    fl = read_fleet(fleet)
    for name in ("quantization", "dtype"):
        if values.get(name):
            from dataclasses import replace

            fl = replace(fl, **{name: None if values[name] == "none" else values[name]})
    with FleetBar(len(fl.kinds)) as bar:
        plan = plan_fleet(fl, values["demand"], slos=(f"p95:ttft<={ttft if ttft is not None else 5.0:g}s", *others),
                          tokens_per_conversation=values.get("tokens_per_conversation"),
                          headroom=parse_fraction(values.get("headroom") or "20%"), trace=trace,
                          requests=values.get("num_requests"), pins=knobs, seed=int(values.get("seed") or 0),
                          model=values.get("model"), folder=values.get("out"), storage=values.get("storage"),
                          files=bool(values.get("files", True)), observer=bar)
    output = str(getattr(values.get("output"), "value", values.get("output") or "text"))
    if output == "json":
        print(json.dumps(plan.to_dict(), indent=2))
    else:
        print_plan(plan)
    if not plan.options:
        raise NoFeasibleConfig(plan.notes[0] if plan.notes else "no deployment meets the demand")


def money(v: float | None) -> str:
    return "-" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{v:,.2f}"


__all__ = ["FleetBar", "fleet_cmd"]
