"""One nightly run as its study stores it (:class:`Night`, in the ``nights`` user attr), and
whether two nights ran the same workload (:func:`workload_difference`): the same shape,
and a size and load within :data:`LIKE_FACTOR` of each other."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tuner.core.errors import InputError

if TYPE_CHECKING:
    import optuna

NIGHTS_ATTR = "nights"
#: Two nights whose requests (or requests per second) differ by more than this factor
#: ran different workloads, whatever their shape (a quiet night of 12 requests cannot be
#: offered the load a night of 200 was: its best throughput falls with the traffic).
LIKE_FACTOR = 2.0


@dataclass(frozen=True, slots=True)
class Night:
    """One nightly run, as stored in the study's ``nights`` user attr."""

    started_at: str                      # ISO 8601 UTC; also the ``night`` tag of its trials
    date: str                            # YYYY-MM-DD (UTC)
    fingerprint: str
    shape: str
    tokens_per_s: float | None           # tonight's best feasible throughput (None: none feasible)
    trial: int | None
    config: dict[str, Any] | None
    new_trials: int                      # tonight's trials of the budget (--trials)
    workload: dict[str, Any] = field(default_factory=dict)
    deployment: dict[str, Any] = field(default_factory=dict)
    rerun_of_previous: float | None = None  # the previous night's best config, measured tonight
    repeats: int = 0                     # confirmation re-measurements of tonight's best (outside --trials)

    def __post_init__(self) -> None:
        if self.tokens_per_s is not None and not self.tokens_per_s >= 0:
            raise InputError(f"night {self.started_at}: throughput must be >= 0, got {self.tokens_per_s}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Night:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def nights(study: optuna.Study) -> list[Night]:
    return [Night.from_dict(n) for n in study.user_attrs.get(NIGHTS_ATTR) or []]


def _shape_change(before: Night, after: Night) -> str:
    out = []
    for key, word in (("mean_prompt_tokens", "mean prompt"), ("mean_output_tokens", "mean output")):
        a, b = before.workload.get(key), after.workload.get(key)
        if a and b:
            out.append(f"{word} {a:,.0f} -> {b:,.0f} tokens")
    return ", ".join(out) or "see the shapes"


def workload_difference(before: Night, after: Night) -> str | None:
    """How ``after``'s workload differs from ``before``'s, in words: its shape, or its size
    or load beyond :data:`LIKE_FACTOR`; None when the two are alike."""
    out = []
    if before.shape != after.shape:
        out.append(f"shape {before.shape} -> {after.shape} ({_shape_change(before, after)})")
    a, b = before.workload.get("requests"), after.workload.get("requests")
    if a and b and max(a / b, b / a) > LIKE_FACTOR:
        out.append(f"{a:,} -> {b:,} requests")
    rates = [w.get("requests", 0) / w["span_s"] if w.get("span_s") else None for w in (before.workload, after.workload)]
    if all(rates) and max(rates[0] / rates[1], rates[1] / rates[0]) > LIKE_FACTOR:
        out.append(f"{rates[0]:.3g} -> {rates[1]:.3g} requests/s")
    return ", ".join(out) or None


__all__ = ["LIKE_FACTOR", "NIGHTS_ATTR", "Night", "nights", "workload_difference"]
