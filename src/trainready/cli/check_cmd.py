"""`trainready check [collect]`: is this node what was paid for, and ready to train?"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from trainready.errors import UsageError

from . import options as o
from .console import emit_json, out, progress

CODES = "Exit codes: 0 no failure, 1 at least one check failed, 2 usage error, 3 internal error."
HELP = f"""Probe this node (or analyze a bundle) and report every finding with a fix.

Example: trainready check --instance p4d.24xlarge      trainready check --bundle ./node7

{CODES}"""

app = typer.Typer(help=HELP, invoke_without_command=True, no_args_is_help=False)

Deep = Annotated[bool, typer.Option("--deep", help="Also measure: bf16 GEMM, all-reduce bus bandwidth (all local GPUs; under torchrun the whole job, across nodes), hot/shared storage bandwidth.")]
HotDir = Annotated[Optional[Path], typer.Option("--hot-dir", help="Directory on the hot tier (local NVMe) to measure with --deep.")]
SharedDir = Annotated[Optional[Path], typer.Option("--shared-dir", help="Directory on shared storage to measure with --deep.")]
Instance = Annotated[Optional[str], typer.Option("--instance", "-i", help="Instance type (else instance-type.txt in the bundle, or detected on EC2 when live).")]
CpuOnly = Annotated[bool, typer.Option("--cpu-only", help="This node is meant to have no GPU: no GPU is then no failure (without it, a node with no GPU fails gpu.count).")]


@app.callback(invoke_without_command=True)
def check(ctx: typer.Context,
          bundle: Annotated[Optional[Path], typer.Option("--bundle", help="Analyze this bundle directory instead of this machine.")] = None,
          instance: Instance = None, cpu_only: CpuOnly = False,
          job: Annotated[Optional[Path], typer.Option("--job", help="A job spec (plan --save): check host RAM and checkpoint space for it.")] = None,
          model: o.ModelName = None, method: o.MethodOpt = None,
          strategy: Annotated[Optional[o.Strategy], typer.Option("--strategy", help="With --model: ddp, zero1, zero2, zero3 (= fsdp). [default: fsdp]")] = None,
          offload: Annotated[Optional[o.Offload], typer.Option("--offload", help="With --model: optimizer states (and parameters) in host RAM.")] = None,
          deep: Deep = False, hot_dir: HotDir = None, shared_dir: SharedDir = None,
          dataset: Annotated[Optional[str], typer.Option("--dataset", metavar="URL", help="Also check the training data's layout (local directory or s3://bucket/prefix): many small objects starve GPUs, packed shards do not. Lists at most 10,000 objects (~20 s).")] = None,
          json_out: o.Json = False) -> None:
    if ctx.invoked_subcommand is not None:
        return
    from trainready.check.analyze import analyze, job_needs
    from trainready.check.bundle import Bundle
    from trainready.check.probes import detect_instance_type

    needs = None
    if model and not instance:  # the node the job would run on: the bundle's, or this one's
        loaded = Bundle.load(bundle) if bundle is not None else None
        instance = ((loaded.text("instance-type.txt") or "").strip() if loaded else detect_instance_type()) or None
    if job or model:
        if not (instance or job):
            raise UsageError("--model needs the instance type: pass --instance TYPE (e.g. p4d.24xlarge)")
        needs = job_needs(o.build_job(job, model=model, method=method, strategy=strategy, offload=offload, instance=instance))
    if bundle is not None:
        report = analyze(Bundle.load(bundle), instance, needs, deep=deep, cpu_only=cpu_only)
    else:
        instance = instance or detect_instance_type()
        live = _collect(None, instance, json_out)
        if deep:
            rank = _add_deep(live, hot_dir, shared_dir, json_out)
            if rank != 0:  # under torchrun: every rank measured, rank 0 reports
                return
        report = analyze(live, instance, needs, deep=deep, live=True, cpu_only=cpu_only)
    if dataset is not None:  # not part of the quick probes' budget: only when asked, after them
        from trainready.check.dataset_scan import dataset_finding, scan_dataset
        from trainready.check.findings import CheckReport

        finding = dataset_finding(scan_dataset(dataset), dataset)
        report = CheckReport.build(report.instance_type, report.source, [*report.checks, finding])
    if json_out:
        emit_json(report)
    else:
        from .render_check import render_check

        render_check(out, report)
    if report.failed:
        raise typer.Exit(1)


def _quiet(json_out: bool) -> bool:
    """No progress with --json, in pipes (console.progress), or on any torchrun rank but 0."""
    import os

    return json_out or os.environ.get("RANK", "0") != "0"


def _collect(out_dir: Path | None, instance: str | None, json_out: bool):
    from trainready.check.probes import PROBE_COUNT, collect

    with progress("probing this node", total=PROBE_COUNT, as_json=_quiet(json_out)) as sink:
        return collect(out_dir, instance_type=instance, on_progress=sink.advance)


def _add_deep(bundle, hot_dir: Path | None, shared_dir: Path | None, json_out: bool = False) -> int:
    """Run the --deep measurements into the bundle; returns this process's rank (0 alone)."""
    import json
    import os

    from trainready.check.deep import deep_steps, run_deep

    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    rank = 0
    if distributed:
        import torch
        import torch.distributed as dist

        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        rank = dist.get_rank()
    hot, shared = (str(hot_dir) if hot_dir else None), (str(shared_dir) if shared_dir else None)
    try:
        what = "GEMM, all-reduce" + (", hot tier" if hot else "") + (", shared storage" if shared else "")
        with progress(f"measuring (--deep): {what}", total=deep_steps(hot, shared),
                      as_json=_quiet(json_out)) as sink:
            bundle.files["deep.json"] = json.dumps(run_deep(hot, shared, on_progress=sink.advance))
    finally:
        if distributed:
            dist.barrier()
            dist.destroy_process_group()
    return rank


@app.command("collect", help=f"Save every probe's raw output into a bundle directory (analyze it with --bundle).\n\n{CODES}")
def collect_cmd(out_dir: Annotated[Path, typer.Option("--out", help="Bundle directory to write.")],
                instance: Instance = None, deep: Deep = False, hot_dir: HotDir = None, shared_dir: SharedDir = None) -> None:
    from trainready.check.probes import detect_instance_type

    bundle = _collect(out_dir, instance or detect_instance_type(), False)
    if deep and _add_deep(bundle, hot_dir, shared_dir) == 0:
        bundle.save(out_dir, ["deep.json"])  # through the bundle writer: redacted, private
    ran = sum(1 for p in bundle.manifest.probes if p.exit_code is not None)
    out.print(f"bundle written to {out_dir}: {len(bundle.files)} files, {ran} of {len(bundle.manifest.probes)} probes ran")
