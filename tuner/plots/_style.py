"""One look for every figure of a study: the style sheet, the colours, a figure no pyplot
window owns, and PNG bytes of it."""
from __future__ import annotations

import io
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: Marker colour per trial status (analysis.STATUSES).
STATUS_COLORS = {"feasible": "tab:blue", "infeasible": "tab:red", "refused": "tab:grey",
                 "failed": "black", "pruned": "tab:olive", "running": "tab:cyan"}

#: Marker colour per SLO of a study's set, in the order the study lists them (P95 TTFT first).
SLO_COLORS = ("tab:purple", "tab:orange", "tab:brown", "tab:pink", "tab:cyan", "tab:olive")

#: Line colour per configuration of a figure that compares a few (best first).
CONFIG_COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:brown")

#: One look for every figure: Optuna's matplotlib plots use the ggplot style sheet.
STYLE = "ggplot"


def style() -> Any:
    """Style context for drawing; it also undoes the ``plt.style.use`` Optuna's plots make."""
    import matplotlib.pyplot as plt

    return plt.style.context(STYLE)


def styled(fn: Callable[..., Figure]) -> Callable[..., Figure]:
    """Draw ``fn``'s figure in :data:`STYLE`."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Figure:
        with style():
            return fn(*args, **kwargs)

    return wrapper


def figure(width: float = 8.0, height: float = 4.5) -> Figure:
    """A figure that no pyplot window owns (shown once where a notebook displays it)."""
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=100)


def adopt(ax: object, width: float, height: float) -> Figure:
    """Take an Optuna-drawn figure away from pyplot (so that no backend shows it again)."""
    import matplotlib.pyplot as plt

    fig = ax.figure  # type: ignore[attr-defined]
    plt.close(fig)
    fig.set_size_inches(width, height)
    return fig


def png_bytes(fig: Figure, dpi: int = 100) -> bytes:
    """The figure as PNG bytes (tight bounding box, white background)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight", facecolor="white")
    return buf.getvalue()
