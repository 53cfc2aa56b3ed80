"""Search spaces: which vLLM knobs a study varies, over which ranges, on which
deployment, against which workload and TTFT target. Read from YAML
(``search_spaces/*.yaml``); see ``search_spaces/default.yaml`` for every key.

A knob is either a fixed value (``block_size: 16``), a range
(``{low: 16, high: 512, log: true}``, ``step`` optional) or a list of choices
(``{choices: [auto, fp8]}``). Layouts (tensor-parallel size x replicas) are one
categorical parameter named ``layout`` with values such as ``tp2x4`` so that the
sampler sees a fixed distribution; ``layouts: auto`` takes every power-of-two TP that
divides the attention heads, with as many replicas as the GPUs hold.

The package, one module per noun: ``search_space`` (:class:`SearchSpace`,
:func:`space_difference`), ``param`` (:class:`Param`, layouts), ``workload``
(:class:`WorkloadSpec` and its limits), ``knob_values`` (:data:`KNOB_TYPES`, :func:`pin_value`),
``reader`` (:func:`load_space`, :func:`parse_space`, the shipped spaces), ``parameters`` (the
``parameters`` and ``layouts`` sections) and ``checks`` (a file's keys). Every public name is
imported here.
"""
from __future__ import annotations

from tuner.space.knob_values import KNOB_TYPES, pin_value
from tuner.space.param import LAYOUT_PINS, Param, choice_param, layout_name, parse_layout, pin_layout_value
from tuner.space.parameters import MAX_CHOICES
from tuner.space.reader import MAX_NAME, SHIPPED_DIR, list_spaces, load_space, parse_space, resolve_space_path
from tuner.space.search_space import SearchSpace, space_difference
from tuner.space.workload import (
    LOAD_KINDS,
    MAX_RATE,
    MAX_REQUESTS,
    MAX_TTFT_S,
    MIN_RATE,
    SEED_LIMIT,
    WorkloadSpec,
)

__all__ = [
    "KNOB_TYPES",
    "pin_value",
    "LAYOUT_PINS",
    "pin_layout_value",
    "Param",
    "choice_param",
    "layout_name",
    "parse_layout",
    "MAX_CHOICES",
    "MAX_NAME",
    "SHIPPED_DIR",
    "list_spaces",
    "load_space",
    "parse_space",
    "resolve_space_path",
    "SearchSpace",
    "space_difference",
    "LOAD_KINDS",
    "MAX_RATE",
    "MAX_REQUESTS",
    "MAX_TTFT_S",
    "MIN_RATE",
    "SEED_LIMIT",
    "WorkloadSpec",
]
