"""Whether a replay was disrupted: every stream stalled at one instant for longer than
the serving itself ever pauses.

A server paused from outside (SIGSTOP then SIGCONT: a host that swapped, a debugger, a
noisy neighbour taking the CPU its API server runs on) sends nothing for the length of the
pause, on every stream at once, then goes on as if nothing happened: the replay ends with
plausible streams, one long gap each, at the same instant, and a throughput the
configuration never had. Serving pauses too (a long prefill holds every decode for its
step), but for as long as the serving's own inter-token tail says, not ten times that.

:class:`StallWatch` follows the streams of one replay (the client calls it for each
stream's first chunk, every chunk and its end) and keeps the longest *stall*: a time
during which at least one stream was mid-answer (its first token came, its last had not)
and no chunk came on any stream. :func:`stall_limit` is how long a stall may be before
it is a disruption: :data:`STALL_FACTOR` times the inter-token tail (the study's own,
when it has one, else the replay's, its stalled gaps left out), and at least
:data:`MIN_STALL_S`. :func:`disruption` says what disrupted a result, or None.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from tuner.serving.result import RunResult

#: A stall longer than this many times the inter-token tail disrupts the replay.
STALL_FACTOR = 10.0
#: ... and never one shorter than this (seconds): vLLM's own pauses (a long prefill
#: holding every decode, a CUDA graph replay after a recompilation) stay under it.
MIN_STALL_S = 2.0
#: The inter-token tail: this percentile of the inter-token gaps.
TAIL_PERCENTILE = 99.0


class StallWatch:
    """The longest time of one replay with a stream mid-answer and no chunk on any."""

    def __init__(self) -> None:
        self.streaming = 0              # streams whose first chunk came and whose end did not
        self.last = 0.0                 # the last chunk (or stream start) on any stream
        self.longest = 0.0
        self.at = 0.0                   # when the longest stall began (perf_counter)
        self.streams = 0                # streams mid-answer when it began

    def _gap(self, now: float) -> None:
        if self.streaming and now - self.last > self.longest:
            self.longest, self.at, self.streams = now - self.last, self.last, self.streaming

    def first(self, now: float) -> None:
        """A stream's first content chunk."""
        self._gap(now)
        self.streaming += 1
        self.last = now

    def chunk(self, now: float) -> None:
        """A later content chunk of a stream."""
        self._gap(now)
        self.last = now

    def end(self, now: float) -> None:
        """A stream that had its first chunk ended (its last chunk, an error, a cancel)."""
        self._gap(now)
        self.streaming = max(0, self.streaming - 1)

    def close(self, now: float | None = None) -> None:
        """The replay ended: streams still mid-answer stalled until now."""
        self._gap(time.perf_counter() if now is None else now)


def inter_token_tail(result: RunResult, below: float | None = None) -> float | None:
    """The :data:`TAIL_PERCENTILE` of the result's inter-token gaps (those under ``below``
    seconds when given: a stall's own gaps left out); None without gaps."""
    gaps = result.itl_s
    if gaps is None or not len(gaps):
        return None
    if below is not None:
        gaps = gaps[gaps < below]
    return float(np.percentile(gaps, TAIL_PERCENTILE)) if len(gaps) else None


def stall_limit(result: RunResult, study_tail_s: float | None = None) -> float:
    """How long a stall of ``result`` may last before it is a disruption (see the module
    docstring); ``study_tail_s`` is the study's own inter-token tail, when it has one."""
    own = inter_token_tail(result, below=0.5 * result.stall_s if result.stall_s else None)
    tails = [t for t in (study_tail_s, own) if t is not None and t > 0]
    return max(MIN_STALL_S, STALL_FACTOR * max(tails)) if tails else MIN_STALL_S


def disruption(result: RunResult, study_tail_s: float | None = None) -> str | None:
    """What disrupted ``result`` (a stall longer than :func:`stall_limit`), in words; None
    when nothing did."""
    limit = stall_limit(result, study_tail_s)
    if result.stall_s <= limit:
        return None
    return (f"every stream stalled at once for {result.stall_s:.1f} s ({result.stall_streams} mid-answer, "
            f"{result.stall_at_s:.1f} s into the replay at {result.load_label or 'its load'}), more than the "
            f"{limit:.1f} s the serving's own inter-token tail allows: the server was paused or starved "
            "from outside (a debugger, SIGSTOP, a host that swapped)")


__all__ = ["MIN_STALL_S", "STALL_FACTOR", "StallWatch", "disruption", "inter_token_tail", "stall_limit"]
