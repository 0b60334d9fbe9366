"""`trainready plan ... --html FILE`: every candidate as cost vs time with the Pareto front marked,
the shown rows, the excluded instances with why, and the chosen row's memory per GPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainready.plan.confidence import short as confidence_short
from trainready.plan.setup import layout_text
from trainready.plan.units import count_text, usd_text

from .page import Page
from .svg import matplotlib_figure, require_matplotlib, style_axes, to_svg

WIDTH = 11.5
MEMORY_PARTS = (("weights", "#1f77b4"), ("gradients", "#ff7f0e"), ("optimizer", "#2ca02c"),
                ("activations", "#9467bd"), ("other", "#8c564b"))


def pareto(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both time and cost (ties kept once), fastest first."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], points[i][1]))
    front, best = [], float("inf")
    for i in order:
        if points[i][1] < best:
            front.append(i)
            best = points[i][1]
    return front


def _per(result: Any) -> str:
    return "" if result.tokens else " per 1B tokens"


def cost_time_chart(result: Any) -> tuple[str | None, Any]:
    priced = [c for c in result.candidates if c.total_usd is not None]
    if not priced:
        why = ("no candidate has a price (give --usd-per-hour)" if result.candidates
               else "no candidate fits the constraints")
        return None, (why, [])
    points = [(c.train_hours, c.total_usd) for c in priced]
    front = pareto(points)
    fig = matplotlib_figure(WIDTH, 5.2, left=0.9, right=0.3)
    ax = fig.add_subplot()
    ax.scatter([p[0] for p in points], [p[1] for p in points], s=22, color="#9ecae1", edgecolors="#3182bd",
               linewidths=0.6, label="candidate (best per instance and node count)", gid="mark-candidates", zorder=2)
    fx = [points[i][0] for i in front]
    fy = [points[i][1] for i in front]
    ax.plot(fx, fy, "-o", color="#d62728", markersize=6, linewidth=1.2, drawstyle="steps-post",
            label="Pareto front (nothing cheaper and faster)", gid="mark-pareto", zorder=3)
    shown = [c for c in priced if c.row is not None]
    ax.scatter([c.train_hours for c in shown], [c.total_usd for c in shown], s=90, facecolors="none",
               edgecolors="#222", linewidths=1.2, label="shown rows (#rank)", gid="mark-rows", zorder=4)
    for c in shown:
        ax.annotate(f"#{c.row}", (c.train_hours, c.total_usd), xytext=(6, 4), textcoords="offset points", fontsize=8)
    for k, i in enumerate(front):
        ax.annotate(front_label(k), points[i], xytext=(-4, -11), textcoords="offset points", fontsize=8,
                    color="#a50f15", ha="right", fontweight="bold")
    span = lambda v: max(v) / max(min(v), 1e-12)  # noqa: E731
    if span([p[0] for p in points]) > 20:
        ax.set_xscale("log")
    if span([p[1] for p in points]) > 20:
        ax.set_yscale("log")
    style_axes(ax, xlabel=f"hours{_per(result)}", ylabel=f"total cost, ${_per(result)}")
    ax.legend(loc="upper left", frameon=False, fontsize=9)
    notes = [f"{len(result.candidates)} candidates ({result.searched:,} configurations searched); "
             f"{len(front)} on the Pareto front; hours and cost include checkpoint and failure overheads"]
    unpriced = sorted({c.instance for c in result.candidates if c.total_usd is None})
    if unpriced:
        notes.append(f"not drawn, no price: {', '.join(unpriced)}")
    return to_svg(fig, "cost-time"), (notes, [priced[i] for i in front])


def front_label(k: int) -> str:
    return chr(ord("A") + k) if k < 26 else f"A{k}"


def memory_chart(row: Any) -> tuple[str | None, Any]:
    """The row's memory per GPU against its card and the fit rule's limit (the row's own margin and limit, as
    the table judged it)."""
    mem = row.estimate.memory
    margin = mem.margin
    parts = mem.per_gpu_gib
    fig = matplotlib_figure(WIDTH, 2.2, left=0.4, bottom=0.6, right=0.4, top=0.55)
    ax = fig.add_subplot()
    left = 0.0
    for name, colour in MEMORY_PARTS:
        value = getattr(parts, name)
        if value <= 0:
            continue
        ax.barh([0], [value], left=left, color=colour, height=0.5, label=f"{name} {value:,.1f}", gid=f"mark-mem-{name}")
        left += value
    ax.axvline(mem.gpu_gib, color="#222", linewidth=1.5, gid="mark-mem-gpu")
    ax.annotate(f"GPU {mem.gpu_gib:,.1f} GiB", (mem.gpu_gib, 0.3), xytext=(-4, 0), textcoords="offset points",
                ha="right", fontsize=8)
    if margin > 0:
        ax.axvline(mem.limit_gib, color="#222", linewidth=1.0, linestyle="--")
    ax.set_yticks([])
    ax.set_xlim(0, max(mem.gpu_gib, left) * 1.05)
    style_axes(ax, xlabel="GiB per GPU", ylabel="")
    ax.legend(loc="lower left", bbox_to_anchor=(0, 1.0), ncol=5, frameon=False, fontsize=9)
    s = row.estimate.setup
    notes = [f"row #{row.rank}: {s.instance or s.gpu} x {s.nodes} node(s), {s.strategy}, tp {s.tp} pp {s.pp}, "
             f"micro-batch {s.micro_batch}, activation checkpointing {s.recompute_text()}{s.dispatch_text()}; "
             f"peak {parts.peak:,.1f} GiB at {mem.peak_phase}, {mem.headroom_gib:,.1f} GiB free"
             + (f"; dashed: the {margin:.0%} kept free (--memory-margin)" if margin > 0 else "")]
    return to_svg(fig, "memory"), notes


SUSPECT, ASSUMED = "?", "~"
LEGEND = {SUSPECT: "price marked suspect in the catalog: verify it before buying",
          ASSUMED: "efficiency assumed, not measured (low confidence): the range is in the row's note"}


def markers(row: Any) -> str:
    """The marks the terminal's table puts beside a row's cost (cli/render.py), in the same order."""
    e = row.estimate
    return (SUSPECT if e.cost.pricing.suspect else "") + (ASSUMED if e.confidence.level == "low" else "")


def _row_cells(row: Any, per_billion: bool) -> list[object]:
    e = row.estimate
    s, t, c = e.setup, e.time, e.cost
    usd = c.usd_per_billion_tokens if per_billion else c.total_usd
    return [row.rank, s.instance or s.gpu, f"{s.nodes} x {s.gpus_per_node}", s.strategy,
            layout_text(s.tp, s.pp, s.pp_virtual, s.ep, s.etp) + s.dispatch_text(), s.micro_batch, s.recompute_text(),
            f"{e.throughput.tokens_per_s:,.0f}", "-" if t.train_hours is None else f"{t.train_hours:,.1f}",
            ("-" if usd is None else usd_text(usd)) + markers(row), row.framework, row.why]


def plan_page(result: Any) -> str:
    require_matplotlib()
    tokens = f"{count_text(result.tokens)} tokens" if result.tokens else "no --tokens (costs per 1B tokens)"
    doc_len = result.rows[0].estimate.setup.doc_len if result.rows else None
    page = Page(title=f"trainready plan: {result.model}, {result.method_text()}",
                subtitle=[f"{tokens}; ranked by {result.ranked_by}; global batch {result.global_batch} x "
                          f"{result.seq_len} tokens"
                          + (f" (documents of {doc_len:,}, attention masked apart)" if doc_len else "")])
    svg, (notes, front) = cost_time_chart(result)
    if svg is None:
        page.unavailable("cost-time", "Every candidate: cost vs time", notes)
    else:
        page.chart("cost-time", "Every candidate: cost vs time", svg, notes)
        page.table(["front", "instance", "nodes x GPUs", "strategy", "tokens/s", f"hours{_per(result)}",
                    f"cost{_per(result)}", "row"],
                   [[front_label(k), c.instance, f"{c.nodes} x {c.gpus // c.nodes}", c.strategy, f"{c.tokens_per_s:,.0f}",
                     f"{c.train_hours:,.1f}", f"${c.total_usd:,.0f}", "-" if c.row is None else f"#{c.row}"]
                    for k, c in enumerate(front)], numeric={4, 5, 6})
    page.heading("rows", "Shown rows")
    if result.rows:
        page.table(["#", "instance", "nodes x GPUs", "strategy", "parallel", "micro-batch", "act. ckpt", "tokens/s",
                    "hours", f"cost{_per(result)}", "framework", "why"],
                   [_row_cells(r, not result.tokens) for r in result.rows], numeric={0, 5, 7, 8, 9})
        shown = "".join(markers(r) for r in result.rows)
        for mark, meaning in LEGEND.items():
            if mark in shown:
                page.note(f"{mark} {meaning}")
        for r in result.rows:
            low = confidence_short(r.estimate.confidence, result.ranked_by == "cost")
            if low and ASSUMED in markers(r):
                page.note(f"#{r.rank} {ASSUMED} {low}")
        svg, notes = memory_chart(result.rows[0])
        page.chart("memory", f"Memory per GPU, row #{result.rows[0].rank}", svg, notes)
    else:
        page.unavailable("memory", "Memory per GPU", "nothing fits the constraints: no row to show")
    if result.others:
        page.heading("others", "Other instances that fit (their best)")
        page.table(["instance", "nodes", "tokens/s", "hours", "cost"],
                   [[o.instance, o.nodes, f"{o.tokens_per_s:,.0f}",
                     "-" if o.train_hours is None else f"{o.train_hours:,.1f}",
                     "-" if o.total_usd is None else f"${o.total_usd:,.0f}" + ("~" if o.assumed else "")]
                    for o in result.others], numeric={1, 2, 3, 4})
    page.heading("excluded", "Excluded instances")
    if result.excluded:
        page.table(["instance", "why"], [[x.instance, x.reason] for x in result.excluded])
    else:
        page.note("none: every instance searched has a configuration that fits")
    page.heading("notes", "Notes")
    for note in result.notes:
        page.note(note)
    return page.render()


def write_plan_page(result: Any, out: Path) -> None:
    from trainready.io import replace_durable

    replace_durable(out, plan_page(result).encode())
