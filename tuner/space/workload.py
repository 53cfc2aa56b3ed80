"""The workload of a search space (:class:`WorkloadSpec`) and the ranges its values may take."""
from __future__ import annotations

from dataclasses import dataclass, field

from tuner.core.errors import InputError
from tuner.core.values import is_int, is_number, shown
from tuner.serving.slo import SloSet

LOAD_KINDS = ("concurrency", "rate", "trace")

# The ranges a workload may take (see also tuner.serving.config's MAX_GPUS, tuner.core.knobs' MAX_TOKENS). Beyond
# them the value is a typo that would cost gigabytes or hours before the first trial.
#: Synthetic requests: every trial replays them a few times; 10M rows are ~0.5 GB of
#: columns, a day of busy traffic.
MAX_REQUESTS = 10_000_000
#: Seeds: numpy and Optuna take 32-bit seeds (0 <= seed < 2**32).
SEED_LIMIT = 2**32
#: Synthetic arrival rates, requests/s: from one request in 11.6 days to a million a
#: second; outside, arrival times stop being meaningful (1/rate overflows, or all at t=0).
MIN_RATE, MAX_RATE = 1e-6, 1e6
#: The P95 TTFT target: a day. A longer wait is not a latency target.
MAX_TTFT_S = 86_400.0


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """The traffic a study optimises for and the service levels it must meet.

    ``slo`` is the set every chosen load meets (:class:`~tuner.serving.slo.SloSet`, read once
    where the user wrote it: a space file, ``--target-ttft``/``--slo``, ``slo=`` of
    :func:`tuner.search`); its P95 TTFT bound is the study's target (:attr:`target_ttft_s`).
    ``trace`` is a log file (any format ``tuner.traffic`` reads); ``None`` takes the
    built-in synthetic mix (``requests`` requests at ``rate`` req/s, seeded).
    ``load`` is how the goodput search offers it: ``concurrency`` (closed loop,
    N users), ``rate`` (Poisson at a rate) or ``trace`` (logged times, compressed).
    """

    slo: SloSet = field(default_factory=lambda: SloSet.ttft(2.0))
    trace: str | None = None
    requests: int = 200
    rate: float = 10.0
    load: str = "concurrency"
    seed: int = 0

    @property
    def target_ttft_s(self) -> float:
        """The P95 TTFT target in seconds (always one of :attr:`slo`)."""
        return float(self.slo.target_ttft_s)  # type: ignore[arg-type]

    @property
    def slos(self) -> tuple[str, ...]:
        """The service levels beyond P95 TTFT, as typed (``p99:tpot<=30ms``)."""
        return self.slo.other_texts

    def __post_init__(self) -> None:
        if not isinstance(self.slo, SloSet):
            raise InputError(f"slo must be a SloSet, got {shown(self.slo)}", argument="slo",
                             hint="e.g. SloSet.parse(['p99:tpot<=30ms'], target_ttft_s='2s')")
        ttft = self.slo.target_ttft_s
        if ttft is None:
            raise InputError(f"slo {self.slo.describe()} has no P95 TTFT bound", argument="slo",
                             hint="P95 TTFT is the study's target: add p95:ttft<=2s")
        if not 0 < ttft <= MAX_TTFT_S:
            raise InputError(
                f"target_ttft_s must be in (0, {MAX_TTFT_S:g}] seconds (a day), got {shown(ttft)}",
                hint="write a duration such as 2s or 500ms", argument="target_ttft_s",
            )
        if self.trace is not None and (not isinstance(self.trace, str) or not self.trace):
            raise InputError(f"trace must be the path of a request log, got {shown(self.trace)}", argument="trace")
        if self.load not in LOAD_KINDS:
            raise InputError(f"load {shown(self.load)} is not one of {', '.join(LOAD_KINDS)}", argument="load")
        if not is_int(self.requests) or not 1 <= self.requests <= MAX_REQUESTS:
            raise InputError(
                f"requests must be a whole number in 1-{MAX_REQUESTS:,}, got {shown(self.requests)}",
                hint="more is more than tuner plans for; give a trace for real traffic", argument="requests",
            )
        if not is_number(self.rate) or not MIN_RATE <= self.rate <= MAX_RATE:
            raise InputError(
                f"rate must be in {MIN_RATE:g}-{MAX_RATE:g} requests/s, got {shown(self.rate)}", argument="rate"
            )
        if not is_int(self.seed) or not 0 <= self.seed < SEED_LIMIT:
            raise InputError(f"seed must be a whole number in 0-{SEED_LIMIT - 1}, got {shown(self.seed)}",
                             argument="seed")
