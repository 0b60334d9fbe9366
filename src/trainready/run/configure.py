"""From `trainready run` options (and an optional job spec) to a checked LaunchSpec.

Everything that can be wrong before a worker starts is found here (preflight.py), so a bad
script path, instance, price, budget or archive costs nothing."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainready.errors import UsageError

from . import preflight
from .launch_spec import LaunchSpec
from .settings import RunSettings, node_run_dir


@dataclass
class RunOptions:
    command: list[str]
    nproc_per_node: str | None = None
    """A number or 'gpu'; None: 1 for a launch here, one per GPU of --instance for --emit."""
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None
    rdzv_id: str | None = None
    max_restarts: int | None = None  # None: 0 for a launch here; emit's default for a launch file
    hot: str | None = None
    archive: str | None = None
    ckpt_every: str | None = None  # None: 'auto'
    keep_hot: int = 2
    instance: str | None = None
    spot: bool = False
    region: str | None = None
    usd_per_hour: float | None = None
    budget_usd: float | None = None
    mtbf_hours: float | None = None
    run_dir: Path | None = None
    job: Path | None = None
    grace_s: float = 100.0
    show_ranks: str = "0"
    resume: bool = False
    extra_env: dict[str, str] = field(default_factory=dict)


@dataclass
class Configured:
    spec: LaunchSpec
    price_source: str
    step_s_estimate: float | None
    notes: list[str]


def default_run_dir(command: list[str]) -> Path:
    script = next((a for a in command[1:] if not a.startswith("-")), command[0] if command else "run")
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", Path(script).stem) or "run"
    return Path("runs") / stem


def _nproc(value: str, gpus_per_node: int | None) -> int | str:
    if value in ("gpu", "auto", "cpu"):
        return value if gpus_per_node is None or value != "gpu" else gpus_per_node
    if not value.isdigit() or int(value) < 1:
        raise UsageError(f"--nproc-per-node {value!r}: a number >= 1, or 'gpu' (one per GPU)")
    return int(value)


def _ckpt_every(value: str | None) -> int | str | None:
    """Default 'auto': a run is resumable unless checkpoints are turned off ('off': None)."""
    text = "auto" if value is None else value.strip().lower()
    if text == "auto":
        return "auto"
    if text == "off":
        return None
    if text.isdigit() and int(text) >= 1:
        return int(text)
    raise UsageError(f"--ckpt-every {value!r}: a number of steps (>= 1), 'auto' (Young/Daly from measured stalls, "
                     "the default) or 'off'")


def describe_checkpoints(every: int | str | None) -> str:
    """What a crash will cost, said at launch."""
    if every is None:
        return ("checkpoints off (--ckpt-every off): saved only at the end and on a clean stop (signal, budget); "
                "a crash loses everything since the start of this launch")
    if every == "auto":
        return ("checkpoints auto: the first at the second step (to measure the save), then at the Young/Daly interval "
                "from the measured save and the MTBF, said once measured; a crash loses at most one interval")
    return f"checkpoints every {every} step(s): a crash loses at most {every} step(s)"


def _from_job(path: Path, opts: RunOptions, notes: list[str]) -> tuple[float | None, float | None, dict[str, Any]]:
    """Fill unset options from the job spec; returns (FLOPs per token, estimated step seconds, the
    plan's prediction that run.json records for `report --html`)."""
    from trainready.catalog import load_catalog
    from trainready.plan.estimate import estimate_setup
    from trainready.plan.job import load_job
    from trainready.plan.performance import model_flops_per_token
    from trainready.plan.setup import resolve

    job = load_job(path)
    opts.instance = opts.instance or job.instance
    opts.spot = opts.spot or job.spot
    opts.region = opts.region or job.region
    opts.usd_per_hour = opts.usd_per_hour or job.usd_per_hour
    setup = resolve(job, load_catalog())
    if opts.nnodes == 1 and setup.nodes > 1 and opts.rdzv_endpoint:
        opts.nnodes = setup.nodes
    result = estimate_setup(setup)
    step_s = result.throughput.step_time_s
    notes.append(f"job {path}: {setup.model.name}, {setup.n_gpus} x {setup.gpu.name}, {setup.strategy}; "
                 f"plan estimate {step_s:.2f} s/step" if step_s else f"job {path}: {setup.model.name}")
    prediction = {"source": f"plan estimate for --job {path}", "gpus": setup.n_gpus, "step_s": step_s,
                  "tokens_per_s": result.throughput.tokens_per_s, "mfu": result.throughput.mfu}
    return model_flops_per_token(setup), step_s, prediction


def configure(opts: RunOptions) -> Configured:
    preflight.check_command(opts.command)
    preflight.check_rendezvous(opts.nnodes, opts.node_rank, opts.rdzv_endpoint)
    if opts.max_restarts is not None and opts.max_restarts < 0:
        raise UsageError(f"--max-restarts {opts.max_restarts}: must be >= 0")
    notes: list[str] = []
    every = _ckpt_every(opts.ckpt_every)  # before anything slow: a typo is found at once
    flops, step_s, prediction = _from_job(opts.job, opts, notes) if opts.job else (None, None, None)
    gpus_per_node = None
    if opts.instance:
        from trainready.catalog import load_catalog

        gpus_per_node = load_catalog().instance(opts.instance).gpu_count
    price = preflight.resolve_price(opts.instance, opts.spot, opts.usd_per_hour, opts.region)
    run_dir = node_run_dir((opts.run_dir or default_run_dir(opts.command)).resolve(), opts.nnodes, opts.node_rank)
    measured = preflight.measured_step_s(run_dir)
    if measured is not None:
        preflight.check_budget(opts.budget_usd, price, opts.nnodes, measured, "measured in this run's earlier launches")
    else:
        preflight.check_budget(opts.budget_usd, price, opts.nnodes, step_s, "the plan's estimate for --job")
    preflight.check_archive(opts.archive)
    for flag, value in (("--budget-usd", opts.budget_usd), ("--usd-per-hour", opts.usd_per_hour),
                        ("--mtbf-hours", opts.mtbf_hours)):
        if value is not None and value <= 0:
            raise UsageError(f"{flag} {value:g}: must be > 0")
    settings = RunSettings(
        run_dir=run_dir, hot=opts.hot, archive=opts.archive, ckpt_every=every,
        keep_hot=opts.keep_hot, budget_usd=opts.budget_usd, usd_per_hour=price.usd_per_hour, nnodes=opts.nnodes,
        instance=opts.instance, spot=opts.spot, mtbf_h=opts.mtbf_hours, flops_per_token=flops, grace_s=opts.grace_s)
    config: dict[str, Any] = {
        "nproc_per_node": "1" if opts.nproc_per_node is None else opts.nproc_per_node, "nnodes": opts.nnodes, "node_rank": opts.node_rank,
        "rdzv_endpoint": opts.rdzv_endpoint, "max_restarts": opts.max_restarts or 0, "hot": settings.hot_dir,
        "archive": opts.archive, "ckpt_every": settings.ckpt_every, "instance": opts.instance, "spot": opts.spot,
        "usd_per_hour": price.usd_per_hour, "price_source": price.source, "budget_usd": opts.budget_usd,
        "job": str(opts.job) if opts.job else None, "prediction": prediction}
    nproc = _nproc("1" if opts.nproc_per_node is None else opts.nproc_per_node, gpus_per_node)
    preflight.check_torch(nproc)
    spec = LaunchSpec(command=opts.command, settings=settings, nproc_per_node=nproc,
                      nnodes=opts.nnodes, node_rank=opts.node_rank, rdzv_endpoint=opts.rdzv_endpoint,
                      rdzv_id=opts.rdzv_id, max_restarts=opts.max_restarts or 0, show_ranks=opts.show_ranks, config=config,
                      resume=opts.resume)
    notes.append(describe_checkpoints(every))
    return Configured(spec, price.source, step_s, notes)
