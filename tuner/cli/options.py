"""The choices that several commands take, as enums: ``--help`` lists them, click refuses
anything else in one line (``tuner: invalid value for '--backend': ...``), and each
option means the same in every command that has it."""
from __future__ import annotations

from enum import Enum


class Backend(str, Enum):
    """What a trial or a plan runs on."""

    sim = "sim"            # the embedded simulator of vLLM: no GPU
    vllm = "vllm"          # real vLLM processes, restarted per configuration
    endpoint = "endpoint"  # a server someone else runs


class Sampler(str, Enum):
    """Optuna's samplers (tuner.search.SAMPLERS)."""

    tpe = "tpe"
    gp = "gp"
    random = "random"
    grid = "grid"


class Output(str, Enum):
    """``--output`` everywhere: ``text`` for a person, ``json`` for a script."""

    text = "text"
    json = "json"


OUTPUT_HELP = "text: tables for a person; json: one JSON object on stdout, for scripts."

__all__ = ["OUTPUT_HELP", "Backend", "Output", "Sampler"]
