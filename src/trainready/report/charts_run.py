"""The run report's charts. Each returns (svg, notes) or (None, why it cannot be drawn)."""

from __future__ import annotations

import math
import statistics
from typing import Any

import numpy as np

from trainready.run.records import finite

from .svg import MAX_POINTS, PART_COLOURS, column, matplotlib_figure, numbers, reduce_series, reduce_stack, style_axes, to_svg

WIDTH = 11.5  # inches at 100 dpi: fits a 1200-pixel page
Result = tuple[str | None, Any]


def duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"


def last_per_step(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per step number, the newest (a step recomputed after a crash replaces the lost run of it)."""
    by_step = {r["step"]: r for r in steps if isinstance(r.get("step"), int)}
    return [by_step[k] for k in sorted(by_step)]


def loss(kept: list[dict[str, Any]]) -> Result:
    """`kept`: last_per_step's records."""
    metrics = [r.get("metrics") or {} for r in kept]
    ys = numbers([m.get("loss") for m in metrics])
    x, mean, lo, hi = reduce_series([r["step"] for r in kept], ys)
    if not x:
        return None, "no loss logged: call t.log(loss=loss) inside `with sess.step()`"
    fig = matplotlib_figure(WIDTH, 3.2)
    ax = fig.add_subplot()
    notes = []
    if len(x) < np.count_nonzero(~np.isnan(ys)):
        ax.fill_between(x, lo, hi, color="#1f77b4", alpha=0.18, linewidth=0, gid="mark-loss-range")
        notes.append(f"{len(kept):,} steps in {len(x):,} bins: line = mean, band = min..max of each bin")
    ax.plot(x, mean, color="#1f77b4", linewidth=1.2, gid="mark-loss")
    style_axes(ax, xlabel="step", ylabel="loss")
    skipped = sum(1 for m in metrics if "loss" in (m.get("nonfinite") or []))
    if skipped:
        notes.append(f"{skipped} non-finite loss value(s) left out")
    return to_svg(fig, "loss"), notes


def _attempts(records: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Step records split at every worker start: one line segment per attempt (no line across a gap)."""
    out: list[list[dict[str, Any]]] = [[]]
    for r in records:
        if r.get("type") == "start" and out[-1]:
            out.append([])
        elif r.get("type") == "step":
            out[-1].append(r)
    return [seg for seg in out if seg]


def _time_unit(span_s: float) -> tuple[float, str]:
    if span_s < 120:
        return 1.0, "seconds"
    if span_s < 7200:
        return 60.0, "minutes"
    return 3600.0, "hours"


def throughput(steps: list[dict[str, Any]], records: list[dict[str, Any]], pred: dict[str, Any] | None) -> Result:
    segments = _attempts(records)
    if not segments:
        return None, "no step recorded yet"
    t0 = min([r["t"] for r in records if r.get("type") == "launch"] or [segments[0][0]["t"]])
    scale, unit = _time_unit(max(r["t"] for r in segments[-1]) - t0)
    has_mfu = bool(np.isfinite(column(steps, "mfu")).any())
    fig = matplotlib_figure(WIDTH, 4.6 if has_mfu else 3.0)
    axes = fig.subplots(2, 1, sharex=True) if has_mfu else [fig.add_subplot()]
    total = sum(len(s) for s in segments)
    size = max(1, math.ceil(total / MAX_POINTS))  # one bin size for all segments: at most MAX_POINTS in all
    notes = []
    for k, (key, label, colour) in enumerate((("tokens_per_s", "tokens/s", "#1f77b4"), ("mfu", "MFU %", "#d62728"))):
        if k >= len(axes):
            break
        ax = axes[k]
        factor = 100.0 if key == "mfu" else 1.0
        for seg in segments:
            xs = (column(seg, "t") - t0) / scale
            x, mean, _, _ = reduce_series(xs, column(seg, key) * factor, math.ceil(len(seg) / size))
            ax.plot(x, mean, color=colour, linewidth=1.1, gid=f"mark-{key}")
        value = finite((pred or {}).get(key))
        if value is not None:
            ax.axhline(value * factor, color="#555", linestyle="--", linewidth=1.0, gid=f"mark-{key}-predicted")
            text = f"plan: {value * factor:,.0f}" if key == "tokens_per_s" else f"plan: {value * factor:.1f}%"
            ax.annotate(text, xy=(1, value * factor), xycoords=("axes fraction", "data"),
                        ha="right", va="bottom", fontsize=8, color="#555")
        style_axes(ax, xlabel=f"{unit} since the first launch" if k == len(axes) - 1 else "", ylabel=label)
        ax.set_ylim(bottom=0)  # a rate from zero: a 2% dip must not look like a collapse
    if pred is None:
        notes.append("no prediction recorded: `trainready run --job job.toml` records the plan's estimate")
    else:
        notes.append(f"dashed: {pred.get('source', 'the plan estimate')}")
        world = next((r.get("world_size") for r in reversed(records) if r.get("type") == "start"), None)
        if isinstance(pred.get("gpus"), int) and isinstance(world, int) and pred["gpus"] != world:
            notes.append(f"the plan predicted {pred['gpus']} GPUs; this run had {world} processes: "
                         "tokens/s do not compare")
    if not has_mfu:
        notes.append("MFU not measured (no GPU peak or FLOP model: give init(model=...) or --job)")
    if len(segments) > 1:
        notes.append(f"{len(segments)} worker starts: one line each, gaps between launches left open")
    if size > 1:
        notes.append(f"{total:,} steps run (recomputed ones included), drawn in bins: each point is the mean of up to "
                     f"{size} consecutive steps")
    return to_svg(fig, "throughput"), notes


PARTS = ("compute", "data", "comm", "optimizer", "unattributed")


def breakdown(kept: list[dict[str, Any]]) -> Result:
    """Seconds per step by part (`kept`: last_per_step's records). A record's split describes `split_step`
    (the previous step with CUDA events, read a step later), so parts are matched to that step's
    interval; `other` is the rest."""
    interval = {r["step"]: None if math.isnan(v) else v
                for r, v in zip(kept, column(kept, "interval_s").tolist(), strict=True)}
    split: dict[int, dict[str, Any]] = {}
    for r in kept:
        at = r.get("split_step", r["step"])  # absent: written before the split was lagged, this step's own
        if isinstance(at, int) and interval.get(at) is not None:
            split[at] = r
    order = sorted(split)
    if not order:
        return None, "no step with a time split recorded yet"
    rows = [split[k] for k in order]
    columns = {p: np.clip(np.nan_to_num(column(rows, f"{p}_s")), 0.0, None) for p in PARTS}
    columns["other"] = np.clip(np.array([interval[k] for k in order]) - sum(columns.values()), 0.0, None)
    unmeasured = sorted({str(p) for k in order for p in (split[k].get("unmeasured") or [])})
    columns = {k: v for k, v in columns.items() if v.any()}
    x, binned = reduce_stack(order, columns)
    fig = matplotlib_figure(WIDTH, 3.4, right=1.4)
    ax = fig.add_subplot()
    polys = ax.stackplot(x, *binned.values(), labels=list(binned), colors=[PART_COLOURS[k] for k in binned],
                         linewidth=0)
    for name, poly in zip(binned, polys, strict=True):
        poly.set_gid(f"mark-part-{name}")
    style_axes(ax, xlabel="step", ylabel="seconds per step")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False, fontsize=9)
    notes = ["wall time between step ends; other = checkpoint stalls, logging and whatever ran outside "
             "`with sess.step()`"]
    if len(x) < len(order):
        notes.append(f"{len(order):,} steps, mean of each of {len(x):,} bins")
    if unmeasured:
        notes.append(f"not measured in some steps: {', '.join(unmeasured)}; their time and compute's are shown "
                     "together as unattributed, never as compute")
    timings = sorted({str(split[k].get("timing")) for k in order if split[k].get("timing")})
    if timings:
        notes.append(f"timed with {' and '.join(timings)} (host: clocks around the work; cuda-events: on the GPU "
                     "streams doing it)")
    return to_svg(fig, "breakdown"), notes


def step_grid(edges: list[int], grid: np.ndarray) -> tuple[list[int], np.ndarray]:
    """Windows' step edges made increasing, for pcolorfast (an image: it places cells by a binary search of
    the edges). After a crash the relaunch's windows go back over steps the crashed launch ran (edges 0, 30, 60,
    45, 90): each stretch of steps takes the last window over it, as pcolormesh drew later cells on top of
    earlier ones, an unknown (NaN) cell letting the earlier one show."""
    xs = sorted(set(edges))
    if len(xs) < 2:  # every window ends where the first began (hostile step numbers): the last one, a step wide
        return [xs[0], xs[0] + 1], grid[:, -1:]
    out = np.full((grid.shape[0], len(xs) - 1), np.nan)
    for j, (a, b) in enumerate(zip(edges[:-1], edges[1:], strict=True)):
        lo, hi = (xs.index(v) for v in sorted((a, b)))
        known = ~np.isnan(grid[:, j])
        out[known, lo:hi] = grid[known, j:j + 1]
    return xs, out


def rank_heatmap(goodput: Any) -> Result:
    if goodput is None:
        return None, "not available: this trainready computes no per-rank model for the run (goodput)"
    windows = getattr(goodput, "rank_windows", None) or []
    if not windows:
        return None, "not available: the step records carry no per-rank step times"
    import numpy as np

    ranks = max(len(w.step_s) for w in windows)
    grid = np.full((ranks, len(windows)), np.nan)
    for j, w in enumerate(windows):
        for i, v in enumerate(w.step_s):
            if v is not None:
                grid[i, j] = v
    edges, grid = step_grid([windows[0].first_step] + [w.last_step + 1 for w in windows], grid)
    fig = matplotlib_figure(WIDTH, min(6.0, 1.4 + 0.22 * ranks), right=0.1)
    ax = fig.add_subplot()
    # One image of ranks x windows cells (pcolorfast: a PNG inside the SVG), not a path per cell: 5x smaller,
    # faster, and no antialiasing seams between the cells. Unknown cells stay transparent.
    mesh = ax.pcolorfast(edges, np.arange(ranks + 1) - 0.5, np.ma.masked_invalid(grid), cmap="viridis")
    mesh.set_gid("mark-rank-heat")
    fig.colorbar(mesh, ax=ax, label="median step s", pad=0.01)
    ax.set_xlabel("step")
    ax.set_ylabel("rank")
    ax.invert_yaxis()
    if ranks <= 32:
        ax.set_yticks(range(ranks))
    notes = [f"{ranks} ranks x {len(windows)} windows of steps; colour = the rank's median step time in the window"]
    slow = getattr(goodput, "slowest_ranks", None) or []
    if slow:
        scores = {r.rank: r.straggler_score for r in goodput.ranks}
        notes.append("slowest: " + ", ".join(f"rank {r}" + (f" ({scores[r]:.2f}x median)" if scores.get(r) else "")
                                             for r in slow))
    return to_svg(fig, "ranks"), notes


def ckpt_stalls(records: list[dict[str, Any]]) -> Result:
    saves = [r for r in records if r.get("type") == "ckpt" and finite(r.get("stall_s")) is not None]
    if not saves:
        return None, "no checkpoint saved in this run"
    fig = matplotlib_figure(WIDTH, 2.8)
    ax = fig.add_subplot()
    steps = [r["step"] for r in saves]
    stalls = [r["stall_s"] for r in saves]
    ax.vlines(steps, 0, stalls, color="#9467bd", linewidth=1.2, gid="mark-ckpt-stall")
    ax.plot(steps, stalls, "o", color="#9467bd", markersize=3, gid="mark-ckpt-point")
    style_axes(ax, xlabel="step", ylabel="training blocked, s")
    ax.set_ylim(bottom=0)
    total = sum(stalls)
    notes = [f"{len(saves)} save(s), {duration(total)} blocked in all, median {statistics.median(stalls):.3g} s, "
             f"longest {max(stalls):.3g} s (async saves block only while copying to host memory)"]
    intervals = [r.get("message") for r in records if r.get("type") == "ckpt_interval" and r.get("message")]
    if intervals:
        notes.append(f"interval: {intervals[-1]}")
    return to_svg(fig, "ckpt"), notes


def waterfall(goodput: Any) -> Result:
    if goodput is None:
        return None, "not available: this trainready computes no goodput model for the run"
    if not goodput.billed_s:
        return None, "nothing billed yet"
    dollars = goodput.usd_per_hour is not None
    unit = "$" if dollars else "hours"
    value = (lambda c: c.usd) if dollars else (lambda c: c.hours)
    total = goodput.billed_usd if dollars else goodput.billed_hours
    billed = [c for c in goodput.causes if c.in_billed and c.seconds is not None and c.seconds > 0]
    outside = [c for c in goodput.causes if not c.in_billed and c.seconds]
    labels, bottoms, heights, colours = ["billed"], [0.0], [total], ["#7f7f7f"]
    level = total
    for c in billed:
        v = value(c) or 0.0
        level -= v
        labels.append(c.label)
        bottoms.append(level)
        heights.append(v)
        colours.append("#d62728")
    productive = goodput.productive_usd if dollars else goodput.productive_s / 3600
    labels.append("goodput")
    bottoms.append(0.0)
    heights.append(productive or 0.0)
    colours.append("#2ca02c")
    for c in outside:
        labels.append(f"{c.label} (not billed)")
        bottoms.append(0.0)
        heights.append(value(c) or 0.0)
        colours.append("#ffbb78")
    fig = matplotlib_figure(WIDTH, 3.6, bottom=1.1)
    ax = fig.add_subplot()
    bars = ax.bar(range(len(labels)), heights, bottom=bottoms, color=colours, width=0.65)
    for i, (bar, h) in enumerate(zip(bars, heights, strict=True)):
        bar.set_gid(f"mark-waterfall-{i}")
        ax.annotate(f"${h:,.2f}" if dollars else f"{h:,.3g} h", (bar.get_x() + bar.get_width() / 2, bar.get_y() + h),
                    ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(labels)), labels, rotation=20, ha="right", fontsize=9)
    style_axes(ax, xlabel="", ylabel=unit if dollars else "hours")
    share = f"{100 * goodput.goodput:.1f}%" if goodput.goodput is not None else "-"
    notes = [f"goodput {share} of billed time" + (" (an upper bound: some steps did not measure every cause)"
                                                  if goodput.upper_bound else "")]
    if not dollars:
        notes.append("no price recorded: shown in hours (run with --instance or --usd-per-hour for dollars)")
    unknown = [c.label for c in goodput.causes if c.seconds is None]
    if unknown:
        notes.append(f"not measured (unknown, not zero): {', '.join(unknown)}")
    for c in billed:
        notes.append(f"{c.label}: {c.description}")
    return to_svg(fig, "waterfall"), notes


OUTCOME_COLOURS = {"finished": "#2ca02c", "failed": "#d62728", "budget": "#ff7f0e", "max_steps": "#ff7f0e",
                   "signal": "#bcbd22", "running": "#1f77b4"}


def launches(info: dict[str, Any], records: list[dict[str, Any]], goodput: Any) -> Result:
    rows = [(launch.get("start_unix"), launch.get("end_unix"),
             launch.get("reason") if isinstance(launch.get("reason"), str) else None)
            for launch in info.get("launches") or []]
    if goodput is not None and not rows:
        rows = [(g.start_unix, g.end_unix, g.outcome) for g in goodput.launches]
    rows = [(s, e, why) for s, e, why in rows if isinstance(s, (int, float))]
    if not rows:
        return None, "no launch recorded (run.json has none)"
    last_t = max((r.get("t", 0) for r in records), default=rows[-1][0])
    t0 = rows[0][0]
    span = max((e or last_t) for _, e, _ in rows) - t0
    scale, unit = _time_unit(max(span, 1e-9))
    fig = matplotlib_figure(WIDTH, 1.2 + 0.3 * len(rows), left=0.9)
    ax = fig.add_subplot()
    for i, (start, end, why) in enumerate(rows):
        end = end if end is not None else last_t
        colour = OUTCOME_COLOURS.get(why or "", "#7f7f7f")
        ax.broken_barh([((start - t0) / scale, max((end - start) / scale, span / scale / 500))], (i - 0.35, 0.7),
                       color=colour, gid=f"mark-launch-{i}")
    ax.set_yticks(range(len(rows)), [f"launch {i}" for i in range(len(rows))])
    ax.invert_yaxis()
    style_axes(ax, xlabel=f"{unit} since the first launch", ylabel="")
    notes = ["green finished, red failed, orange budget or max steps, olive signal, blue running, grey unknown"]
    return to_svg(fig, "launches"), notes
