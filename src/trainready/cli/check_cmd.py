"""`trainready check [collect]`: is this node what was paid for, and ready to train?"""

from __future__ import annotations

import os
from typing import Annotated, Optional

import typer

from . import options as o
from .console import emit_json, out, progress

CODES = ("Exit codes: 0 ready (no failure, and the checks that decide readiness had evidence), 1 a check failed "
         "or the decision is not verified (no evidence for a deciding check; not with --cpu-only), 2 usage error, "
         "3 internal error.")
HELP = f"""Probe this node (or analyze a bundle) and report every finding with a fix.

Example: trainready check --instance p4d.24xlarge      trainready check --bundle ./node7

A bundle directory holds what `check collect` writes, and also reads, when present, outputs users already have: nvidia-smi.txt (nvidia-smi or nvidia-smi -L), nccl-tests-<op>.txt (all_reduce_perf and friends as printed; op: all_reduce, all_gather, reduce_scatter, alltoall, broadcast, reduce, sendrecv), dcgm-diag.txt (dcgmi diag -r N as printed) or dcgm-diag.json (-j), cuda-log.txt (a CUDA program's error output). Single files without a bundle: --nccl-tests FILE, --dcgm-output FILE. Names: docs/check.md.

{CODES}"""

app = typer.Typer(help=HELP, invoke_without_command=True, no_args_is_help=False)

Deep = Annotated[bool, typer.Option("--deep", help="Also measure: bf16 GEMM, all-reduce bus bandwidth (all local GPUs; under torchrun the whole job, across nodes), hot/shared storage bandwidth.")]
# Path options are taken as text (check.runner.given_path): a pathlib.Path option turns '' into Path('.'), and an
# empty --out must not mean "here".
HotDir = Annotated[Optional[str], typer.Option("--hot-dir", metavar="DIR", help="Directory on the hot tier (local NVMe) to measure with --deep.")]
SharedDir = Annotated[Optional[str], typer.Option("--shared-dir", metavar="DIR", help="Directory on shared storage to measure with --deep.")]
Instance = Annotated[Optional[str], typer.Option("--instance", "-i", help="Instance type (else instance-type.txt in the bundle, or detected on EC2 when live).")]
CpuOnly = Annotated[bool, typer.Option("--cpu-only", help="This node is meant to have no GPU: no GPU is then no failure (without it, a node with no GPU fails gpu.count).")]
Dcgm = Annotated[Optional[int], typer.Option("--dcgm", metavar="LEVEL", help="Also run NVIDIA's DCGM diagnostic at level 1, 2 or 3 (dcgmi diag -r LEVEL; level 3 takes up to half an hour) and report its tests.")]
Fix = Annotated[bool, typer.Option("--fix", help="Before checking, turn persistence mode on and reset application clocks (nvidia-smi -pm 1, -rac; needs root). Nothing else is changed.")]
Mig = Annotated[bool, typer.Option("--mig", help="MIG mode is intended on this node (without it, MIG on fails gpu.mig).")]


@app.callback(invoke_without_command=True)
def check(ctx: typer.Context,
          bundle: Annotated[Optional[str], typer.Option("--bundle", metavar="DIR", help="Analyze this bundle directory instead of this machine.")] = None,
          instance: Instance = None, cpu_only: CpuOnly = False,
          job: Annotated[Optional[str], typer.Option("--job", metavar="PATH", help="A job spec (plan --save): check host RAM and checkpoint space for it.")] = None,
          model: o.ModelName = None, method: o.MethodOpt = None,
          strategy: Annotated[Optional[o.Strategy], typer.Option("--strategy", help="With --model: ddp, zero1, zero2, zero3 (= fsdp). [default: fsdp]")] = None,
          offload: Annotated[Optional[o.OffloadMode], typer.Option("--offload", show_choices=False, help="With --model: optimizer states (and parameters) in host RAM: none, optimizer or optimizer+params.")] = None,
          deep: Deep = False, hot_dir: HotDir = None, shared_dir: SharedDir = None,
          dcgm: Dcgm = None, fix: Fix = False, mig: Mig = False,
          nccl_tests: Annotated[Optional[list[str]], typer.Option("--nccl-tests", metavar="FILE", help="Judge an nccl-tests output (all_reduce_perf ... as printed; repeat for several ops). Without --bundle, only the files given are judged.")] = None,
          dcgm_output: Annotated[Optional[list[str]], typer.Option("--dcgm-output", metavar="FILE", help="Judge a saved `dcgmi diag -r N` output (the table, or -j JSON). Without --bundle, only the files given are judged.")] = None,
          dataset: Annotated[Optional[str], typer.Option("--dataset", metavar="URL", help="Also check the training data's layout (local directory or s3://bucket/prefix): many small objects starve GPUs, packed shards do not. Lists at most 10,000 objects (~20 s).")] = None,
          json_out: o.Json = False) -> None:
    if ctx.invoked_subcommand is not None:
        return
    from trainready.check.analyze import job_needs
    from trainready.check.runner import CheckOptions, given_path, run_check

    job_path = given_path(job, "--job", "a job spec file")
    def job_on(node: str | None):  # noqa: ANN202 - the job's needs on the node it would run on
        return job_needs(o.build_job(job_path, model=model, method=method, strategy=strategy, offload=offload,
                                     instance=node))
    needs_of = job_on if job_path or model else None
    conflicts = [name for name, on in (("--deep", deep), ("--fix", fix), ("--dcgm", dcgm is not None), ("--job", job),
                                       ("--model", model), ("--method", method), ("--strategy", strategy),
                                       ("--offload", offload), ("--dataset", dataset), ("--mig", mig),
                                       ("--cpu-only", cpu_only)) if on]
    report = run_check(CheckOptions(
        bundle=bundle, instance=instance, cpu_only=cpu_only, needs_of=needs_of, wants_job=job_path is not None,
        deep=deep, hot_dir=hot_dir, shared_dir=shared_dir, dcgm=dcgm, fix=fix, mig=mig, nccl_tests=nccl_tests or [],
        dcgm_output=dcgm_output or [], dataset=dataset, file_only_conflicts=conflicts), _progress(json_out))
    if report is not None:  # None: a torchrun rank other than 0 under --deep (rank 0 reports)
        _finish(report, json_out)


def _finish(report, json_out: bool) -> None:
    if json_out:
        emit_json(report)
    else:
        from .render_check import render_check

        render_check(out, report)
    if report.exit_code:
        raise typer.Exit(report.exit_code)


def _progress(json_out: bool):
    """The progress bar for long probes: none with --json, in pipes (console.progress), or on any torchrun rank
    but 0."""
    quiet = json_out or os.environ.get("RANK", "0") != "0"
    return lambda label, total: progress(label, total=total, as_json=quiet)


@app.command("collect", help=f"Save every probe's raw output into a bundle directory (analyze it with --bundle).\n\n{CODES}")
def collect_cmd(out_path: Annotated[str, typer.Option("--out", metavar="DIR", help="Bundle directory to write.")],
                instance: Instance = None, deep: Deep = False, hot_dir: HotDir = None, shared_dir: SharedDir = None,
                dcgm: Dcgm = None) -> None:
    from trainready.check.runner import collect_bundle, given_path

    bundle = collect_bundle(out_path, instance, deep, hot_dir, shared_dir, dcgm, _progress(False))
    out_dir = given_path(out_path, "--out")
    ran = sum(1 for p in bundle.manifest.probes if p.exit_code is not None)
    out.print(f"bundle written to {out_dir}: {len(bundle.files)} files, {ran} of {len(bundle.manifest.probes)} probes ran")
