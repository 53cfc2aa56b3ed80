"""How to read each figure of a study: its title, and a caption written from the study's
own values (its target, its SLOs, its objective) that describes only what was drawn."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

#: Each figure of a study, in the report's order: its title.
TITLES = {
    "history": "Optimisation history",
    "importances": "Knob importance",
    "tradeoff": "Throughput against P95 TTFT",
    "ttft_by_load": "P95 TTFT against load, best configurations",
    "per_user": "Tokens/s per user against tokens/s per GPU",
    "layouts": "Throughput by layout",
    "capacity": "Capacity curve",
}


@dataclass(frozen=True, slots=True)
class Facts:
    """What a caption says of its study and figure: the P95 TTFT target (seconds), the SLO
    set as typed (P95 TTFT first), the objective (``tokens`` or ``goodput``), how many
    configurations a figure compares, whether it drew trials or load points that missed and
    how many verify runs the capacity curve drew."""

    target_s: float | None = None
    slos: Sequence[str] = ()
    objective: str | None = None
    configs: int = 0
    missed: bool = False
    verify_runs: int = 0


def _target(facts: Facts) -> str:
    return f"the P95 TTFT target ({facts.target_s:g} s)" if facts.target_s else "the P95 TTFT target"


def _meeting(facts: Facts) -> str:
    return f"every SLO ({', '.join(facts.slos)})" if len(facts.slos) > 1 else _target(facts)


def caption(name: str, facts: Facts) -> str:
    """The caption of figure ``name`` for a study of ``facts``."""
    several = len(facts.slos) > 1
    line = f"red line at {facts.target_s:g} s" if facts.target_s else "red line"
    match name:
        case "history":
            what = ("goodput (requests/s meeting every SLO)" if facts.objective == "goodput"
                    else "throughput (tokens/s, in+out)")
            return (f"Each dot is a trial's {what} at its highest load meeting {_meeting(facts)}"
                    + ("; grey dots (at 0) did not meet it or were refused by vLLM" if facts.missed else "")
                    + ". The line is the best feasible value so far: a long flat tail means more trials are "
                    "unlikely to help.")
        case "importances":
            return ("How much each knob explains throughput (PED-ANOVA: how differently the best trials set it "
                    "compared with all trials). Spend tuning effort on the top knobs; the bottom ones can stay at "
                    "vLLM's defaults.")
        case "tradeoff":
            text = (f"Each trial at the load it was scored at, its highest meeting {_meeting(facts)}"
                    + (" (a trial that missed: at its lowest load)" if facts.missed else "")
                    + (f", so feasible trials gather just left of the {line} or below where another SLO binds "
                       "first" if several else f", so feasible trials gather just left of the {line}")
                    + ": the search pushes each to its own edge. The green steps are the Pareto front, the star "
                    "the answer.")
            if several:
                text += (" Each trial's colour is the SLO that binds it (the smallest margin at its load); a cross "
                         "left of the line missed another SLO.")
            return text
        case "ttft_by_load":
            n = f"{facts.configs} best configurations" if facts.configs > 1 else "best configuration"
            return (f"P95 TTFT at each load the search measured for the {n} (one line each, by throughput; ★ the "
                    f"recommended one). The dashed {line} is the target: the most load left of where a line "
                    "crosses it is what a configuration holds."
                    + (" A hollow marker missed " + ("an SLO" if several else "the target") + " at that load (a "
                       "run stopped early as soon as it could no longer pass shows the P95 TTFT of the requests "
                       "answered by then)." if facts.missed else ""))
        case "per_user":
            return ("Every load point of every trial that ran to the end, as vllm bench sweep plot_pareto draws "
                    "it: output tokens/s per user (output tokens/s ÷ concurrent users) against output tokens/s "
                    "per GPU (÷ tensor-parallel size x replicas). Up is cheaper per GPU, right is faster for each "
                    f"user; the green line joins the points meeting {_meeting(facts)} that no other beats on both"
                    + (" (hollow grey: missed)" if facts.missed else "") + ". The star is the recommended "
                    "configuration at its busiest load point meeting it.")
        case "layouts":
            return ("Feasible throughput per GPU layout (tensor-parallel size x replicas). More replicas usually "
                    "win throughput; more TP frees memory for KV cache and cuts per-token latency.")
        case "capacity":
            text = ("The load sweep of tuner plan on the chosen configuration: P95 TTFT rises with load; the grey "
                    f"line is the most load that stays under the target ({line}), the capacity to plan with")
            if facts.verify_runs:
                look = "diamonds" if several else "orange diamond" + ("s" if facts.verify_runs > 1 else "")
                verb = "are the runs" if facts.verify_runs > 1 else "is the run"
                text += f", and the {look} {verb} that verified it"
            text += "."
            if several:
                text += (" Each run's colour is the SLO that limits it there (tuner plan's limit column).")
            return text
    raise KeyError(name)


#: Each figure's title and its caption for a study of unknown values (``tuner report --help``,
#: the notebook); :func:`tuner.plots.study_plots` writes the study's own.
CAPTIONS = {name: (title, caption(name, Facts())) for name, title in TITLES.items()}
