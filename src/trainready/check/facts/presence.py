"""Is there a GPU at all, and how many: the answer every GPU check needs before it judges anything.
One root cause, one finding: gpu.count reports no GPU, the checks that need one point at it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .gpu import QUERY

if TYPE_CHECKING:
    from . import Facts


@dataclass
class Presence:
    """How many GPUs the bundle shows, and from where."""

    count: int | None  # None: nothing in the bundle can tell
    source: str = ""
    why: str = ""  # when count is 0/None, or a GPU tool is missing: why, in the tool's own words
    exact: bool = True  # False: a lower bound (an output cut short or elided)


def presence(f: Facts) -> Presence:
    inv, bundle = f.inventory, f.bundle
    best = max(inv.reachable, key=lambda s: s.value, default=None)
    if best is not None and best.value:
        return Presence(best.value, best.source)
    low = max(inv.at_least, key=lambda s: s.value, default=None)
    if low is not None and low.value:
        return Presence(low.value, low.source, "the output is cut short or elided: at least this many", exact=False)
    if inv.no_gpu is not None:
        return Presence(0, inv.no_gpu.source, f"nvidia-smi listed no GPU: {inv.no_gpu.value}")
    state = bundle.probe_state(QUERY)
    if state in ("failed", "empty"):
        return Presence(0, "nvidia-smi", bundle.why_missing(QUERY) if state == "failed" else "nvidia-smi listed no GPU")
    if inv.torch is not None and inv.torch.value > 0:
        return Presence(inv.torch.value, "torch (cuda.json)", bundle.why_missing(QUERY))
    if state == "not-installed":
        return Presence(0, "nvidia-smi", bundle.why_missing(QUERY))
    if inv.unreadable:
        first = f.paste(inv.unreadable[0])
        line = next((x.strip() for x in (first.text if first else "").splitlines() if x.strip()), "(empty output)")
        return Presence(None, "", f"nvidia-smi output unreadable ({inv.unreadable[0]}: first line {line[:80]!r})")
    return Presence(None, "", f"{bundle.why_missing(QUERY)}; nothing else in the bundle counts GPUs")


def no_gpu_reason(f: Facts) -> str | None:
    """Why a GPU check cannot run because there is no GPU (gpu.count says more); None otherwise."""
    if f.inventory.lost:
        return None
    seen = presence(f)
    if seen.count == 0:
        return "CPU-only node (--cpu-only): no GPU to check" if f.ctx.cpu_only else "no GPU visible: see gpu.count"
    return None


