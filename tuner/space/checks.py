"""The shape of a space file's YAML: what a value is, in words, and keys checked against the known."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tuner.core.values import shown

if TYPE_CHECKING:
    from tuner.space.search_space import SearchSpace


def kind(value: Any) -> str:
    """What a YAML value is, in words: "a list", "text", "nothing"."""
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return "true/false"
    kinds = {str: "text", int: "a number", float: "a number", list: "a list", dict: "a mapping"}
    return kinds.get(type(value), f"a {type(value).__name__}")


def check_keys(space: SearchSpace, data: Any, known: Any, where: tuple[Any, ...]) -> None:
    if not isinstance(data, dict):
        raise space.error(f"expected a mapping of keys, got {kind(data)}: {shown(data)}", where)
    for key in data:
        if key not in known:
            raise space.error(
                f"unknown key {shown(key)}", where + (key,), hint=f"known keys: {', '.join(sorted(known))}"
            )

