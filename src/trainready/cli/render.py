"""Rich renderers: results in, tables out. No computation happens here."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.syntax import Syntax
from rich.table import Table

from trainready.catalog import Catalog, Gpu, Instance
from trainready.plan.estimate import EstimateResult
from trainready.plan.model_spec import ModelSpec
from trainready.plan.search import PlanResult

if TYPE_CHECKING:  # the store loads only for `ckpt`
    from trainready.store.inspect import CheckpointListing, PruneResult, PullResult, VerifyReport


def _f(x: float | None, fmt: str = ",.1f", none: str = "-") -> str:
    return none if x is None else format(x, fmt)


def _usd(x: float | None) -> str:
    return "-" if x is None else (f"${x:,.0f}" if x >= 100 else f"${x:,.2f}")


def _hours(h: float | None) -> str:
    if h is None:
        return "-"
    return f"{h * 60:.0f} min" if h < 1 else (f"{h:,.1f} h" if h < 72 else f"{h / 24:,.1f} d")


def _table(title: str) -> Table:
    """A compact table: fits 80 columns for the commands' usual widths."""
    return Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1))


def _setup_line(e: EstimateResult) -> str:
    s = e.setup
    where = f"{s.nodes} x {s.instance}" if s.instance else f"{s.gpus} x {s.gpu}"
    par = s.strategy + (f"+offload {s.offload}" if s.offload != "none" else "")
    if s.tp > 1 or s.pp > 1:
        par += f", tp {s.tp} x pp {s.pp} x dp {s.dp}"
    method = s.method + (f" r={s.lora_rank}" if s.lora_rank else "")
    return (f"{where} ({s.gpus} GPUs) | {method} | {par} | micro-batch {s.micro_batch} x {s.grad_accum} accum "
            f"x dp {s.dp} = {s.global_batch} seqs of {s.seq_len} | {s.precision}, ckpt {s.activation_checkpointing}")


def render_estimate(con: Console, e: EstimateResult) -> None:
    con.print(f"[bold]{e.model.name}[/] ({e.model.params / 1e9:,.2f}B parameters)")
    con.print(_setup_line(e))
    mem = _table("Memory per GPU (GiB)")
    for col in ("weights", "grads", "optimizer", "activations", "other", "peak", "GPU", "fits"):
        mem.add_column(col, justify="right", no_wrap=True)
    p = e.memory.per_gpu_gib
    fits = "[green]yes[/]" if e.memory.fits else "[red]NO[/]"
    mem.add_row(_f(p.weights), _f(p.gradients), _f(p.optimizer), _f(p.activations), _f(p.other),
                f"[bold]{_f(p.peak)}[/]", _f(e.memory.gpu_gib, ",.0f"), fits)
    con.print(mem)
    host = f"host RAM per node: {e.memory.host_gib:,.0f} GiB needed"
    if e.memory.host_ram_gib:
        host += f" of {e.memory.host_ram_gib:,.0f}" + ("" if e.memory.host_fits else " [red](too much)[/]")
    con.print(f"peak at {e.memory.peak_phase}; persistent states {e.memory.states_gib:,.1f} GiB; {host}")
    t = e.throughput
    speed = _table("Speed")
    for col in ("tokens/s", "per GPU", "MFU", "HFU", "step s", "compute", "comm", "other"):
        speed.add_column(col, justify="right", no_wrap=True)
    b = t.step_breakdown_s
    speed.add_row(_f(t.tokens_per_s, ",.0f"), _f(t.tokens_per_s_per_gpu, ",.0f"), f"{t.mfu * 100:.1f}%",
                  f"{t.hfu * 100:.1f}%", f"{t.step_time_s:,.2f}", f"{b.compute:,.2f}",
                  f"{b.exposed_communication:,.2f}", f"{b.other:,.2f}")
    con.print(speed)
    con.print(f"bottleneck: {t.bottleneck} (comm = exposed communication; {t.communication_s:,.2f} s "
              f"of communication per step in all)")
    c = e.cost
    cost = _table("Time and cost")
    for col in ("train time", "steps", "$/node-h", "total", "$/1B tok", "spot $/h", "spot total"):
        cost.add_column(col, justify="right", no_wrap=True)
    flag = " [yellow](suspect)[/]" if c.pricing.suspect else ""
    cost.add_row(_hours(e.time.train_hours), _f(e.time.steps, ",d"), _usd(c.usd_per_hour) + flag,
                 _usd(c.total_usd), _usd(c.usd_per_billion_tokens), _usd(c.spot_usd_per_hour),
                 _usd(c.spot_total_usd))
    con.print(cost)
    st = e.storage
    have = "unknown" if st.hot_tier_have_gb_per_node is None else f"{st.hot_tier_have_gb_per_node:,.0f} GB"
    con.print(f"checkpoints: {st.checkpoint_gb:,.0f} GB each ({st.checkpoint_gb_per_node:,.0f} GB per node), "
              f"every {e.time.checkpoint_interval_s / 60:,.0f} min; hot tier needs "
              f"{st.hot_tier_need_gb_per_node:,.0f} GB per node, has {have}; archive grows "
              f"{st.archive_growth_gb_per_day:,.0f} GB/day; dataset reads {st.dataset_read_mb_per_s:,.2f} MB/s per node")
    for w in e.warnings:
        con.print(f"[yellow]warning:[/] {w}")
    for a in e.assumptions:
        con.print(f"[dim]assumed: {a}[/]")


def _how(e: EstimateResult) -> str:
    s = e.setup
    how = s.strategy + (f" + offload {s.offload}" if s.offload != "none" else "")
    if s.tp > 1 or s.pp > 1:
        how += f", tp {s.tp} x pp {s.pp}"
    how += f", micro-batch {s.micro_batch} x {s.grad_accum}"
    if s.activation_checkpointing != "none":
        how += f", {s.activation_checkpointing} recompute"
    return how


def render_plan(con: Console, r: PlanResult) -> None:
    tokens = f"{r.tokens:,.0f} tokens" if r.tokens else "per 1B tokens"
    con.print(f"[bold]{r.model}[/] ({r.params / 1e9:,.2f}B), {r.method}, {tokens}, ranked by {r.ranked_by}; "
              f"{r.searched:,} configurations searched")
    for n in r.notes:
        con.print(f"[dim]{n}[/]")
    if not r.rows:
        con.print("[red]nothing fits the constraints[/]")
    table = _table("Best setups")
    cost_label = "cost" if r.tokens else "$/1B tok"
    for col in ("#", "nodes x instance", "GiB/GPU", "tok/s", "MFU", "time", cost_label, "spot"):
        table.add_column(col, justify="left" if col == "nodes x instance" else "right", no_wrap=True)
    for row in r.rows:
        e, s = row.estimate, row.estimate.setup
        cost = _usd(e.cost.total_usd if r.tokens else e.cost.usd_per_billion_tokens)
        if e.cost.pricing.suspect:
            cost += "[yellow]?[/]"
        table.add_row(str(row.rank), f"{s.nodes} x {s.instance}",
                      f"{e.memory.per_gpu_gib.peak:,.0f}/{e.memory.gpu_gib:,.0f}",
                      _f(e.throughput.tokens_per_s, ",.0f"), f"{e.throughput.mfu * 100:.0f}%",
                      _hours(e.time.train_hours), cost, _usd(e.cost.spot_total_usd))
    if r.rows:
        con.print(table)
        for row in r.rows:
            con.print(f"  #{row.rank} [bold]{_how(row.estimate)}[/]: {row.why}")
    if r.others:
        con.print("[bold]Also fits[/] (best per instance, ranked lower): " + "; ".join(
            f"{a.instance} x{a.nodes} {_usd(a.total_usd) if a.total_usd else ''}".strip() for a in r.others))
    if r.excluded:
        con.print("[bold]Excluded[/]")
        for x in r.excluded:
            con.print(f"  {x.instance}: {x.reason}")
    if r.recipe:
        rc = r.recipe
        env = " ".join(f"{k}={v}" for k, v in rc.env.items())
        con.print(Panel("\n".join(f"{env} {cmd}" for cmd in rc.torchrun), title="Launch (best row)",
                        title_align="left"))
        lexer = "json" if rc.config_kind == "deepspeed-json" else "python"
        con.print(Panel(Syntax(rc.config, lexer, theme="ansi_dark", word_wrap=True), title=rc.config_kind,
                        title_align="left"))
        for n in rc.notes:
            con.print(f"[dim]{n}[/]")


def render_gpus(con: Console, gpus: list[Gpu]) -> None:
    t = _table("GPUs (dense peak TFLOP/s)")
    for col in ("name", "GiB", "bf16", "fp16", "fp8", "tf32", "fp32", "HBM GB/s", "GPU-GPU", "NVLink"):
        t.add_column(col, justify="left" if col in ("name", "GPU-GPU") else "right")
    for g in gpus:
        tf = g.tflops
        nv = f"{g.nvlink_links} x {g.nvlink_link_gbps:g} GB/s" if g.nvlink_links else "-"
        t.add_row(g.name + (" [yellow]*[/]" if g.uncertain else ""), f"{g.memory_gib:g}", _f(tf.bf16, "g"),
                  _f(tf.fp16, "g"), _f(tf.fp8, "g"), _f(tf.tf32, "g"), _f(tf.fp32, "g"), f"{g.hbm_gbps:g}",
                  f"{g.gpu_link} {_f(g.gpu_gpu_gbps_bidir, 'g')} GB/s", nv)
    con.print(t)
    for g in gpus:
        if g.uncertain:
            con.print(f"[yellow]*[/] {g.name}: {g.uncertain}")
    con.print("[dim]sources: `trainready catalog gpus --json`[/]")


def render_instances(con: Console, items: list[Instance], cat: Catalog) -> None:
    t = _table("Instance types")
    for col in ("cloud", "name", "GPUs", "vCPU", "RAM GiB", "NVMe", "net Gbps", "EFA", "topology",
                "on-demand $/h", "spot $/h", "region"):
        numeric = ("vCPU", "RAM GiB", "net Gbps", "EFA", "on-demand $/h", "spot $/h")
        t.add_column(col, justify="right" if col in numeric else "left")
    for i in items:
        od, sp = i.price_for("on-demand"), i.price_for("spot")
        nvme = "-" if i.nvme_count is None else ("none" if i.nvme_count == 0 else f"{i.nvme_count} x {i.nvme_gb:g} GB")

        def price(p):
            if p is None or p.usd_per_hour is None:
                return "unknown" if p is not None else "-"
            return f"{p.usd_per_hour:,.2f}" + (" [yellow]suspect[/]" if p.suspect else "")
        t.add_row(i.cloud, i.name, f"{i.gpu_count} x {i.gpu}", _f(i.vcpus, "d"), _f(i.ram_gib, ",.0f"), nvme,
                  _f(i.network_gbps, "g", "unknown"), _f(i.efa_interfaces, "d"), i.topology, price(od), price(sp),
                  (od or sp).region if (od or sp) else "-")
    con.print(t)
    con.print("[dim]prices: SkyPilot catalog snapshot, late 2025; `--json` gives every value's source and the "
              "expected NVLink matrix[/]")


def render_models(con: Console, models: list[ModelSpec]) -> None:
    t = _table("Model presets")
    t.collapse_padding, t.show_edge = True, False  # one space between columns: every name and number fits in 80
    for col in ("name", "params", "layers", "hidden", "heads", "kv", "ffn", "mlp", "vocab", "tied"):
        t.add_column(col, justify="left" if col in ("name", "mlp") else "right", no_wrap=True)
    for m in models:
        t.add_row(m.name, f"{m.param_count() / 1e9:,.2f}B", str(m.num_layers), str(m.hidden_size),
                  str(m.num_heads), str(m.num_kv_heads), str(m.ffn_hidden_size), m.mlp, str(m.vocab_size),
                  "yes" if m.tied_embeddings else "no")
    con.print(t)


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n} B" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return "-"  # unreachable


def _age(unix: float | None, now: float | None = None) -> str:
    if unix is None:
        return "-"
    s = max((now or time.time()) - unix, 0.0)
    return f"{s:.0f} s" if s < 90 else (f"{s / 60:.0f} min" if s < 5400 else _hours(s / 3600))


def _plain(text: object) -> str:
    """Text from a disk, a URL or a library, safe to print with markup on: control characters
    (terminal escapes) shown as \\xNN, brackets escaped so nothing is read as a style."""
    shown = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in str(text))
    return escape(shown)


def render_ckpt_list(con: Console, listing: CheckpointListing) -> None:
    items = listing.checkpoints
    url = _plain(listing.url)
    if not items:
        con.print(f"no checkpoints in {url}")
        return
    t = _table(f"Checkpoints in {url} ({items[0].tier})")  # one tier per location: said once
    for col in ("step", "gen", "commit", "check", "size", "files", "world", "age", "run"):
        t.add_column(col, justify="right" if col in ("step", "gen", "size", "files", "world", "age") else "left",
                     no_wrap=col != "run", overflow="fold" if col == "run" else "ellipsis")
    styles = {"committed": "[green]yes[/]", "uncommitted": "[yellow]no[/]", "unreadable": "[red]unreadable[/]",
              "fenced": "[red]fenced[/]"}
    for c in items:
        committed = styles.get(c.status, _plain(c.status))
        verified = "-" if c.verified is None else ("[green]ok[/]" if c.verified else "[red]FAILED[/]")
        world = "-" if c.world_size is None else str(c.world_size) + (f" (node {c.node})" if c.node is not None else "")
        t.add_row(f"{c.step:,}", str(c.generation), committed, verified, _size(c.size_bytes), str(c.files),
                  world, _age(c.created_unix), _plain(c.run_id or "-"))
    con.print(t)
    for c in items:
        if c.problem:
            con.print(f"  {_plain(c.name)}: " + (_plain(c.problem) if not c.committed else f"[red]{_plain(c.problem)}[/]"))
    done = [c for c in items if c.committed]
    line = f"{len(done)} committed ({_size(sum(c.size_bytes for c in done))})"
    unreadable = sum(c.status == "unreadable" for c in items)
    if len(done) + unreadable < len(items):
        line += (f", {len(items) - len(done) - unreadable} not committed (being written, or debris from an "
                 "interrupted save)")
    if unreadable:
        line += f", [red]{unreadable} with an unreadable manifest[/] (kept, never deleted automatically)"
    fenced = sum(c.status == "fenced" for c in items)
    if fenced:
        line += f", [red]{fenced} fenced[/] (never restored)"
    bad = [c for c in done if c.verified is False]
    if bad:
        line += f"; [red]{len(bad)} failed the size check[/] (details: trainready ckpt verify)"
    con.print(line)


def render_ckpt_verify(con: Console, report: VerifyReport) -> None:
    how = "sizes and SHA-256 checksums" if report.checksums else "sizes only"
    if not report.checkpoints:
        con.print(f"[red]{_plain(report.problem)}[/]")
        return
    t = _table(f"Verified in {_plain(report.url)} ({how})")
    for col in ("name", "files", "size", "result"):
        t.add_column(col, justify="right" if col in ("files", "size") else "left", no_wrap=True)
    for c in report.checkpoints:
        t.add_row(_plain(c.name), str(c.files), _size(c.size_bytes),
                  "[green]ok[/]" if c.ok else f"[red]{len(c.problems)} problem(s)[/]")
    con.print(t)
    for c in report.checkpoints:
        for p in c.problems:
            con.print(f"[red]{_plain(c.name)}[/]: {_plain(p)}")
    bad = sum(not c.ok for c in report.checkpoints)
    con.print(f"[green]all {len(report.checkpoints)} intact[/]" if not bad
              else f"[red]{bad} of {len(report.checkpoints)} damaged[/]")


def render_ckpt_pull(con: Console, r: PullResult) -> None:
    con.print(f"pulled {_plain(r.name)} ({r.files} files, {_size(r.size_bytes)}, every checksum matched) from "
              f"{_plain(r.url)} to {_plain(r.path)} in {r.seconds:,.1f} s")


def render_ckpt_prune(con: Console, r: PruneResult) -> None:
    verb = "would delete" if r.dry_run else "deleted"
    con.print(f"{verb} {len(r.deleted)}: " + (_plain(", ".join(r.deleted)) or "nothing"))
    con.print(f"kept {len(r.kept)}: " + (_plain(", ".join(r.kept)) or "nothing"))
    if r.untouched:
        con.print(f"never deleted automatically (unreadable manifest, fenced commit, or not run "
                  f"{_plain(r.run_id or '-')}): " + _plain(", ".join(r.untouched)))
    for name in r.broken:
        con.print(f"[yellow]warning:[/] {_plain(name)} is committed but fails the size check: kept, not counted toward "
                  f"--keep {r.keep} (trainready ckpt verify {_plain(r.url)} for details)")
    if r.dry_run:
        con.print("[dim]dry run: nothing was deleted[/]")
