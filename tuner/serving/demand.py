"""What a capacity means for the traffic to serve: conversations per minute, replicas
for a demand (with headroom), and cost. Pure arithmetic; :mod:`tuner.plan` applies it to
the capacity it measured (:mod:`tuner.serving.capacity`).

Definitions (article 004, section 7.2, does the same by hand):

* **conversations/min** = requests/s x 60 / requests per conversation when the workload
  has conversation ids; otherwise tokens/s x 60 / tokens per conversation (the article:
  5000 tokens/s x 60 / 300 tokens = 1000 conversations per minute).
* **replicas** = ceil(demand x (1 + headroom) / capacity): headroom is spare capacity on
  top of the demand (20% provisions 1.2x the demand).
* **cost per million tokens** = (GPU-hour price x GPUs of one deployment) / (tokens/s x 3600) x 1e6.
"""
from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from tuner.core.errors import InputError


# -- conversations, demand, replicas, cost -----------------------------------------------
def requests_per_conversation(sessions: Sequence[str | None] | None) -> float | None:
    """Requests / distinct conversations, from per-request conversation ids (a request
    without an id is a conversation of its own); ``None`` when there are no ids."""
    if sessions is None or not any(s is not None for s in sessions):
        return None
    named = [s for s in sessions if s is not None]
    conversations = len(set(named)) + (len(sessions) - len(named))
    return len(sessions) / conversations


def conversations_per_min(*, tokens_per_s: float, requests_per_s: float,
                          tokens_per_conversation: float | None = None,
                          requests_per_conversation: float | None = None) -> float:
    """Tokens/s x 60 / tokens per conversation when that is given (it wins), else
    requests/s x 60 / requests per conversation."""
    if tokens_per_conversation is not None:
        if not tokens_per_conversation > 0:
            raise InputError(f"--tokens-per-conversation must be > 0, got {tokens_per_conversation}")
        return tokens_per_s * 60.0 / tokens_per_conversation
    if requests_per_conversation is None or not requests_per_conversation > 0:
        raise InputError("need tokens or requests per conversation to count conversations")
    return requests_per_s * 60.0 / requests_per_conversation


@dataclass(frozen=True, slots=True)
class Demand:
    """Traffic to serve: ``per_min`` conversations (or requests) per minute."""

    per_min: float
    unit: str = "conversations"

    def __post_init__(self) -> None:
        if not self.per_min >= 0 or not math.isfinite(self.per_min):
            raise InputError(f"demand must be a finite number >= 0 per minute, got {self.per_min}")
        if self.unit not in ("conversations", "requests"):
            raise InputError(f"demand unit must be conversations or requests, got {self.unit!r}")


_DEMAND_RE = re.compile(
    r"\s*([0-9]*\.?[0-9]+(?:e\d+)?)\s*(conversations?|convs?|requests?|reqs?)?\s*"
    r"(?:/|per\s*)?\s*(s|sec|second|m|min|minute|h|hr|hour)?\s*")


def parse_demand(text: str | float, unit: str = "conversations") -> Demand:
    """``"1200/min"``, ``"20/s"``, ``"72000/h"``, ``"1200"`` (per minute), ``"20 req/s"``,
    ``"1200 conv/min"``; the word picks the unit, else ``unit``."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return Demand(float(text), unit)
    m = _DEMAND_RE.fullmatch(str(text).lower())
    if not m:
        raise InputError(f"cannot read demand {text!r}",
                         hint="write 1200/min, 20/s or 72000/h (conversations; add req for requests: 20req/s)")
    per = {"s": 60.0, "sec": 60.0, "second": 60.0, "h": 1 / 60, "hr": 1 / 60, "hour": 1 / 60}.get(m.group(3) or "min", 1.0)  # noqa: E501
    word = m.group(2) or ""
    if word.startswith("req"):
        unit = "requests"
    elif word.startswith("conv"):
        unit = "conversations"
    return Demand(float(m.group(1)) * per, unit)


def replicas_needed(demand_per_min: float, capacity_per_min: float, headroom: float = 0.2) -> int:
    """Deployments needed to serve ``demand_per_min`` with ``headroom`` spare:
    ceil(demand x (1 + headroom) / capacity); 0 for no demand."""
    if not headroom >= 0:
        raise InputError(f"--headroom must be >= 0, got {headroom}")
    if demand_per_min <= 0:
        return 0
    if not capacity_per_min > 0:
        raise InputError("capacity is 0 per minute: no number of replicas serves the demand")
    need = demand_per_min * (1.0 + headroom) / capacity_per_min
    return max(1, math.ceil(need * (1 - 1e-12)))  # 2500 x 1.2 / 1000 is 3.0000000000000004 in floats


def parse_fraction(text: str | float, what: str = "--headroom") -> float:
    """``"20%"``, ``"0.2"`` or ``0.2`` → 0.2."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
    else:
        s = str(text).strip()
        try:
            value = float(s[:-1]) / 100 if s.endswith("%") else float(s)
        except ValueError:
            raise InputError(f"cannot read {what} {text!r}", hint="write 20% or 0.2") from None
    if not value >= 0 or not math.isfinite(value):
        raise InputError(f"{what} must be >= 0, got {text!r}")
    return value


def cost_figures(gpu_hour_cost: float, gpus: int, tokens_per_s: float, output_tokens_per_s: float,
                 replicas: int | None = None) -> dict[str, float | None]:
    """Cost per deployment-hour, per million tokens (in+out) and per million output tokens,
    and per hour for ``replicas`` deployments."""
    if not gpu_hour_cost >= 0:
        raise InputError(f"--gpu-hour-cost must be >= 0, got {gpu_hour_cost}")
    per_hour = gpu_hour_cost * gpus

    def per_million(rate: float) -> float | None:
        return per_hour / (rate * 3600.0) * 1e6 if rate > 0 else None

    return {
        "cost_per_hour": per_hour,
        "total_cost_per_hour": None if replicas is None else per_hour * replicas,
        "cost_per_million_tokens": per_million(tokens_per_s),
        "cost_per_million_output_tokens": per_million(output_tokens_per_s),
    }


__all__ = ["Demand", "conversations_per_min", "cost_figures", "parse_demand", "parse_fraction", "replicas_needed",
           "requests_per_conversation"]
