"""`trainready data pack` (more `data` commands, such as `bench`, are added to this app)."""

from __future__ import annotations

import re
from decimal import Decimal
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from trainready.errors import UsageError

from . import options as o
from .console import emit_json, err, line, out, progress, styled
from .render import _size  # one byte-size format for every table

if TYPE_CHECKING:
    from trainready.data.pack import PackResult

WHERE = ("--out is a local directory, file:///path, or s3://bucket/prefix (AWS_ENDPOINT_URL_S3 for other S3 endpoints); "
         "the dataset is tar shards plus index.json (docs/data.md).")
CODES = ("Exit codes: 0 ok (packed, resumed, or already packed); 2 usage error (SRC missing, empty or unreadable, "
         "bad --shard-size, a JSONL line that is not JSON, a .npy that is not uint16/uint32, --format tokens without "
         "numpy, SRC changed since packing started, --out unreachable or not writable); 3 internal error.")
SIZE_EXAMPLES = "e.g. 256MiB, 64MB, 1GiB, 1000000 (bytes)"
UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40,
         "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
         "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}

app = typer.Typer(no_args_is_help=True, help=f"Training data as tar shards in object storage. {CODES}")


@app.callback()
def _data() -> None:
    """A group even while it has one command, so `data pack` keeps its name as commands are added."""


class DataFormat(str, Enum):
    text = "text"
    jsonl = "jsonl"
    tokens = "tokens"


def parse_size(text: str) -> int:
    """Bytes from '256MiB', '64MB', '1.5GiB', '1e9', '1000000'; KiB/MiB/GiB (and bare K/M/G) are powers
    of 1024, KB/MB/GB of 1000. At most 5 TiB (pack.MAX_SHARD: the largest S3 object); exact for
    any number of digits (no float rounding, no overflow)."""
    from trainready.data.pack import MAX_SHARD

    if re.fullmatch(r"\s*[+-]?(inf|infinity|nan)\s*([a-zA-Z]*)\s*", text, re.I):
        raise UsageError(f"--shard-size {text!r} is not a finite number: {SIZE_EXAMPLES}")
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?)\s*([a-zA-Z]*)\s*", text)
    unit = match and match.group(2).lower()
    if not match or unit not in UNITS:
        raise UsageError(f"--shard-size {text!r} is not a size: {SIZE_EXAMPLES}")
    number = Decimal(match.group(1))
    if number > MAX_SHARD or number * UNITS[unit] > MAX_SHARD:  # the first test first: 1e999999999 would overflow
        raise UsageError(f"--shard-size {text!r} is more than 5 TiB, the largest object S3 stores; "
                         "100 MiB to 1 GiB suits object storage")
    size = int(number * UNITS[unit])
    if size < 1:
        raise UsageError(f"--shard-size {text!r} is zero: give a positive size, {SIZE_EXAMPLES}")
    return size


def render_pack(result: PackResult, skip_note: str | None = None) -> None:
    out.print(f"{result.url}: {result.status}", soft_wrap=True)  # a URL is never cut, whatever the width
    table = Table(show_header=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    table.add_row("format", result.format + (f" ({result.token_dtype})" if result.token_dtype else ""))
    table.add_row("shards", f"{result.shards_total} ({result.shards_written} written now"
                  + (f", resumed at shard {result.resumed_from_shard})" if result.resumed_from_shard is not None else ")"))
    table.add_row("samples", f"{result.samples_total:,}")
    table.add_row("bytes", _size(result.bytes_total))
    tokens = f"{result.tokens_total:,}"
    table.add_row("tokens", tokens + (" (no tokenizer: tokens are counted as bytes)" if result.tokens_counted_as == "bytes" else ""))
    if result.skipped_files:
        table.add_row("skipped", f"{result.skipped_files} files not matching --format {result.format}, e.g. "
                      + ", ".join(result.skipped_examples[:3]))
    table.add_row("seconds", f"{result.seconds:.1f}")
    out.print(table)
    for note in result.notes:
        if note == skip_note:
            continue
        err.print(line(("note:", "yellow"), f" {note}"), soft_wrap=True)


@app.command("pack", short_help="Pack a directory of text, JSONL or token files into tar shards, resumably.",
             help="Pack SRC (a directory, or for jsonl/tokens a single file) into WebDataset-style tar shards plus "
                  "index.json at --out. text: one file = one sample; jsonl: one non-empty line of each *.jsonl/*.json "
                  "= one sample; tokens: each *.npy (uint16/uint32) 1-D array, or each row of a 2-D one, = one sample. "
                  "Files are taken in sorted path order; hidden files are ignored. Re-running the same command after a "
                  "crash resumes after the last committed shard; on a finished dataset it does nothing. "
                  f"{WHERE}\n\n{CODES}")
def pack_cmd(src: Annotated[str, typer.Argument(metavar="SRC", help="Directory (or one .jsonl/.npy file) to pack.", show_default=False)],
             out_url: Annotated[str, typer.Option("--out", help="Dataset location: local directory or s3://bucket/prefix.", show_default=False)],
             shard_size: Annotated[str, typer.Option("--shard-size", help=f"Largest shard file, tar headers and padding included ({SIZE_EXAMPLES}); a sample too big for it gets a shard of its own. Under 1MiB: a warning (per-object request overhead).")] = "256MiB",
             fmt: Annotated[DataFormat, typer.Option("--format", help="What a sample is: a whole text file, a JSONL line, or a token array/row.")] = DataFormat.text,
             restart: Annotated[bool, typer.Option("--restart", help="Delete what an earlier pack to --out wrote and start over.")] = False,
             json_out: o.Json = False) -> None:
    from trainready.data.pack import pack, shard_size_note

    size = parse_size(shard_size)
    small = shard_size_note(size)
    if small and not json_out:  # said before the work starts (--json: in the result's notes)
        err.print(line(("warning:", "yellow"), f" {small}"), soft_wrap=True)
    with progress("packing", as_json=json_out, unit="bytes") as sink:
        reported = 0

        def advance(done: int, total: int) -> None:  # pack reports (source bytes done, total)
            nonlocal reported
            sink.set_total(total)
            sink.advance(done - reported)
            reported = done

        result = pack(src, out_url, fmt.value, size, restart=restart, progress=advance)  # src "": refused, not cwd
    if json_out:
        emit_json(result)
        return
    render_pack(result, skip_note=small)


BENCH_CODES = ("Exit codes: 0 the pipeline keeps up (or nothing to compare with); 1 it would starve the GPUs, or a "
               "shard is corrupt or missing; 2 usage error (no dataset at URL, bad option, unknown model/instance, "
               "torch not installed); 3 internal error.")


@app.command("bench", short_help="Measure read speed, cold and warm, against what the planned GPUs consume.",
             help="Read the packed dataset at URL for a bounded time through ShardedDataset and a DataLoader with "
                  "--workers workers: once cold (fresh cache: every shard from the store) and once warm (from the "
                  "cache), and report samples/s, tokens/s and MB/s. With --plan-tokens-per-s, --job, or --model and "
                  "--instance, compare with the tokens/s one node of that training consumes (the planner's "
                  "estimate). Text/JSONL have no tokenizer here: tokens are counted as bytes, and the output says so."
                  f"\n\n{BENCH_CODES}")
def bench_cmd(url: Annotated[str, typer.Argument(metavar="URL", help="Packed dataset: local directory or s3://bucket/prefix.", show_default=False)],
              workers: Annotated[int | None, typer.Option("--workers", help="DataLoader worker processes, at most 4 per CPU (and 256). [default: 4, or the CPU count if smaller]", show_default=False)] = None,
              seconds: Annotated[float, typer.Option("--seconds", help="Time limit of each pass, 0.1 to 86400.")] = 20.0,
              plan_tokens_per_s: Annotated[float | None, typer.Option("--plan-tokens-per-s", help="Tokens/s one node consumes.")] = None,
              job: Annotated[Path | None, typer.Option("--job", help="Job spec (plan --save): its estimated tokens/s per node.")] = None,
              model: Annotated[str | None, typer.Option("--model", help="Model preset, with --instance: the planner's estimate.")] = None,
              instance: Annotated[str | None, typer.Option("--instance", help="Instance type, with --model.")] = None,
              json_out: o.Json = False) -> None:
    from trainready.data.bench import bench, check_options, crowded_note
    from trainready.data.workers import default_workers
    from trainready.plan.job import JobSpec, load_job

    workers = default_workers() if workers is None else workers
    check_options(workers, seconds)  # before the progress bar shows a time limit that is not one

    given = [x for x in (plan_tokens_per_s, job, model or instance) if x is not None]
    if len(given) > 1:
        raise UsageError("compare with one of --plan-tokens-per-s, --job, or --model with --instance")
    if (model is None) != (instance is None):
        raise UsageError("--model and --instance go together (or use --job / --plan-tokens-per-s)")
    spec = load_job(job) if job else (JobSpec(model=model, instance=instance) if model else None)
    crowded = crowded_note(workers)
    if crowded and not json_out:
        err.print(line(("note:", "yellow"), f" {crowded}"), soft_wrap=True)
    with progress(f"reading cold, then warm (seconds of {2 * seconds:g})", total=2 * seconds, as_json=json_out) as sink:
        result = bench(url, workers=workers, seconds=seconds, tokens_per_s=plan_tokens_per_s, job=spec,
                       on_progress=sink.advance)
    if json_out:
        emit_json(result)
    else:
        _render_bench(result)
    if result.keeps_up is False:
        raise typer.Exit(1)


def _rate(value: float) -> str:
    """Three significant digits at least, never a bare 0.0 for a small non-zero value."""
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def _render_bench(r) -> None:  # noqa: ANN001 - DataBenchResult, imported lazily
    out.print(f"{r.url} ({r.format}, {r.workers} workers{', local: read in place' if r.local else ''})", soft_wrap=True)
    table = Table()
    for col in ("pass", "samples", "seconds", "samples/s", "tokens/s", "MB/s"):
        table.add_column(col, justify="right" if col != "pass" else "left", no_wrap=True)
    for name, p in (("cold", r.cold), ("warm", r.warm)):
        table.add_row(name + (" (all read)" if p.exhausted else ""), f"{p.samples:,}", _rate(p.seconds),
                      _rate(p.samples_per_s), _rate(p.tokens_per_s), _rate(p.mb_per_s))
    out.print(table)
    if r.tokens_counted_as != "tokens":
        out.print("tokens/s: bytes counted as tokens (text/JSONL, no tokenizer here)")
    if r.need is not None:
        out.print(f"needed: {r.need.tokens_per_s_per_node:,.0f} tokens/s per node ({r.need.source})", highlight=False)
    style = {True: "green", False: "bold red", None: "cyan"}[r.keeps_up]
    out.print(styled(r.verdict, style))
