"""Whose fault a failed start or a disrupted measurement is, decided by the machine.

A start vLLM refuses for a knob (out of memory, a max-model-len its KV cache cannot hold:
:mod:`tuner.backends.vllm_args`) is the configuration's. What vLLM's words do not pin on a
knob is *ambiguous*: a crash after the engine started, a start that never became healthy
(``timeout``), a measurement something cut into (:class:`~tuner.core.errors.Disrupted`: the
server exited or stopped answering mid-replay without tuner's signal, every stream stalled
at once). The :class:`Referee` asks the machine:

1. the configuration is started again at once; if it measures, the failure was a passing
   one of the machine's, and is remembered as such;
2. a failure a configuration known to work on this machine met too is the machine's: the
   configuration is started again, up to :data:`MAX_STARTS` starts in all;
3. failed twice, a **control** runs: a configuration known to work here (the incumbent,
   else the study's first that measured) is started once and replays a few requests. If it
   fails too, the fault is the environment's (:class:`~tuner.core.errors.EnvironmentFault`:
   not stored as a result, not counted, two in a row stop the run with the cause); if it
   serves, the configuration is started a third time, and a third failure is the
   configuration's, stored with vLLM's line (a machine that fails 30 % of its starts at
   random fails one configuration three times around a working control 1.9 % of the time,
   twice around it 6.3 %);
4. before any configuration has worked there is no control. Identical failures of
   configurations that differ in a knob the line names (that knob's values aside) are the
   configurations'; identical failures naming no knob, of configurations that differ, are
   the environment's; else the failure is *undecided* (not stored, not counted) and judged
   again once a configuration has worked.

Lines are compared by :func:`signature`: what differs from start to start (hex numbers,
addresses, pids, ports, timestamps, log paths) is taken out; a number that may be a knob's
value never is. The control's start and the extra starts cost GPU time: it is the trial's
(``gpu_s``), and its ``blame`` record says how much of it the judging took.
"""
from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tuner.core.errors import BackendError, ConfigRejected, Disrupted, EnvironmentFault
from tuner.core.knobs import KNOBS
from tuner.replay.disruption import disruption
from tuner.search.boundary import incumbent
from tuner.serving.load import Concurrency
from tuner.study.record import TrialRecord

if TYPE_CHECKING:
    import optuna

    from tuner.runtime.progress import Observer
    from tuner.search.backend import Backend
    from tuner.search.objective import Evaluation
    from tuner.serving.config import Deployment, ServeConfig
    from tuner.traffic.workload import Workload

#: Refusal kinds vLLM's words do not pin on a knob of the configuration.
UNPINNED = ("timeout", "crash")
#: Starts of one configuration while its failures are the machine's.
MAX_STARTS = 3
#: What a control run replays: the study's first requests, at a few users.
CONTROL_REQUESTS, CONTROL_USERS = 24, 4

_IDS = [
    (re.compile(r"\[log: [^\]]*\]"), ""),
    (re.compile(r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"), "<uuid>"),
    (re.compile(r"\b0x[0-9a-fA-F]+\b"), "<hex>"),
    (re.compile(r"\b(?=[0-9a-fA-F]*[a-fA-F])(?=[0-9a-fA-F]*\d)[0-9a-fA-F]{8,}\b"), "<hex>"),
    (re.compile(r"\b(pid|tid|rank|process|worker|handle)([ =:#]+)\d+", re.I), r"\1\2<id>"),
    (re.compile(r"\b\d{4}-\d\d-\d\d[T ]\d\d:\d\d(:\d\d(\.\d+)?)?(Z|[+-]\d\d:?\d\d)?"), "<time>"),
    (re.compile(r"\b\d\d-\d\d \d\d:\d\d:\d\d(\.\d+)?"), "<time>"),
    (re.compile(r"\b\d\d:\d\d:\d\d(\.\d+)?"), "<time>"),
    (re.compile(r"\b((?:\d{1,3}\.){3}\d{1,3}|localhost|\[[0-9a-fA-F:]+\]):\d+"), r"\1:<port>"),
    (re.compile(r"/tmp/[\w.+-]+"), "/tmp/<file>"),
]


def signature(text: str) -> str:
    """``text`` without what differs between two starts of the same failure (see the module docstring)."""
    out = str(text or "")
    for rx, repl in _IDS:
        out = rx.sub(repl, out)
    return " ".join(out.split())


def named_knobs(text: str) -> list[str]:
    """The knobs of the configuration ``text`` names, as vLLM spells them (``max_num_seqs``,
    ``--max-num-seqs``, ``max-num-seqs``)."""
    names = [(k.name, k.flag) for k in KNOBS] + [("tensor_parallel_size", "tensor-parallel-size")]
    return [n for n, flag in names if re.search(rf"(?<![\w-])-{{0,2}}(?:{n}|{flag})(?![\w-])", text)]


def _masked(text: str, config: ServeConfig, knobs: list[str]) -> str:
    """:func:`signature` of ``text`` with ``config``'s values of ``knobs`` written as the knob's name."""
    out = signature(text)
    for k in knobs:
        value = getattr(config, k, None)
        if value is None or isinstance(value, bool):
            continue
        shown = {str(value), f"{value:g}" if isinstance(value, float) else str(value)}
        for v in shown:
            out = re.sub(rf"(?<![\w.]){re.escape(v)}(?![\w.])", f"<{k}>", out)
    return out


@dataclass(slots=True)
class Failure:
    """One ambiguous failure: its kind, vLLM's line (or what disrupted the replay), the GPU
    seconds it took, and the refused start's evaluation (None for a disruption)."""

    kind: str
    message: str
    gpu_s: float = 0.0
    evaluation: Evaluation | None = None

    @property
    def signature(self) -> str:
        return signature(self.message)


def failures_of(rec: TrialRecord) -> list[str]:
    """The failure lines a trial met: those its judging saw, and the one it stored."""
    out = list((rec.blame or {}).get("failures") or [])
    if rec.rejected_at == "start" and rec.rejected_kind in UNPINNED and rec.infeasible_reason:
        out.append(rec.infeasible_reason.split(" (the configuration's fault:", 1)[0])
    return out


def started(rec: TrialRecord) -> bool:
    """The trial's server started (it measured a load, or recorded a start time)."""
    return bool(rec.loads) or bool(rec.run.startup_s)


def worked(rec: TrialRecord) -> bool:
    """The trial's server started and served a replay (it measured something)."""
    return bool(rec.loads)


def control_of(study: optuna.Study, config: ServeConfig) -> tuple[int, ServeConfig] | None:
    """A configuration known to work on this machine, other than ``config``: the incumbent,
    else the study's first trial that measured."""

    best = incumbent(study)
    rec = TrialRecord.from_trial(best) if best is not None else None
    if rec is not None and rec.config is not None and rec.config != config:
        return best.number, rec.config
    for t in study.get_trials(deepcopy=False):
        rec = TrialRecord.from_trial(t)
        if t.state.name == "COMPLETE" and worked(rec) and rec.config is not None and rec.config != config \
                and not rec.is_repeat:
            return t.number, rec.config
    return None


def itl_tail(study: optuna.Study) -> float | None:
    """The study's own inter-token tail: the largest P99 inter-token gap its measured
    trials saw (what a stall must exceed many times over to be a disruption); None before any."""
    tails = [float(rec.summary["itl_p99_s"]) for rec in map(TrialRecord.from_trial, study.get_trials(deepcopy=False))
             if worked(rec) and isinstance(rec.summary.get("itl_p99_s"), (int, float))
             and rec.summary["itl_p99_s"] == rec.summary["itl_p99_s"]]
    return max(tails) if tails else None


@dataclass
class Referee:
    """Judges the ambiguous failures of one run's trials (see the module docstring) with
    the run's backend. ``learned`` holds the signatures of failures seen on a configuration
    that works; ``extra_starts`` and ``gpu_s`` are what the judging added (starts beyond the
    one a trial makes, controls included) and their GPU seconds, ``controls`` and
    ``control_gpu_s`` the control runs' share of them."""

    backend: Backend
    deployment: Deployment
    workload: Workload
    observer: Observer
    learned: set[str] = field(default_factory=set)
    extra_starts: int = 0
    gpu_s: float = 0.0
    controls: int = 0
    control_gpu_s: float = 0.0

    # -- what the study knows ----------------------------------------------------------------
    def machine_failures(self, study: optuna.Study) -> dict[str, int | None]:
        """Signature -> the trial whose configuration works and met it (None: learnt in this run)."""
        records = [(t, TrialRecord.from_trial(t)) for t in study.get_trials(deepcopy=False)]
        good = {tuple(sorted(t.params.items())): t.number for t, rec in records
                if t.state.name == "COMPLETE" and worked(rec)}
        out: dict[str, int | None] = dict.fromkeys(self.learned)
        for t, rec in records:
            if (n := good.get(tuple(sorted(t.params.items())))) is not None:
                for text in failures_of(rec):
                    out.setdefault(signature(text), n)
        return out

    # -- judging ---------------------------------------------------------------------------------
    def judge(self, study: optuna.Study, number: int | None, config: ServeConfig, measure: Callable[[], Evaluation],
              reject: Callable[[ConfigRejected, float], Evaluation]) -> Evaluation:
        """``measure()`` judged: its evaluation when it measures (or vLLM refuses a knob), the
        configuration's refusal when the experiment says so (``reject`` makes one of a
        disruption), else :class:`EnvironmentFault` (``kind`` ``transient``, ``control``,
        ``same_failure`` or ``undecided``; its ``blame`` and ``gpu_s`` set)."""
        failures: list[Failure] = []
        while True:
            outcome = self._attempt(measure)
            if not isinstance(outcome, Failure):
                if failures:
                    self.learned.update(f.signature for f in failures)
                    self._count(failures, 0.0)
                    outcome = _judged(outcome, failures, "measured", None, 0.0, "")
                return outcome
            failures.append(outcome)
            seen = self.machine_failures(study)
            known = outcome.signature in seen
            if len(failures) >= MAX_STARTS or not (len(failures) == 1 or known):
                break
            self.observer.on_warning(f"{outcome.message[:200]}: started again to see whose fault it is")
        if known:
            who = seen[failures[-1].signature]
            met = "a configuration that works here" if who is None else f"trial {who}'s configuration, which works here"
            raise self._fault("transient", failures, None, 0.0, f"{failures[-1].message} ({len(failures)} starts in a "
                              f"row; {met} met the same failure): a fault of the machine, not of this configuration")
        return self._after_two(study, number, config, failures, measure, reject)

    def _after_two(self, study: optuna.Study, number: int | None, config: ServeConfig, failures: list[Failure],
                   measure: Callable[[], Evaluation],
                   reject: Callable[[ConfigRejected, float], Evaluation]) -> Evaluation:
        """Two unexplained failures of ``config``: the control decides, or the rules before one exists."""
        last = failures[-1]
        control = control_of(study, config)
        if control is not None:
            k, k_config = control
            kfail, spent = self._control(k, k_config)
            if kfail is not None:
                self.learned.update({last.signature, kfail.signature})
                raise self._fault("control", failures, k, spent, f"{last.message}; a start of trial {k}'s "
                                  f"configuration, which worked on this machine before, failed too "
                                  f"({kfail.message[:200]}): the machine is at fault, not this configuration (see "
                                  "its log, dmesg, nvidia-smi)")
            again = self._attempt(measure)  # once more: two failures of a passing fault are one in eleven
            if not isinstance(again, Failure):
                self.learned.update(f.signature for f in failures)
                self._count(failures, spent, controls=1)
                return _judged(again, failures, "measured", k, spent, "")
            failures.append(again)
            self._count(failures[:-1], spent, controls=1)
            why = (f"trial {k}'s configuration served on this machine between its failures "
                   f"({len(failures)} starts)")
            return _judged(_refusal(again, reject), failures, "configuration", k, spent, why)
        verdict, other = self._by_rule(study, number, config, last)
        if verdict == "configuration":
            self._count(failures[:-1], 0.0)
            why = (f"trial {other}'s configuration, which differs in {', '.join(named_knobs(last.message))}, failed "
                   "alike with its own value")
            return _judged(_refusal(last, reject), failures, "configuration", None, 0.0, why)
        if verdict == "environment":
            raise self._fault("same_failure", failures, None, 0.0, f"{last.message}: trial {other}'s configuration, "
                              "which differs, failed with the same line and none has worked yet: a fault of the "
                              "machine; start the command in the log by hand to see it")
        raise self._fault("undecided", failures, None, 0.0, f"{last.message}: no configuration has worked on this "
                          "machine yet to tell whose fault this is; it is judged again once one has")

    def _by_rule(self, study: optuna.Study, number: int | None, config: ServeConfig,
                 failure: Failure) -> tuple[str, int | None]:
        """Before any configuration has worked: ``configuration``, ``environment`` or
        ``undecided``, and the trial whose failure decided it (rule 4 of the module docstring)."""
        named = named_knobs(failure.message)
        mine = _masked(failure.message, config, named)
        for t in study.get_trials(deepcopy=False):
            rec = TrialRecord.from_trial(t)
            if t.number == number or rec.config is None or rec.config == config:
                continue
            for text in failures_of(rec):
                if named and _masked(text, rec.config, named) == mine \
                        and any(getattr(rec.config, k, None) != getattr(config, k, None) for k in named):
                    return "configuration", t.number
                if not named and signature(text) == failure.signature:
                    return "environment", t.number
        return "undecided", None

    def _attempt(self, measure: Callable[[], Evaluation]) -> Evaluation | Failure:
        t0 = time.monotonic()
        try:
            ev = measure()
        except Disrupted as err:
            return Failure("disrupted", err.message, self._spent(t0))
        rec = ev.record
        if rec.rejected_at == "start" and rec.rejected_kind in UNPINNED:
            return Failure(rec.rejected_kind, rec.infeasible_reason or rec.rejected_kind, ev.gpu_s, ev)
        return ev

    def _spent(self, since: float) -> float:
        return time.monotonic() - since if self.backend.measures_gpu_time else 0.0

    def _control(self, number: int, config: ServeConfig) -> tuple[Failure | None, float]:
        """Start trial ``number``'s configuration and replay a few requests: its failure
        (None when it served) and the GPU seconds it took."""

        self.observer.on_phase(f"control: starting trial {number}'s configuration")
        t0 = time.monotonic()
        why: str | None = None
        try:
            with self.backend.start(self.deployment, config) as inst:
                sample = self.workload.take(slice(0, min(CONTROL_REQUESTS, len(self.workload))))
                result = inst.run(sample, Concurrency(CONTROL_USERS))
                errors = result.error_counts()
                why = disruption(result) or (f"{sum(errors.values())} of {len(result)} requests failed: "
                                             f"{', '.join(errors)}" if errors else None)
        except (ConfigRejected, BackendError) as err:  # EnvironmentFault is a BackendError's sibling: below
            why = getattr(err, "message", None) or str(err)
        except EnvironmentFault as err:
            why = f"{err.kind}: {err.message}"
        spent = self._spent(t0)
        return (Failure("control", why, spent) if why else None), spent

    def _count(self, extra: list[Failure], control_s: float, controls: int = 0) -> None:
        self.extra_starts += len(extra) + controls
        self.gpu_s += sum(f.gpu_s for f in extra) + control_s
        self.controls += controls
        self.control_gpu_s += control_s

    def _fault(self, kind: str, failures: list[Failure], control: int | None, control_s: float,
               message: str) -> EnvironmentFault:
        """The environment's fault: the first start was the trial's own, the rest and the control extra."""
        self._count(failures[1:], control_s, controls=int(control is not None))
        err = EnvironmentFault(kind, message)
        err.blame = _blame(failures, "undecided" if kind == "undecided" else "environment", control, control_s)
        err.gpu_s = sum(f.gpu_s for f in failures) + control_s
        return err


def _blame(failures: list[Failure], verdict: str, control: int | None, control_s: float) -> dict[str, Any]:
    return {"verdict": verdict, "starts": len(failures) + (verdict == "measured"),
            "failures": [f.message[:500] for f in failures], "control": control,
            "control_gpu_s": round(control_s, 3) if control is not None else None,
            "gpu_s": round(sum(f.gpu_s for f in failures) + control_s, 3)}


def _refusal(last: Failure, reject: Callable[[ConfigRejected, float], Evaluation]) -> Evaluation:
    """The last failure as the configuration's refusal: the refused start's own, or one made of a disruption."""
    return last.evaluation if last.evaluation is not None else reject(ConfigRejected("disrupted", last.message),
                                                                      last.gpu_s)


def _judged(ev: Evaluation, failures: list[Failure], verdict: str, control: int | None, control_s: float,
            why: str) -> Evaluation:
    """``ev`` with how it was judged: the failures met, the control, and their GPU seconds
    added to the trial's (a refusal already counts its own start)."""
    import dataclasses

    extra = sum(f.gpu_s for f in (failures if verdict == "measured" else failures[:-1])) + control_s
    rec = ev.record.replace(blame=_blame(failures, verdict, control, control_s), gpu_s=(ev.record.gpu_s or 0.0) + extra)
    if why:
        rec = rec.replace(infeasible_reason=f"{rec.infeasible_reason} (the configuration's fault: {why})")
    return dataclasses.replace(ev, record=rec, gpu_s=ev.gpu_s + extra)


__all__ = ["MAX_STARTS", "UNPINNED", "Failure", "Referee", "control_of", "failures_of", "itl_tail", "named_knobs",
           "signature", "started", "worked"]
