"""matplotlib figures as inline SVG, and the few data reductions the charts need.

Every chart is a `matplotlib.figure.Figure` (no pyplot: no global state, no GUI backend) saved
as SVG with text kept as <text> (`svg.fonttype: none`: smaller, selectable, no font files), ids
salted per chart so two charts on one page never share a clip-path id, and no date in the
metadata so the same input gives the same bytes. The artists that carry data get a gid starting
with `mark-`: the tests look for those in the page Chromium rendered.
"""

from __future__ import annotations

import contextlib
import io
import math
from collections.abc import Sequence

from trainready.errors import UsageError
from trainready.run.records import finite

INSTALL = "pip install 'trainready[report]'"
# Colours: matplotlib's default cycle (tab10), named here so every chart uses the same one per part.
PART_COLOURS = {"compute": "#1f77b4", "data": "#ff7f0e", "comm": "#2ca02c", "optimizer": "#9467bd",
                "unattributed": "#8c564b", "other": "#c7c7c7"}
_PLAIN = {float, int, type(None)}  # exact types: a bool or a string is not a number here
MAX_POINTS = 1000  # a 1280-pixel chart cannot show more; longer series are reduced to bins


def require_matplotlib() -> None:
    """A usage error naming the extra, before anything else is read, when matplotlib (and numpy,
    which it brings) is missing."""
    try:
        import matplotlib  # noqa: F401
        import numpy  # noqa: F401
    except ImportError:
        raise UsageError(f"--html needs matplotlib: {INSTALL}") from None


def load_matplotlib():
    """matplotlib's Figure and SVG canvas (no pyplot), or a usage error naming the extra when it is missing."""
    try:
        from matplotlib.backends.backend_svg import FigureCanvasSVG
        from matplotlib.figure import Figure
    except ImportError:
        raise UsageError(f"--html needs matplotlib: {INSTALL}") from None
    return Figure, FigureCanvasSVG


def matplotlib_figure(width_in: float, height_in: float, *, left: float = 0.8, right: float = 0.25,
                      bottom: float = 0.55, top: float = 0.15):
    """A Figure on the SVG canvas, or a usage error naming the extra when matplotlib is missing.
    Margins in inches, fixed (constrained layout measured every label: a third of the render time)."""
    Figure, FigureCanvasSVG = load_matplotlib()
    fig = Figure(figsize=(width_in, height_in), dpi=100)
    fig.subplots_adjust(left=left / width_in, right=1 - right / width_in, bottom=bottom / height_in,
                        top=1 - top / height_in, hspace=0.12 * 4 / height_in)
    FigureCanvasSVG(fig)
    return fig


def to_svg(fig, salt: str) -> str:
    """The figure as an <svg> element (XML prolog and DOCTYPE dropped: it goes inside HTML)."""
    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": salt}):
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    text = buf.getvalue()
    return text[text.index("<svg"):]


def style_axes(ax, *, xlabel: str, ylabel: str) -> None:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, color="#e5e5e5", linewidth=0.6)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def column(records: Sequence[dict], key: str):
    """records[i][key] as a float array: NaN where it is missing, not a number (a bool, a string) or not finite."""
    return numbers([r.get(key) for r in records])


def numbers(values: Sequence[object]):
    """A float array: NaN where a value is missing, not a number (a bool, a string), not finite or an
    integer past a float's range (10**400)."""
    import numpy as np

    array = None
    if set(map(type, values)) <= _PLAIN:  # the common case, converted in C (None -> NaN)
        with contextlib.suppress(OverflowError):
            array = np.array(values, dtype=float)
    if array is None:
        array = np.array([np.nan if (f := finite(v)) is None else f for v in values], dtype=float)
    array[~np.isfinite(array)] = np.nan
    return array


def reduce_series(xs: Sequence[float], ys: Sequence[float | None], max_points: int = MAX_POINTS
                  ) -> tuple[list[float], list[float], list[float], list[float]]:
    """(x, mean, min, max) per bin of consecutive points, at most `max_points` bins; missing
    values are skipped. Short series come back point by point (min = max = the value)."""
    import numpy as np

    x = np.asarray(xs, dtype=float)
    y = ys if isinstance(ys, np.ndarray) else np.array([np.nan if v is None else v for v in ys], dtype=float)
    keep = ~np.isnan(y)
    x, y = x[keep], y[keep]
    n = len(y)
    if not n:
        return [], [], [], []
    size = max(1, math.ceil(n / max(1, max_points)))
    starts = np.arange(0, n, size)
    counts = np.diff(np.append(starts, n))
    return ((np.add.reduceat(x, starts) / counts).tolist(), (np.add.reduceat(y, starts) / counts).tolist(),
            np.minimum.reduceat(y, starts).tolist(), np.maximum.reduceat(y, starts).tolist())


def reduce_stack(xs: Sequence[float], columns: dict[str, Sequence[float]], max_points: int = MAX_POINTS
                 ) -> tuple[list[float], dict[str, list[float]]]:
    """Means of every column per bin of consecutive rows (a stacked chart's bins still add up)."""
    import numpy as np

    n = len(xs)
    size = max(1, math.ceil(n / max_points))
    starts = np.arange(0, n, size)
    counts = np.diff(np.append(starts, n))

    def means(col: Sequence[float]) -> list[float]:
        return (np.add.reduceat(np.asarray(col, dtype=float), starts) / counts).tolist()

    return means(xs), {k: means(col) for k, col in columns.items()}
