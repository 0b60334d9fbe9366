"""How sure an estimate is: GPUs whose efficiency factors are assumed give a range, not a point.

The factors of efficiency.ARCH are measured (Hopper, on an H200), published (Ampere) or
assumed (Blackwell, Ada, Volta, anything else). An assumed architecture carries a
(pessimistic, optimistic) range of its GEMM and attention factors; the step is estimated at
both ends, and time and cost follow from each. `plan` ranks such setups by the pessimistic
end unless asked to be optimistic, so a GPU nobody measured cannot win on an assumption.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from pydantic import BaseModel, Field

from . import efficiency as eff
from .performance import estimate_step
from .setup import Setup
from .track_record import TrackRecord, track_record
from .units import hours_text, usd_text


class Range(BaseModel):
    pessimistic: float
    optimistic: float


class ConfidenceInfo(BaseModel):
    level: Literal["normal", "low"] = Field(description="low: the GPU's efficiency factors are assumed, not measured")
    efficiency_factors: eff.Confidence = Field(description="measured, published (others' measurements) or assumed")
    source: str = Field(description="where the factors come from")
    reason: str | None = Field(None, description="why the confidence is low, in words")
    tokens_per_s: Range | None = None
    train_hours: Range | None = Field(None, description="with --tokens")
    total_usd: Range | None = Field(None, description="with --tokens and a price")
    usd_per_billion_tokens: Range | None = None
    track_record: TrackRecord | None = Field(
        None, description="how far the planner's tokens/s was off on measured runs of this setup's regime (dense or "
                          "MoE, sequence length, precision, GPU architecture, stack; plan/track_record.py); None: the "
                          "estimate uses calibrated factors (the record is the shipped model's), fewer than 8 runs of "
                          "its kind, or the record could not be read")


Costs = Callable[[float], tuple[float | None, float | None, float | None]]
"""tokens/s -> (train hours or None, total usd or None, usd per 1B tokens or None)."""


def _factors(s: Setup) -> eff.ArchEfficiency:
    """The setup's calibrated factors (plan/calibration.py), else its architecture's."""
    return s.efficiency or eff.arch_efficiency(s.gpu.arch)


def _bounds(s: Setup) -> tuple[eff.ArchEfficiency, eff.ArchEfficiency] | None:
    return _factors(s).bounds()


def is_assumed(s: Setup) -> bool:
    """Whether the efficiency factors of `s`'s GPU are assumed (its estimates are a range)."""
    return _bounds(s) is not None


def tokens_per_s_range(s: Setup, tps: float) -> Range | None:
    """tokens/s at the two ends of an assumed range (the point estimate `tps` lies between)."""
    b = _bounds(s)
    if b is None:
        return None
    lo, hi = (estimate_step(s, e).tokens_per_s for e in b)
    return Range(pessimistic=min(lo, hi, tps), optimistic=max(lo, hi, tps))


def ranking_tokens_per_s(s: Setup, tps: float, optimistic: bool) -> float:
    """What `plan` ranks a setup by: its point estimate where the factors are measured or
    published (or when `optimistic`), else the pessimistic end of its range."""
    if optimistic:
        return tps
    r = tokens_per_s_range(s, tps)
    return tps if r is None else r.pessimistic


def _span(lo: float | None, hi: float | None) -> Range | None:
    return None if lo is None or hi is None else Range(pessimistic=lo, optimistic=hi)


def confidence_info(s: Setup, tps: float, costs: Costs) -> ConfidenceInfo:
    e = _factors(s)
    r = tokens_per_s_range(s, tps)
    record = None if s.efficiency is not None else track_record(s)  # the shipped model's record, not a calibrated one
    if r is None:
        return ConfidenceInfo(level="normal", efficiency_factors=e.confidence, source=e.source, track_record=record)
    slow, fast = costs(r.pessimistic), costs(r.optimistic)
    reason = (f"efficiency factors for {s.gpu.arch} ({s.gpu.name}) are {e.confidence}, not measured: "
              f"GEMM {e.gemm_range[0]:g}-{e.gemm_range[1]:g}, attention {e.attention_range[0]:g}-"
              f"{e.attention_range[1]:g} of peak ({e.range_source})" if e.gemm_range and e.attention_range
              else f"efficiency factors for {s.gpu.arch} are {e.confidence}, not measured ({e.range_source})")
    return ConfidenceInfo(level="low", efficiency_factors=e.confidence, source=e.source, reason=reason,
                          tokens_per_s=r, train_hours=_span(slow[0], fast[0]), total_usd=_span(slow[1], fast[1]),
                          usd_per_billion_tokens=_span(slow[2], fast[2]), track_record=record)


def summary(c: ConfidenceInfo) -> str | None:
    """One line for warnings and tables: the ranges, pessimistic end first."""
    if c.level != "low" or c.tokens_per_s is None:
        return None
    t = c.tokens_per_s
    parts = [f"{t.pessimistic:,.0f} to {t.optimistic:,.0f} tokens/s"]
    if c.train_hours:
        parts.append(f"{hours_text(c.train_hours.optimistic)} to {hours_text(c.train_hours.pessimistic)}")
    if c.total_usd:
        parts.append(f"{usd_text(c.total_usd.optimistic)} to {usd_text(c.total_usd.pessimistic)}")
    elif c.usd_per_billion_tokens:
        u = c.usd_per_billion_tokens
        parts.append(f"{usd_text(u.optimistic)} to {usd_text(u.pessimistic)} per 1B tokens")
    return "low confidence: " + ", ".join(parts) + f"; {c.reason}"


def short(c: ConfidenceInfo, by_cost: bool = True) -> str | None:
    """A plan row's note: what is assumed and the range of what it is ranked by."""
    if c.level != "low" or c.tokens_per_s is None:
        return None
    t = c.tokens_per_s
    figures = [f"{t.pessimistic:,.0f} to {t.optimistic:,.0f} tokens/s"]
    money = c.total_usd or c.usd_per_billion_tokens
    if by_cost and money:
        figures.append(f"{usd_text(money.optimistic)} to {usd_text(money.pessimistic)}"
                       + ("" if c.total_usd else " per 1B tokens"))
    elif c.train_hours:
        figures.append(f"{hours_text(c.train_hours.optimistic)} to {hours_text(c.train_hours.pessimistic)}")
    return f"low confidence ({c.efficiency_factors} efficiency factors): " + ", ".join(figures)
