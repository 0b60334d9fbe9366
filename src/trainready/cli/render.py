"""Rich renderers: results in, tables out. No computation happens here."""

from __future__ import annotations

import time

from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from trainready.catalog import Catalog, Gpu, Instance
from trainready.cli.console import err, line, out, styled
from trainready.plan.confidence import short as confidence_short
from trainready.plan.estimate import EstimateResult
from trainready.plan.model_spec import ModelSpec
from trainready.plan.recipes import Recipe
from trainready.plan.search import PlanResult
from trainready.plan.memory_record import MEMORY_NOT_QUOTED, MEMORY_RECORD_WARNING
from trainready.plan.memory_record import text as memory_record_text
from trainready.plan.track_record import text as track_record_text
from trainready.plan.track_record import wide as track_record_wide
from trainready.plan.units import BIG, count_text, hours_text, usd_text


def _f(x: float | None, fmt: str = ",.1f", none: str = "-") -> str:
    """A figure in `fmt`, or short (1.0e30, not 31 digits folded over rows) from BIG up."""
    if x is None:
        return none
    if abs(x) >= BIG:
        return count_text(x)
    return format(x, fmt)


_usd = usd_text
_hours = hours_text


def _table(title: str) -> Table:
    """A compact table: fits 80 columns for the commands' usual widths."""
    return Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1))


class _Grid:
    """A table's columns and rows, laid out by `print_fitted` to the console's width."""

    def __init__(self, title: str, columns: list[str], left: tuple[str, ...] = ()):
        self.title, self.columns, self.left = title, columns, left
        self.rows: list[list[str | Text]] = []

    def add_row(self, *cells: str | Text) -> None:
        self.rows.append(list(cells))

    def table(self, keep: list[str], wrap: bool = False) -> Table:
        """Every cell whole: no_wrap (a name or number never folds) unless even the narrowest
        choice does not fit, then cells fold onto more lines; never an ellipsis."""
        t = _table(self.title)
        t.collapse_padding, t.show_edge = True, False  # two spaces between columns, none at the edges
        for name in keep:
            t.add_column(name, justify="left" if name in self.left else "right", no_wrap=not wrap,
                         overflow="fold")
        index = [self.columns.index(name) for name in keep]
        for row in self.rows:
            t.add_row(*(row[i] for i in index))
        return t

    def print_fitted(self, con: Console, optional: tuple[str, ...]) -> None:
        """Drop `optional` columns, least useful first, until the table fits the console
        (80 columns in a pipe) with every identifier and number whole, and say what went.
        A name may hold a newline: a two-line header keeps its column narrow."""
        keep, dropped = list(self.columns), []
        for name in (None, *optional):
            if name is not None:
                keep.remove(name)
                dropped.append(name.replace("\n", " "))
            table = self.table(keep)
            natural = Measurement.get(con, con.options.update(width=1 << 16), table).maximum
            if natural <= con.width:
                break
        else:
            table = self.table(keep, wrap=True)
        con.print(table)
        if dropped:
            con.print(styled(f"not shown in {con.width} columns: {', '.join(dropped)} "
                             f"(a wider terminal or --json has them)", "dim"))


def _setup_line(e: EstimateResult) -> str:
    s = e.setup
    where = f"{s.nodes} x {s.instance}" if s.instance else f"{s.gpus} x {s.gpu}"
    if s.power_limit_w is not None and s.power_scale < 1:
        where += f" capped at {s.power_limit_w:.10g} W ({s.power_scale:.0%} of rated compute)"
    par = s.strategy + (f"+offload {s.offload}" if s.offload != "none" else "")
    if s.tp > 1 or s.pp > 1 or s.cp > 1:
        par += f", tp {s.tp} x pp {s.pp}" + (f" x cp {s.cp}" if s.cp > 1 else "") + f" x dp {s.dp}"
        par += f" (interleaved: {s.pp_virtual} virtual stages per rank)" if s.pp_virtual > 1 else ""
        par += (f", {s.pp_schedule_calls} pipeline schedule calls per step of local batch {s.pp_local_batch}"
                if s.pp_schedule_calls > 1 else "")
        par += " (TP communication overlapped)" if s.tp_overlap else ""
    if s.ep > 1 or s.etp != s.tp:
        par += f", ep {s.ep} x etp {s.etp}" + s.dispatch_text()
    return (f"{where} ({s.gpus} GPUs) | {s.method_text()} | {par} | micro-batch {s.micro_batch} x {s.grad_accum} accum "
            f"x dp {s.dp} = {s.global_batch} seqs of {s.seq_len}"
            + (f" (documents of {s.doc_len}, masked apart)" if s.doc_len else "") + f" | {s.precision}"
            + (f" ({s.fp8_recipe} scaling{', weights gathered in FP8' if s.fp8_param_gather and s.dp > 1 else ''})"
               if s.fp8_recipe else "")
            + (f", token-drop routing at capacity {s.capacity_factor:g}" if s.capacity_factor else "")
            + (", compiled with its loss" if s.torch_compile else "") + (", CUDA graphs" if s.cuda_graphs else "")
            + ", "
            f"{'no' if s.activation_checkpointing == 'none' else s.recompute_text()} recompute")



def render_estimate(con: Console, e: EstimateResult) -> None:
    active = f", {e.model.active_params / 1e9:,.2f}B active" if e.model.active_params != e.model.params else ""
    con.print(line((e.model.name, "bold"), f" ({e.model.params / 1e9:,.2f}B parameters{active})"))
    con.print(_setup_line(e))
    mem = _Grid("Memory per GPU (GiB)", ["weights", "grads", "optimizer", "activations", "other", "peak", "GPU",
                                         "fits"])
    p = e.memory.per_gpu_gib
    m = e.memory
    fits = (styled("yes", "green") if m.fits_with_margin else styled("tight", "yellow") if m.fits
            else styled("NO", "red"))
    mem.add_row(_f(p.weights), _f(p.gradients), _f(p.optimizer), _f(p.activations), _f(p.other),
                styled(_f(p.peak), "bold"), _gib(e.memory.gpu_gib), fits)
    mem.print_fitted(con, ("other", "grads", "weights"))
    con.print(line(f"peak at {m.peak_phase}; persistent states {m.states_gib:,.1f} GiB; fit rule: peak <= "
                   f"{m.limit_gib:,.1f} GiB ({m.gpu_gib:g} less the {m.margin:.0%} margin, --memory-margin), "
                   f"headroom {m.headroom_gib:,.1f} GiB"))
    host = line(f"host RAM per node: {m.host_gib:,.0f} GiB needed")
    if m.host_ram_gib:
        host.append(f" of {m.host_ram_gib:,.0f} ({m.host_limit_gib:,.0f} usable: {m.host_margin:.0%} kept for the "
                    f"OS and page cache)")
        if not m.host_fits:
            host.append(" (too much)", "red")
    con.print(host)
    if m.track_record is not None and not _memory_record_warned(e.warnings):  # else it is a warning below
        con.print(line(f"memory track record: {memory_record_text(m.track_record)}"))
    t = e.throughput
    speed = _Grid("Speed", ["tokens/s", "per GPU", "MFU", "HFU", "step s", "compute", "comm", "other"])
    b = t.step_breakdown_s
    low = ("~", "yellow") if e.confidence.level == "low" else ""  # the range is in the warnings
    speed.add_row(line(_f(t.tokens_per_s, ",.0f"), low), _f(t.tokens_per_s_per_gpu, ",.0f"), f"{t.mfu * 100:.1f}%",
                  f"{t.hfu * 100:.1f}%", _f(t.step_time_s, ",.2f"), _f(b.compute, ",.2f"),
                  _f(b.exposed_communication, ",.2f"), _f(b.other, ",.2f"))
    speed.print_fitted(con, ("HFU", "other", "per GPU"))
    con.print(f"bottleneck: {t.bottleneck} (comm = exposed communication; {t.communication_s:,.2f} s "
              f"of communication per step in all)")
    record = e.confidence.track_record
    if record is not None and not track_record_wide(record):  # a loose one is a warning below
        con.print(line(f"track record: {track_record_text(record)}"))
    c = e.cost
    cost = _Grid("Time and cost", ["train time", "steps", "$/node-h", "total", "$/1B tok", "spot $/h", "spot total"])
    price = line(_usd(c.usd_per_hour), (" (suspect)", "yellow") if c.pricing.suspect else "")
    cost.add_row(_hours(e.time.train_hours), count_text(e.time.steps), price,
                 _usd(c.total_usd), _usd(c.usd_per_billion_tokens), _usd(c.spot_usd_per_hour),
                 _usd(c.spot_total_usd))
    cost.print_fitted(con, ("spot $/h", "$/1B tok", "steps"))
    st = e.storage
    have = "unknown" if st.hot_tier_have_gb_per_node is None else f"{st.hot_tier_have_gb_per_node:,.0f} GB"
    con.print(f"checkpoints: {st.checkpoint_gb:,.0f} GB each ({st.checkpoint_gb_per_node:,.0f} GB per node), "
              f"every {e.time.checkpoint_interval_s / 60:,.0f} min; hot tier keeps {st.hot_tier_keeps} (+1 being "
              f"written): {st.hot_tier_need_gb_per_node:,.0f} GB per node, has {have}; {_archive(st)}; "
              f"dataset reads {st.dataset_read_mb_per_s:,.2f} MB/s per node")
    for w in e.warnings:
        con.print(line(("warning:", "yellow"), f" {w}"))
    for a in e.assumptions:
        con.print(styled(f"assumed: {a}", "dim"))


def _gib(x: float) -> str:
    """GiB as nvidia-smi shows them: 80, 79.6, 140.4 (a whole number without its .0)."""
    return f"{x:,.0f}" if abs(x - round(x)) < 0.05 else f"{x:,.1f}"


def _archive(st) -> str:
    """What the archive holds: the run's total under the retention `trainready run` applies."""
    keeps = "every checkpoint" if st.archive_keeps is None else f"the last {st.archive_keeps}"
    if st.archive_total_gb is None:
        return f"archive keeps {keeps}: {st.archive_gb_per_billion_tokens:,.0f} GB per 1B tokens trained"
    held = st.checkpoints_written if st.archive_keeps is None else min(st.archive_keeps, st.checkpoints_written)
    return (f"archive keeps {keeps}: {count_text(st.checkpoints_written)} written over the run, "
            f"{count_text(held)} x {st.checkpoint_gb:,.0f} GB = {count_text(st.archive_total_gb)} GB at the end")


def _how(e: EstimateResult) -> str:
    s = e.setup
    how = s.strategy + (f" + offload {s.offload}" if s.offload != "none" else "")
    if s.tp > 1 or s.pp > 1:
        how += f", tp {s.tp} x pp {s.pp}" + (f" x {s.pp_virtual} virtual" if s.pp_virtual > 1 else "")
        how += " (TP overlap)" if s.tp_overlap else ""
    if s.cp > 1:
        how += f", cp {s.cp}"
    if s.ep > 1 or s.etp != s.tp:
        how += f", ep {s.ep} x etp {s.etp}"
    how += s.dispatch_text()
    how += f", micro-batch {s.micro_batch} x {s.grad_accum}"
    how += ", compiled" if s.torch_compile else ""
    if s.activation_checkpointing != "none":
        how += f", {s.recompute_text()} recompute"
    if s.fp8_recipe:
        how += f", fp8 {s.fp8_recipe}" + (" (FP8 gather)" if s.fp8_param_gather and s.dp > 1 else "")
    if s.capacity_factor:
        how += f", capacity {s.capacity_factor:g}"
    return how


def _alternative_text(a) -> str:
    """One "Also fits" entry: instance, nodes and its point cost, ~ where its efficiency is assumed."""
    cost = f" {_usd(a.total_usd)}{'~' if a.assumed else ''}" if a.total_usd else ""
    return f"{a.instance} x{a.nodes}{cost}"


def render_plan(con: Console, r: PlanResult) -> None:
    tokens = f"{count_text(r.tokens)} tokens" if r.tokens else "per 1B tokens"
    con.print(line((r.model, "bold"), f" ({r.params / 1e9:,.2f}B), {r.method_text()}, {tokens}, "
                   f"ranked by {r.ranked_by}; {r.searched:,} configurations searched"))
    for n in r.notes:
        con.print(styled(n, "dim"))
    if not r.rows:
        con.print(styled("nothing fits the constraints", "red"))
    cost_label = "cost" if r.tokens else "$/1B tok"
    table = _Grid("Best setups", ["#", "nodes x instance", "GiB/GPU", "tok/s", "MFU", "time", cost_label, "spot"],
                  left=("nodes x instance",))
    for row in r.rows:
        e, s = row.estimate, row.estimate.setup
        cost = line(_usd(e.cost.total_usd if r.tokens else e.cost.usd_per_billion_tokens),
                    ("?", "yellow") if e.cost.pricing.suspect else "",
                    ("~", "yellow") if e.confidence.level == "low" else "")
        table.add_row(str(row.rank), f"{s.nodes} x {s.instance}",
                      f"{e.memory.per_gpu_gib.peak:,.0f}/{_gib(e.memory.gpu_gib)}",
                      _f(e.throughput.tokens_per_s, ",.0f"), f"{e.throughput.mfu * 100:.0f}%",
                      _hours(e.time.train_hours), cost, _usd(e.cost.spot_total_usd))
    if r.rows:
        # MFU and memory are in each row's line below, speed relative to #1 as well
        table.print_fitted(con, ("MFU", "GiB/GPU", "tok/s", "spot"))
        for row in r.rows:
            con.print(line(f"  #{row.rank} ", (_how(row.estimate), "bold"), f" ({row.framework}): {row.why}"))
            low = confidence_short(row.estimate.confidence, r.ranked_by == "cost")
            if low:
                con.print(line("     ", ("~", "yellow"), f" {low}"))
        record = r.rows[0].estimate.confidence.track_record
        if record is not None:
            loose = track_record_wide(record)
            con.print(line(("warning: loose track record", "yellow") if loose else ("Track record", "bold"),
                           f" (#1): {track_record_text(record)}"))
        memory = r.rows[0].estimate.memory
        unchecked = [a for a in r.rows[0].estimate.assumptions if a.startswith(MEMORY_NOT_QUOTED)]
        if memory.track_record is None and unchecked:
            con.print(line(("Memory track record", "bold"), f" (#1): {unchecked[0]}"))
        said = [w for w in r.rows[0].estimate.warnings if w.startswith(MEMORY_RECORD_WARNING)]
        if said:  # the estimate's own warning, word for word
            con.print(line(("warning", "yellow"), f" (#1): {said[0]}"))
        elif memory.track_record is not None:
            con.print(line(("Memory track record", "bold"), f" (#1): {memory_record_text(memory.track_record)}"))
    if r.others:
        said = "; ~: assumed efficiency, ranked by the pessimistic end" if any(a.assumed for a in r.others) else ""
        con.print(line(("Also fits", "bold"), f" (best per instance, ranked lower{said}): "
                       + "; ".join(_alternative_text(a) for a in r.others)))
    if r.excluded:
        con.print(styled("Excluded", "bold"))
        for x in r.excluded:
            con.print(f"  {x.instance}: {x.reason}")
    if r.recipe:
        _render_recipe(con, r.recipe)


def _memory_record_warned(warnings: list[str]) -> bool:
    """Whether the estimate warns that its memory record says the fit is not established."""
    return any(w.startswith(MEMORY_RECORD_WARNING) for w in warnings)


def shell_lines(command: str, width: int) -> str:
    """`command` broken at spaces into lines of at most `width` columns, each but the last ending
    in ` \\`, the rest indented: pasted into a shell it is the same command. A word longer
    than a line stays whole on a line of its own."""
    words, lines, cur = command.split(), [], ""
    for word in words:
        indent = "    " if lines else ""
        if cur and len(indent) + len(cur) + 1 + len(word) + 2 > width:
            lines.append(indent + cur)
            cur = word
        else:
            cur = f"{cur} {word}" if cur else word
    lines.append(("    " if lines else "") + cur)
    return " \\\n".join(lines)


def _render_recipe(con: Console, rc: Recipe) -> None:
    """Launch commands and config as text to copy: no panel border to cut around, no line folded
    by the terminal width (commands continue with ` \\`; the config's lines fit 80 columns)."""
    env = " ".join(f"{k}={v}" for k, v in rc.env.items())
    n = len(rc.torchrun)
    head = f"one command per node, on each of the {n} nodes" if n > 1 else "on the node"
    con.print(line(("Launch (best row)", "bold"), f", {rc.framework}, {head}:"))
    for cmd in rc.torchrun:
        con.print(Text(shell_lines(f"{env} {cmd}", max(con.width, 40))), soft_wrap=True)
    lexer = {"deepspeed-json": "json", "transformers-python": "python"}.get(rc.config_kind, "bash")
    con.print(line((rc.config_kind, "bold"), ":"))
    config = Syntax(rc.config, lexer, theme="ansi_dark").highlight(rc.config)
    config.rstrip()
    con.print(config, soft_wrap=True)
    for n in rc.notes:
        con.print(styled(n, "dim"))


def render_gpus(con: Console, gpus: list[Gpu]) -> None:
    t = _Grid("GPUs (memory in GiB as nvidia-smi shows it; dense peak TFLOP/s)",
              ["name", "mem\nGiB", "bf16", "fp16", "fp8", "tf32", "fp32", "HBM\nGB/s",
               "GPU-GPU\nlink", "GPU-GPU\nGB/s", "NVLink\nlinks x GB/s"],
              left=("name", "GPU-GPU\nlink"))
    for g in gpus:
        tf = g.tflops
        nv = f"{g.nvlink_links} x {g.nvlink_link_gbps:g}" if g.nvlink_links and g.nvlink_link_gbps else "-"
        t.add_row(line(g.name, (" *", "yellow") if g.uncertain else ""), f"{g.memory_gib:g}", _f(tf.bf16, "g"),
                  _f(tf.fp16, "g"), _f(tf.fp8, "g"), _f(tf.tf32, "g"), _f(tf.fp32, "g"), f"{g.hbm_gbps:g}",
                  g.gpu_link, _f(g.gpu_gpu_gbps_bidir, "g"), nv)
    t.print_fitted(con, ("tf32", "fp32", "NVLink\nlinks x GB/s", "fp16", "GPU-GPU\nlink"))
    for g in gpus:
        if g.uncertain:
            con.print(line(("*", "yellow"), f" {g.name}: {g.uncertain}"))
    con.print(styled("sources: `trainready catalog gpus --json`", "dim"))


def render_instances(con: Console, items: list[Instance], cat: Catalog) -> None:
    t = _Grid("Instance types", ["cloud", "name", "GPUs", "vCPU", "RAM\nGiB", "NVMe", "net\nGbps", "EFA", "topology",
                                 "on-demand\n$/h", "spot\n$/h", "region"],
              left=("cloud", "name", "GPUs", "NVMe", "topology", "region"))

    def price(p):
        if p is None:
            return "-"
        if p.usd_per_hour is None:
            return "unknown"
        return line(_f(p.usd_per_hour, ",.2f"), ("?", "yellow") if p.suspect else "")

    for i in items:
        od, sp = i.price_for("on-demand"), i.price_for("spot")
        nvme = "-" if i.nvme_count is None else ("none" if i.nvme_count == 0 else
                                                 f"{i.nvme_count} x {_f(i.nvme_gb, 'g', '?')} GB")
        t.add_row(i.cloud, i.name, f"{i.gpu_count} x {i.gpu}", _f(i.vcpus, "d"), _f(i.ram_gib, ",.0f"), nvme,
                  _f(i.network_gbps, "g", "unknown"), _f(i.efa_interfaces, "d"), i.topology, price(od), price(sp),
                  (od or sp).region if (od or sp) else "-")
    t.print_fitted(con, ("region", "EFA", "topology", "vCPU", "NVMe", "cloud", "net\nGbps", "RAM\nGiB"))
    suspect = [(i, p) for i in items for p in i.price if p.suspect]
    if suspect:
        con.print(line(("?", "yellow"), " price marked suspect (verify it before buying):"))
        for i, p in suspect:
            con.print(f"  {i.name} {p.model} {p.region}: {p.note or 'marked suspect in the catalog'}")
    con.print(styled("prices: SkyPilot catalog snapshot, late 2025; `--json` gives every value's source and the "
                     "expected NVLink matrix", "dim"))


def render_models(con: Console, models: list[ModelSpec]) -> None:
    t = _Grid("Model presets", ["name", "params", "active", "layers", "hidden", "heads", "kv", "ffn", "mlp",
                                "vocab", "tied"], left=("name", "mlp"))
    for m in models:  # MoE: active = top-k routed experts per token; ffn = experts x one expert's width
        ffn = f"{m.moe.num_experts}x{m.moe.expert_ffn_hidden_size}" if m.moe else str(m.ffn_hidden_size)
        t.add_row(m.name, f"{m.param_count() / 1e9:,.2f}B", f"{m.active_param_count() / 1e9:,.2f}B" if m.moe else "=",
                  str(m.num_layers), str(m.hidden_size), str(m.num_heads), str(m.num_kv_heads), ffn, m.mlp,
                  str(m.vocab_size), "yes" if m.tied_embeddings else "no")
    t.print_fitted(con, ("tied", "mlp", "kv", "vocab"))
    if any(m.moe for m in models):
        con.print(styled("active: parameters each token uses (mixture-of-experts: the top-k routed experts; "
                         "= for dense models); ffn of MoE models: experts x one expert's width", "dim"))


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


def say_calibration(line: str | None, json_out: bool) -> None:
    """Where the calibration was saved, after the output: on stderr beside --json (never inside it), else
    on stdout below the tables."""
    if not line:
        return
    (err if json_out else out).print(Text(f"trainready: {line}" if json_out else f"\n{line}"), soft_wrap=True)
