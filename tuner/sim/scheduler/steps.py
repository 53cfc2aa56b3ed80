"""What the engine reports: :class:`StepOutput` (one :meth:`EngineCore.step`) and
:class:`Advance` (one :meth:`EngineCore.advance`), and the index array type of the
per-request tables."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

_I = np.int64
_EMPTY = np.zeros(0, dtype=_I)


@dataclass(slots=True)
class StepOutput:
    """What one call of :meth:`EngineCore.step` did."""

    duration_s: float
    new_tokens: dict[str, int] = field(default_factory=dict)
    finished: list[str] = field(default_factory=list)
    num_preempted: int = 0


@dataclass(slots=True)
class Advance:
    """What one :meth:`EngineCore.advance` did: ``steps`` engine steps ending at ``end_s``."""

    end_s: float
    steps: int
    finished: np.ndarray          # request indices that completed (their last token at end_s)
    num_preempted: int = 0
    deferred: bool = False        # a planned decode run: finished comes from commit_run()
