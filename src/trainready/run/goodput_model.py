"""The shape of a run's goodput: what `trainready report` shows and `report --json` holds under
`goodput` (schema run-summary). Computed by run/goodput.py from telemetry.jsonl and run.json.

Every second of billed time (the wall time of every launch, as the budget counts it) lands in
exactly one bucket: `productive` (goodput) or one cause of badput, so the buckets add up to
`billed_s`. `idle_between_launches` is the one cause outside billed time (no launcher ran); it is
listed for what it would cost if the nodes were kept. A cause that could not be measured has
`seconds` None (unknown), never 0.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

GOODPUT_SCHEMA_VERSION = 1

Cause = Literal["startup", "restore", "data_wait", "ckpt_stall", "lost_progress", "straggler_wait", "shutdown", "other",
                "idle_between_launches"]


class BadputCause(BaseModel):
    """One cause of badput, in the order a waterfall draws them (billed time minus each cause = goodput)."""

    model_config = ConfigDict(extra="forbid")
    cause: Cause = Field(description="machine name of the cause")
    label: str = Field(description="short human label, e.g. 'start-up'")
    description: str = Field(description="what the time is and how it was measured")
    seconds: float | None = Field(description="time lost to this cause; None = not measured (unknown, not zero)")
    hours: float | None = Field(description="seconds / 3600")
    usd: float | None = Field(description="at the run's price: hours x $/node-hour x nodes; None without a price or "
                                          "when the time is unknown")
    share: float | None = Field(description="fraction of billed time (0-1); None when unknown or outside billed time")
    in_billed: bool = Field(description="True: part of billed time (the causes with True plus productive add up to "
                                        "billed_s); False: idle between launches, not billed by the budget")
    unmeasured_steps: int = Field(0, description="kept steps whose record did not measure this cause (their time "
                                                 "counts as productive: goodput is then an upper bound)")


class LaunchGoodput(BaseModel):
    """One launch of `trainready run` (a run directory's run.json launches, or rebuilt from telemetry)."""

    model_config = ConfigDict(extra="forbid")
    index: int = Field(description="0-based launch number")
    start_unix: float = Field(description="launch start, unix seconds")
    end_unix: float = Field(description="launch end (or its last telemetry record when the launcher was killed)")
    billed_s: float = Field(description="end - start")
    outcome: str = Field(description="finished | stopped | interrupted | failed | killed | running | unknown")
    attempts: int = Field(description="worker starts in this launch (1 + torchrun restarts)")
    restored_step: int | None = Field(description="checkpoint the first attempt restored (None: fresh start)")
    first_step: int | None = Field(description="first step run in this launch")
    last_step: int | None = Field(description="last step run in this launch")
    steps_run: int = Field(description="step records in this launch")
    steps_lost: int = Field(description="of those, steps outside the final lineage (recomputed later or never saved)")
    productive_s: float = Field(description="goodput seconds in this launch")
    causes_s: dict[str, float] = Field(description="badput seconds in this launch by cause (measured causes only)")


class RankStats(BaseModel):
    """One rank's step times over the sampled steps (step records carry every rank's times)."""

    model_config = ConfigDict(extra="forbid")
    rank: int
    samples: int = Field(description="steps with this rank's times")
    step_s_min: float
    step_s_median: float
    step_s_max: float
    work_s_median: float | None = Field(description="median of step time minus exposed communication (time the rank "
                                                    "was busy rather than waiting for peers); None: comm not measured")
    straggler_score: float | None = Field(description="this rank's median work (or step time when work is unknown) / "
                                                      "the median over ranks; 1.0 = typical, 1.2 = 20% slower")
    slowest_steps: int = Field(description="sampled steps in which this rank had the most work (or the longest step)")


class RankWindow(BaseModel):
    """Per-rank medians over a window of consecutive sampled steps: one column of a heatmap."""

    model_config = ConfigDict(extra="forbid")
    first_step: int
    last_step: int
    step_s: list[float | None] = Field(description="median step time per rank (index = rank)")
    work_s: list[float | None] = Field(description="median work per rank (index = rank); None where comm was not measured")


class GoodputReport(BaseModel):
    """Share of billed time that produced steps kept in the final lineage, and where the rest went."""

    model_config = ConfigDict(extra="forbid")
    schema_version: int = GOODPUT_SCHEMA_VERSION
    billed_s: float = Field(description="wall time of every launch, start-up and shutdown included (the budget's count)")
    billed_hours: float
    billed_source: Literal["run.json", "telemetry"] = Field(description="where launch times came from")
    usd_per_hour: float | None = Field(description="price per node-hour (--instance catalog or --usd-per-hour)")
    nnodes: int
    billed_usd: float | None = Field(description="billed hours x $/node-hour x nodes")
    productive_s: float = Field(description="time of kept steps not spent on a measured cause of badput")
    productive_usd: float | None
    goodput: float | None = Field(description="productive_s / billed_s (0-1); None when nothing was billed")
    upper_bound: bool = Field(description="True when some kept step did not measure data wait or the wait for the "
                                          "slowest rank: that time is counted as productive")
    causes: list[BadputCause] = Field(description="badput by cause, waterfall order; the in_billed ones plus "
                                                  "productive_s add up to billed_s")
    steps_kept: int = Field(description="step executions in the final lineage")
    steps_lost: int = Field(description="step executions outside it (recomputed after a crash, or never saved)")
    launches: list[LaunchGoodput]
    world_size: int | None
    ranks: list[RankStats] = Field(description="per-rank step times, by rank")
    slowest_ranks: list[int] = Field(description="up to 3 ranks with straggler_score >= 1.05, slowest first")
    rank_windows: list[RankWindow] = Field(description="per-rank medians over at most 60 windows of steps (heatmap)")
    timing_sources: dict[str, int] = Field(description="step records by how the step split was measured: 'host' "
                                                       "clocks or 'cuda-events'")
    skipped: dict[str, int] = Field(description="records or fields skipped as malformed, by reason")
    notes: list[str] = Field(description="what the figures assume, in words")
