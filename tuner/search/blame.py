"""Whose fault a failed start is, when vLLM's log alone cannot tell: the configuration's
or the machine's.

A start vLLM refuses for a knob of the configuration (:mod:`tuner.backends.vllm_args`)
is the configuration's. What the log cannot pin on one (a ``timeout``: no healthy server
within ``--startup-timeout``; a ``crash``: a death after the engine started that names no
knob) is judged against the study's other trials, by two rules:

* **no start has succeeded yet**: a start that times out before any configuration of the
  study has ever started is the start's fault (a slow disk, a download, a hung GPU), not
  this configuration's: it is measured again once the machine is put right;
* **the same failure for configurations that differ**: the same crash line (numbers aside)
  after a start of another configuration crashed with it says the cause is common to both
  (the first is stored as that configuration's crash: nothing could tell otherwise yet).

Either way :func:`environment_fault` returns an :class:`~tuner.core.errors.EnvironmentFault`
the driver raises: the trial is not stored infeasible, not counted, not shown to the
sampler, and two in a row stop the run (exit 2).
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING

from tuner.core.errors import EnvironmentFault
from tuner.study.record import TrialRecord

if TYPE_CHECKING:
    import optuna

    from tuner.serving.config import ServeConfig

#: Refusal kinds the log could not pin on a knob of the configuration.
UNPINNED = ("timeout", "crash")
_NUMBERS = re.compile(r"\d+(?:\.\d+)?")
_LOG = re.compile(r"\[log: [^\]]*\]")


def signature(reason: str) -> str:
    """A failure's line without the numbers and log paths that differ between starts."""
    return _NUMBERS.sub("#", _LOG.sub("", reason)).strip()


def started(rec: TrialRecord) -> bool:
    """The trial's server started (it measured a load, or recorded a start time)."""
    return bool(rec.loads) or bool(rec.run.startup_s)


def environment_fault(study: optuna.Study, number: int, config: ServeConfig,
                      rec: TrialRecord) -> EnvironmentFault | None:
    """The fault of the machine that trial ``number``'s refused start ``rec`` shows, by the
    rules of the module docstring; None when the configuration is to blame."""
    if rec.rejected_at != "start" or rec.rejected_kind not in UNPINNED:
        return None
    reason = rec.infeasible_reason or ""
    others = [TrialRecord.from_trial(t) for t in study.get_trials(deepcopy=False) if t.number != number]
    if rec.rejected_kind == "timeout" and not any(started(o) for o in others):
        return EnvironmentFault("startup_timeout", f"no configuration of this study has started yet and this one "
                                f"did not either ({reason}): the start is too slow for every configuration, not "
                                "this one's fault; raise --startup-timeout or see why the server hangs in its log")
    if rec.rejected_kind != "crash":  # a slow start after others started is this configuration's own
        return None
    mine = signature(reason)
    for o in others:
        if o.rejected_kind == rec.rejected_kind and o.config is not None and o.config != config \
                and signature(o.infeasible_reason or "") == mine:
            return EnvironmentFault("same_failure", f"a configuration that differs failed with the same line: "
                                    f"{reason}: the cause is common to every configuration, not this one; start "
                                    "the command in the log by hand to see it")
    return None


__all__ = ["UNPINNED", "environment_fault", "signature", "started"]
