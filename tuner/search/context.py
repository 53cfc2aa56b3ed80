"""What every measurement of a search shares (:class:`TrialContext`): handed whole from the
run to each trial's evaluation, its second start and the confirmation race, instead of
their settings one keyword at a time."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from tuner.runtime.progress import Observer, observer_or_headless
from tuner.search.settings import SearchSettings
from tuner.serving.slo import SloSet

if TYPE_CHECKING:
    from tuner.search.backend import Backend
    from tuner.serving.config import Deployment
    from tuner.traffic.workload import Workload


@dataclass(frozen=True, slots=True)
class TrialContext:
    """Where a configuration is measured and what it must meet: the ``backend`` that starts
    it on ``deployment``, the ``workload`` it replays, offered as ``load_kind``
    (``concurrency``, ``rate`` or ``trace``), the service levels ``slo`` every chosen load
    meets, how the study measures (``settings``), and who sees progress (``observer``;
    ``None`` is headless)."""

    backend: Backend
    deployment: Deployment
    workload: Workload
    slo: SloSet
    load_kind: str = "concurrency"
    settings: SearchSettings = field(default_factory=SearchSettings)
    observer: Observer | None = None

    @property
    def obs(self) -> Observer:
        return observer_or_headless(self.observer)

    @property
    def target_ttft_s(self) -> float | None:
        return self.slo.target_ttft_s

    def repeat(self, r: int) -> TrialContext:
        """The context of a confirmation repeat ``r``: the requests in another order and
        arrivals drawn with ``seed + r`` (the same sample for every candidate)."""
        s = self.settings
        return replace(self, workload=self.workload.reordered(s.seed + r), settings=replace(s, seed=s.seed + r))

    def with_settings(self, **changes: object) -> TrialContext:
        """The same context measuring with other settings (``max_replays=8``, ``precheck=False``)."""
        return replace(self, settings=replace(self.settings, **changes))


__all__ = ["TrialContext"]
