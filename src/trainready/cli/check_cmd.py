"""`trainready check [collect]`: is this node what was paid for, and ready to train?"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Optional

import typer

from trainready.errors import UsageError

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
# Path options are taken as text (_given_path): a pathlib.Path option turns '' into Path('.'), and an
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
    from trainready.check.analyze import analyze, job_needs
    from trainready.check.bundle import Bundle, instance_name
    from trainready.check.inputs import checks_for, single_files
    from trainready.check.probes import detect_instance_type

    if cpu_only and instance:
        raise UsageError(f"--cpu-only and --instance {instance} exclude each other: --cpu-only says this node "
                         "has no GPU, the instance type says how many it has; pass one of them")
    bundle_dir = _given_path(bundle, "--bundle")
    job_path = _given_path(job, "--job", "a job spec file")
    if bundle_dir is not None and (hot_dir is not None or shared_dir is not None):
        raise UsageError("--hot-dir and --shared-dir measure this machine: with --bundle, --deep reads the "
                         "bundle's deep.json; drop them (or --bundle)")
    hot, shared = _measured_dirs(deep, hot_dir, shared_dir)
    _this_machine_only(bundle_dir, dcgm, fix)
    if dcgm_output and len(dcgm_output) > 1:
        raise UsageError("--dcgm-output given twice: give one dcgmi diag output (run the diagnostic once, at the level you want)")
    origins: dict[str, str] = {}
    given = single_files(nccl_tests or [], dcgm_output[0] if dcgm_output else None, origins)
    if given and bundle_dir is None:  # the files alone: no probes, only the checks they feed
        ignored = [name for name, on in (("--deep", deep), ("--fix", fix), ("--dcgm", dcgm is not None), ("--job", job),
                                         ("--model", model), ("--method", method), ("--strategy", strategy),
                                         ("--offload", offload), ("--dataset", dataset), ("--mig", mig),
                                         ("--cpu-only", cpu_only)) if on]
        if ignored:
            raise UsageError(f"--nccl-tests/--dcgm-output without --bundle judge only those files: {', '.join(ignored)} "
                             "would be ignored; drop it (or add --bundle DIR, or run check on the node)")
        files_only = Bundle(given, None, source="given files")
        files_only.origins = origins
        report = analyze(files_only, instance, deep=False, only=checks_for(given))
        _finish(report, json_out)
        return
    loaded = Bundle.load(bundle_dir) if bundle_dir is not None else None  # read once: a bundle can change
    if loaded is not None:
        loaded.files.update(given)
        loaded.origins.update(origins)
        for name in given:
            loaded.refused.pop(name, None)  # the user's file stands in for one the bundle could not give
    detected = None  # live: the instance type detected on EC2 (judged like a bundle's instance-type.txt)
    if loaded is None and not instance:
        detected = detect_instance_type()
    needs = None
    if job_path or model:
        node = instance  # the node the job would run on: the one given, else the bundle's, else this one's
        if not node:
            node = (loaded.instance_type() if loaded is not None else instance_name(detected or ""))[0]
        if not (node or job_path):
            raise UsageError("--model needs the instance type: pass --instance TYPE (e.g. p4d.24xlarge)")
        needs = job_needs(o.build_job(job_path, model=model, method=method, strategy=strategy, offload=offload, instance=node))
    fixed = None
    if loaded is not None:
        report = analyze(loaded, instance, needs, deep=deep, cpu_only=cpu_only, mig=mig)
    else:
        if fix and os.environ.get("LOCAL_RANK", "0") == "0":  # one process per node changes its GPUs
            from trainready.check.fix import apply_fixes

            fixed = apply_fixes()
        live = _collect(None, instance or detected, json_out)
        if dcgm is not None and os.environ.get("LOCAL_RANK", "0") == "0":
            _add_dcgm(live, dcgm, json_out)
        if deep:
            rank = _add_deep(live, hot, shared, json_out, instance or detected)
            if rank != 0:  # under torchrun: every rank measured, rank 0 reports
                return
        # a detected type travels in the bundle (instance-type.txt), where analyze judges it as found,
        # not as the user's word: one unknown to the catalog is checked without, not a usage error
        live.files.update(given)
        live.origins.update(origins)
        report = analyze(live, instance, needs, deep=deep, live=True, cpu_only=cpu_only, mig=mig)
    if fixed is not None:
        report = report.adding(fixed)
    if dataset is not None:  # not part of the quick probes' budget: only when asked, after them
        from trainready.check.dataset_scan import dataset_finding, scan_dataset

        report = report.adding(dataset_finding(scan_dataset(dataset), dataset))
    _finish(report, json_out)


def _finish(report, json_out: bool) -> None:
    if json_out:
        emit_json(report)
    else:
        from .render_check import render_check

        render_check(out, report)
    if report.exit_code:
        raise typer.Exit(report.exit_code)


def _this_machine_only(bundle_dir: Path | None, dcgm: int | None, fix: bool) -> None:
    """--dcgm and --fix act on this machine: a level other than 1-3, or either with --bundle, is a usage error."""
    from trainready.check.dcgm import LEVELS

    if dcgm is not None and dcgm not in LEVELS:
        raise UsageError(f"--dcgm {dcgm}: the DCGM diagnostic levels are 1 (seconds), 2 (minutes) and 3 (up to half an hour)")
    if bundle_dir is not None and (dcgm is not None or fix):
        if dcgm is not None:
            raise UsageError(f"--dcgm {dcgm} runs dcgmi on this machine: with --bundle, drop it "
                             "(the bundle's dcgm-diag.json is judged anyway)")
        raise UsageError("--fix changes this machine's GPU settings: with --bundle, drop it (or --bundle)")


def _add_dcgm(bundle, level: int, json_out: bool) -> None:
    from trainready.check.dcgm import run_dcgm

    with progress(f"DCGM diagnostic level {level} (dcgmi diag)", total=1, as_json=_quiet(json_out)) as sink:
        run_dcgm(bundle, level)
        sink.advance(1)


def _given_path(value: str | None, option: str, what: str = "a directory") -> Path | None:
    """A path option as given; an empty one is a usage error (Path('') would mean the current directory)."""
    if value is None:
        return None
    if not value:
        raise UsageError(f"{option} is an empty path: name {what}")
    return Path(value)


def _measured_dirs(deep: bool, hot_dir: str | None, shared_dir: str | None) -> tuple[str | None, str | None]:
    """--hot-dir/--shared-dir checked before anything runs: only with --deep, and each an existing
    directory (one the user named that is not there is a mistake, not a storage finding)."""
    import os
    import stat

    for option, value in (("--hot-dir", hot_dir), ("--shared-dir", shared_dir)):
        path = _given_path(value, option)
        if path is None:
            continue
        if not deep:
            raise UsageError(f"{option} {path} is measured only with --deep: add --deep (or drop {option})")
        try:
            mode = os.stat(path).st_mode
        except FileNotFoundError:
            raise UsageError(f"{option} {path} does not exist: name a directory on that storage") from None
        except OSError as exc:
            raise UsageError(f"{option} {path}: {exc.strerror or exc}") from None
        if not stat.S_ISDIR(mode):
            raise UsageError(f"{option} {path} is not a directory: name a directory on that storage")
    return hot_dir, shared_dir


def _quiet(json_out: bool) -> bool:
    """No progress with --json, in pipes (console.progress), or on any torchrun rank but 0."""
    import os

    return json_out or os.environ.get("RANK", "0") != "0"


def _collect(out_dir: Path | None, instance: str | None, json_out: bool):
    from trainready.check.probes import PROBE_COUNT, collect

    with progress("probing this node", total=PROBE_COUNT, as_json=_quiet(json_out)) as sink:
        return collect(out_dir, instance_type=instance, on_progress=sink.advance)


def _add_deep(bundle, hot: str | None, shared: str | None, json_out: bool = False, instance_type: str | None = None) -> int:
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
    try:
        what = "GEMM, all-reduce" + (", hot tier" if hot else "") + (", shared storage" if shared else "")
        with progress(f"measuring (--deep): {what}", total=deep_steps(hot, shared),
                      as_json=_quiet(json_out)) as sink:
            bundle.files["deep.json"] = json.dumps(run_deep(hot, shared, on_progress=sink.advance,
                                                            instance_type=instance_type or _bundle_type(bundle)))
    finally:
        if distributed:
            dist.barrier()
            dist.destroy_process_group()
    return rank


def _bundle_type(bundle) -> str | None:
    from trainready.check.bundle import instance_name

    return instance_name(bundle.files.get("instance-type.txt") or "")[0]


@app.command("collect", help=f"Save every probe's raw output into a bundle directory (analyze it with --bundle).\n\n{CODES}")
def collect_cmd(out_path: Annotated[str, typer.Option("--out", metavar="DIR", help="Bundle directory to write.")],
                instance: Instance = None, deep: Deep = False, hot_dir: HotDir = None, shared_dir: SharedDir = None,
                dcgm: Dcgm = None) -> None:
    from trainready.check.probes import detect_instance_type

    out_dir = _given_path(out_path, "--out")
    hot, shared = _measured_dirs(deep, hot_dir, shared_dir)
    _this_machine_only(None, dcgm, False)
    bundle = _collect(out_dir, instance or detect_instance_type(), False)
    if dcgm is not None:
        _add_dcgm(bundle, dcgm, False)
        bundle.save(out_dir)  # the manifest gains dcgmi's record; redacted, private
    if deep and _add_deep(bundle, hot, shared, instance_type=_bundle_type(bundle)) == 0:
        bundle.save(out_dir, ["deep.json"])  # through the bundle writer: redacted, private
    ran = sum(1 for p in bundle.manifest.probes if p.exit_code is not None)
    out.print(f"bundle written to {out_dir}: {len(bundle.files)} files, {ran} of {len(bundle.manifest.probes)} probes ran")
