"""`trainready data bench URL`: can this data path keep the planned GPUs fed?

Reads the dataset through ShardedDataset and a DataLoader with N workers for a bounded time,
twice: cold (a fresh cache, every shard from the store) and warm (the same shards again, now
from the cache; a local dataset is read in place, so both passes read the disk). Compares the
warm rate with the tokens/s one node of the planned training consumes: `--plan-tokens-per-s`,
or the planner's estimate for `--job` / `--model --instance` (divided by the job's nodes).
For text and JSONL there is no tokenizer: tokens are counted as bytes, and the result says so.
Workers start through worker_context() (forkserver, torch preloaded), as docs/data.md advises
for training; starting its server is not timed.
"""

from __future__ import annotations

import math
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Literal

from pydantic import BaseModel, ConfigDict

from trainready.errors import TrainreadyError, UsageError

from .errors import worker_message
from .index_io import is_local, load_index
from .workers import MAX_WORKERS, WORKERS_PER_CPU, default_workers, max_workers, usable_cpus

MIN_SECONDS, MAX_SECONDS = 0.1, 86400.0  # a pass of a day measures nothing a shorter one does not
TORCH_WORKER_WARNING = r"This DataLoader will create \d+ worker processes in total"  # torch's, said as a note of ours


class PassRate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    samples: int
    seconds: float
    samples_per_s: float
    tokens_per_s: float
    mb_per_s: float
    exhausted: bool  # the whole dataset was read before the time ran out


class Need(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tokens_per_s_per_node: float
    source: str


class DataBenchResult(BaseModel):
    """`trainready data bench --json`."""

    model_config = ConfigDict(extra="forbid")
    schema_version: int = 1
    kind: Literal["trainready-data-bench"] = "trainready-data-bench"
    url: str
    format: str
    tokens_counted_as: str
    workers: int
    local: bool
    cold: PassRate
    warm: PassRate
    need: Need | None
    ratio: float | None  # warm tokens/s over what one node consumes
    verdict: str
    keeps_up: bool | None


def check_options(workers: int, seconds: float) -> None:
    """UsageError for a worker count this machine cannot run or a time limit that is not a
    number of seconds; said before anything starts."""
    if isinstance(workers, bool) or not isinstance(workers, int):
        raise UsageError(f"--workers {workers!r}: not a whole number")
    if workers < 0:
        raise UsageError(f"--workers {workers}: must be 0 (read in the main process) or more")
    if workers > max_workers():
        raise UsageError(f"--workers {workers} is too many for this machine: at most {max_workers()} "
                         f"({WORKERS_PER_CPU} per CPU, {usable_cpus()} CPUs usable here, never more than {MAX_WORKERS})")
    if not isinstance(seconds, (int, float)) or not math.isfinite(seconds):
        raise UsageError(f"--seconds {seconds}: not a finite number; give seconds from {MIN_SECONDS:g} to "
                         f"{MAX_SECONDS:g} (a day), e.g. 20")
    if not MIN_SECONDS <= seconds <= MAX_SECONDS:
        raise UsageError(f"--seconds {seconds:g}: give seconds from {MIN_SECONDS:g} to {MAX_SECONDS:g} (a day), e.g. 20")


def crowded_note(workers: int) -> str | None:
    """One line when the workers outnumber the CPUs (torch warns then, twice, at length), else None."""
    cpus = usable_cpus()
    if workers <= cpus:
        return None
    return (f"{workers} workers on {cpus} usable CPU{'s' if cpus != 1 else ''}: they share the cores, which helps "
            f"only while they wait on storage (torch suggests at most {cpus})")


def planned_need(tokens_per_s: float | None, job: object | None) -> Need | None:
    """Tokens/s one node consumes: given, or the planner's estimate for a job spec."""
    if tokens_per_s is not None:
        if not math.isfinite(tokens_per_s):
            raise UsageError(f"--plan-tokens-per-s {tokens_per_s}: not a finite number; give the tokens/s one node "
                             "consumes, e.g. 50000")
        if tokens_per_s <= 0:
            raise UsageError(f"--plan-tokens-per-s {tokens_per_s:g}: must be > 0")
        return Need(tokens_per_s_per_node=tokens_per_s, source="--plan-tokens-per-s")
    if job is None:
        return None
    from trainready.catalog import load_catalog
    from trainready.plan.estimate import estimate_setup
    from trainready.plan.setup import resolve

    setup = resolve(job, load_catalog())
    est = estimate_setup(setup)
    per_node = est.throughput.tokens_per_s / setup.nodes
    return Need(tokens_per_s_per_node=per_node,
                source=f"plan: {setup.model.name} on {setup.gpus_per_node} x {setup.gpu.name} per node "
                       f"({setup.nodes} node(s), {setup.strategy}), {est.throughput.tokens_per_s:,.0f} tokens/s in all")


def _needs_torch() -> None:
    try:
        import torch.utils.data  # noqa: F401
    except ImportError:
        raise UsageError("trainready data bench reads through a torch DataLoader: pip install 'trainready[torch,data]' "
                         "(or your CUDA build of torch, then 'trainready[data]')") from None


def _start_workers_server(workers: int) -> object | None:
    """The workers' multiprocessing context (forkserver, as training uses: docs/data.md), its
    server started and ready, so the passes time reading, not Python starting up."""
    if not workers:
        return None
    from .workers import worker_context

    context = worker_context()
    probe = context.Process(target=time.sleep, args=(0,))
    probe.start()
    probe.join()
    return context


def _pass(url: str, workers: int, seconds: float, cache_dir: str, context: object | None,
          on_progress: Callable[[float], None] | None) -> PassRate:
    from torch.utils.data import DataLoader

    from .assign import Throughput
    from .dataset import ShardedDataset

    ds = ShardedDataset(url, shuffle=False, cache_dir=cache_dir, rank=0, world_size=1)
    with warnings.catch_warnings():  # more workers than CPUs: crowded_note() says it once, in one line
        warnings.filterwarnings("ignore", message=TORCH_WORKER_WARNING, category=UserWarning)
        loader = DataLoader(ds, batch_size=None, num_workers=workers, multiprocessing_context=context)
    meter = Throughput()
    last = time.monotonic()
    deadline = last + seconds
    exhausted = True
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=TORCH_WORKER_WARNING, category=UserWarning)
            samples = iter(loader)  # the workers start here
        for sample in samples:
            meter.add(sample)
            now = time.monotonic()
            if now >= deadline:
                exhausted = False
                break
            if on_progress is not None and now - last >= 0.1:
                on_progress(now - last)
                last = now
    except TrainreadyError as exc:  # from a worker: torch's text holds the worker's traceback; say it in one line
        message, trace = worker_message(str(exc), type(exc).__name__)
        if trace is None:
            raise
        try:
            clean = type(exc)(message)
        except Exception:
            raise exc from None
        raise clean from None
    finally:
        if on_progress is not None:
            on_progress(max(0.0, deadline - last))  # this pass's share of the time budget is done
    del loader
    r = meter.report()
    return PassRate(samples=int(r["samples"]), seconds=round(r["seconds"], 3), samples_per_s=r["samples_per_s"],
                    tokens_per_s=r["tokens_per_s"], mb_per_s=r["bytes_per_s"] / 1e6, exhausted=exhausted)


def verdict(warm: PassRate, need: Need | None, counted_as: str) -> tuple[float | None, str, bool | None]:
    note = "" if counted_as == "tokens" else "; bytes counted as tokens: no tokenizer"
    if need is None:
        return None, (f"delivers {warm.tokens_per_s:,.0f} tokens/s warm ({_plural(warm.samples)}{note}); "
                      "give --job or --plan-tokens-per-s to compare"), None
    ratio = warm.tokens_per_s / need.tokens_per_s_per_node
    if ratio >= 1.0:
        return ratio, (f"this pipeline delivers {ratio:.1f}x what one node of the planned training consumes "
                       f"({warm.tokens_per_s:,.0f} vs {need.tokens_per_s_per_node:,.0f} tokens/s{note})"), True
    return ratio, (f"will starve the GPUs by {1 - ratio:.0%}: {warm.tokens_per_s:,.0f} of the "
                   f"{need.tokens_per_s_per_node:,.0f} tokens/s one node consumes{note}; raise --workers (DataLoader "
                   "num_workers), the shard size (fewer, larger reads) or prefetch_shards, or cache on local NVMe"), False


def _plural(samples: int) -> str:
    return f"{samples:,} sample{'s' if samples != 1 else ''} read"


def bench(url: str, workers: int | None = None, seconds: float = 20.0, tokens_per_s: float | None = None,
          job: object | None = None, on_progress: Callable[[float], None] | None = None) -> DataBenchResult:
    """Two passes of at most `seconds` each, with `workers` DataLoader workers (None: 4, or the
    usable CPUs when fewer). on_progress(s) is called as each pass uses up its time budget, in
    seconds (2 * seconds in all; a pass that reads everything early jumps ahead). Starting the
    worker processes' server (once) is not timed."""
    workers = default_workers() if workers is None else workers
    check_options(workers, seconds)
    _needs_torch()
    index, fs, _ = load_index(url)
    if not index.shards:
        raise UsageError(f"{url}: the dataset has no committed shards yet (is `trainready data pack` still running?)")
    if index.format == "tokens":
        try:
            import numpy  # noqa: F401
        except ImportError:
            raise UsageError(f"{url} holds token arrays (.npy): pip install 'trainready[data]' for numpy") from None
    need = planned_need(tokens_per_s, job)
    context = _start_workers_server(workers)
    cache = tempfile.mkdtemp(prefix="trainready-data-bench-")
    try:
        cold = _pass(url, workers, seconds, cache, context, on_progress)
        warm = _pass(url, workers, seconds, cache, context, on_progress)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    ratio, text, keeps_up = verdict(warm, need, index.tokens_counted_as)
    return DataBenchResult(url=url, format=index.format, tokens_counted_as=index.tokens_counted_as, workers=workers,
                           local=is_local(fs), cold=cold, warm=warm, need=need, ratio=ratio, verdict=text,
                           keeps_up=keeps_up)
