"""vLLM's own defaults as a study's first trials, repaired until vLLM would start them."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tuner.core.errors import ConfigRejected, InputError
from tuner.serving.config import ServeConfig
from tuner.sim.memory import plan_memory
from tuner.space import parse_layout

if TYPE_CHECKING:
    from tuner.space import SearchSpace


def default_trials(space: SearchSpace) -> list[dict[str, Any]]:
    """Trial params of vLLM's own defaults at each layout of the space (knobs left unset,
    resolved by the memory planner for this GPU and vLLM version, then snapped to the
    nearest value the space allows). A new TPE/GP study runs these first: it always holds
    the out-of-the-box answer to compare with, and its model starts from a sound point in
    every layout, the knob that matters most."""

    out = []
    for layout in space.layout_choices:
        tp, replicas = parse_layout(layout)
        config = ServeConfig(tensor_parallel_size=tp, replicas=replicas, **dict(space.fixed))
        try:  # strict=False: the defaults resolve even where vLLM would refuse them
            from tuner.sim.memory import plan_memory

            facts = plan_memory(space.deployment, config, strict=False).summary()
        except (ConfigRejected, InputError):
            facts = {}
        params = {p.key: p.encode(p.nearest(facts.get(p.name, getattr(config, p.name)))) for p in space.params}
        if len(space.layout_choices) > 1:
            params["layout"] = layout
        params = startable(space, params)
        if params not in out:
            out.append(params)
    return out


def snapped_grid(space: SearchSpace) -> dict[str, list[Any]]:
    """``space.grid()`` with range values snapped onto their steps (valid trial params)."""
    grid = space.grid()
    for p in space.params:
        if p.key in grid:
            grid[p.key] = list(dict.fromkeys(p.encode(p.nearest(p.decode(v))) for v in grid[p.key]))
    return grid


def startable(space: SearchSpace, params: dict[str, Any]) -> dict[str, Any]:
    """``params`` if vLLM would start them, else the same with the fewest knobs moved: one
    knob to the nearest of its grid values that the memory planner accepts (snapping vLLM's
    defaults into a space can make them refuse, e.g. max-num-batched-tokens below
    max-model-len without chunked prefill; a refused first trial would teach the sampler
    that the rest of it is infeasible). Unchanged when no single knob helps."""

    def starts(candidate: dict[str, Any]) -> bool:
        try:
            plan_memory(space.deployment, space.config_from_params(candidate))
        except (ConfigRejected, InputError):
            return False
        return True

    if starts(params):
        return params
    grid = snapped_grid(space)
    for p in space.params:
        here = p.decode(params[p.key])
        values = list(grid.get(p.key, []))
        if isinstance(here, (int, float)) and not isinstance(here, bool):
            values.sort(key=lambda v: abs(float(p.decode(v)) - float(here)))
        for value in values:
            if value != params[p.key] and starts({**params, p.key: value}):
                return {**params, p.key: value}
    return params
