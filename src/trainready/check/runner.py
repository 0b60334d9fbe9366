"""What `trainready check [collect]` does, as library code: which options go together, then the files-only,
bundle or live path (with --fix, --dcgm and --deep on this machine), ending in one Report. The command parses
options into CheckOptions, calls `run_check` with its progress display, and renders the Report; this module
prints nothing (moved out of cli/check_cmd.py for issue 25)."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from trainready.errors import UsageError


class Sink(Protocol):
    def advance(self, amount: float = 1) -> None: ...


Progress = Callable[[str, int], AbstractContextManager[Sink]]
"""progress(label, total) -> a context manager yielding something with advance(): the command's progress bar."""


class _Silent:
    def advance(self, amount: float = 1) -> None:
        pass


class _NoProgress:
    def __enter__(self) -> _Silent:
        return _Silent()

    def __exit__(self, *exc: object) -> None:
        return None


def no_progress(label: str, total: int) -> AbstractContextManager[Sink]:
    return _NoProgress()


@dataclass
class CheckOptions:
    """`check`'s options as given (paths as text: an empty one is a usage error, not the current directory)."""
    bundle: str | None = None
    instance: str | None = None
    cpu_only: bool = False
    needs_of: Callable[[str | None], Any] | None = None  # the instance type -> the job's needs (--job/--model)
    wants_job: bool = False  # --job given: the instance type may come from it
    deep: bool = False
    hot_dir: str | None = None
    shared_dir: str | None = None
    dcgm: int | None = None
    fix: bool = False
    mig: bool = False
    nccl_tests: list[str] = field(default_factory=list)
    dcgm_output: list[str] = field(default_factory=list)
    dataset: str | None = None
    file_only_conflicts: list[str] = field(default_factory=list)  # options the files-only mode would ignore


def given_path(value: str | None, option: str, what: str = "a directory") -> Path | None:
    """A path option as given; an empty one is a usage error (Path('') would mean the current directory)."""
    if value is None:
        return None
    if not value:
        raise UsageError(f"{option} is an empty path: name {what}")
    return Path(value)


def measured_dirs(deep: bool, hot_dir: str | None, shared_dir: str | None) -> tuple[str | None, str | None]:
    """--hot-dir/--shared-dir checked before anything runs: only with --deep, and each an existing
    directory (one the user named that is not there is a mistake, not a storage finding)."""
    for option, value in (("--hot-dir", hot_dir), ("--shared-dir", shared_dir)):
        path = given_path(value, option)
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


def this_machine_only(bundle_dir: Path | None, dcgm: int | None, fix: bool) -> None:
    """--dcgm and --fix act on this machine: a level other than 1-3, or either with --bundle, is a usage error."""
    from .dcgm import LEVELS

    if dcgm is not None and dcgm not in LEVELS:
        raise UsageError(f"--dcgm {dcgm}: the DCGM diagnostic levels are 1 (seconds), 2 (minutes) and 3 (up to half "
                         "an hour)")
    if bundle_dir is not None and (dcgm is not None or fix):
        if dcgm is not None:
            raise UsageError(f"--dcgm {dcgm} runs dcgmi on this machine: with --bundle, drop it "
                             "(the bundle's dcgm-diag.json is judged anyway)")
        raise UsageError("--fix changes this machine's GPU settings: with --bundle, drop it (or --bundle)")


def run_check(opts: CheckOptions, progress: Progress = no_progress) -> Any:
    """The check's Report; None on a torchrun rank other than 0 under --deep (rank 0 reports)."""
    from .analyze import analyze
    from .bundle import Bundle, instance_name
    from .inputs import checks_for, single_files
    from .probes import detect_instance_type

    if opts.cpu_only and opts.instance:
        raise UsageError(f"--cpu-only and --instance {opts.instance} exclude each other: --cpu-only says this node "
                         "has no GPU, the instance type says how many it has; pass one of them")
    bundle_dir = given_path(opts.bundle, "--bundle")
    if bundle_dir is not None and (opts.hot_dir is not None or opts.shared_dir is not None):
        raise UsageError("--hot-dir and --shared-dir measure this machine: with --bundle, --deep reads the "
                         "bundle's deep.json; drop them (or --bundle)")
    hot, shared = measured_dirs(opts.deep, opts.hot_dir, opts.shared_dir)
    this_machine_only(bundle_dir, opts.dcgm, opts.fix)
    if len(opts.dcgm_output) > 1:
        raise UsageError("--dcgm-output given twice: give one dcgmi diag output (run the diagnostic once, at the "
                         "level you want)")
    origins: dict[str, str] = {}
    given = single_files(opts.nccl_tests, opts.dcgm_output[0] if opts.dcgm_output else None, origins)
    if given and bundle_dir is None:  # the files alone: no probes, only the checks they feed
        if opts.file_only_conflicts:
            raise UsageError(f"--nccl-tests/--dcgm-output without --bundle judge only those files: "
                             f"{', '.join(opts.file_only_conflicts)} would be ignored; drop it (or add --bundle DIR, "
                             "or run check on the node)")
        files_only = Bundle(given, None, source="given files")
        files_only.origins = origins
        return analyze(files_only, opts.instance, deep=False, only=checks_for(given))
    loaded = Bundle.load(bundle_dir) if bundle_dir is not None else None  # read once: a bundle can change
    if loaded is not None:
        loaded.files.update(given)
        loaded.origins.update(origins)
        for name in given:
            loaded.refused.pop(name, None)  # the user's file stands in for one the bundle could not give
    detected = None  # live: the instance type detected on EC2 (judged like a bundle's instance-type.txt)
    if loaded is None and not opts.instance:
        detected = detect_instance_type()
    needs = None
    if opts.needs_of is not None:
        node = opts.instance  # the node the job would run on: the one given, else the bundle's, else this one's
        if not node:
            node = (loaded.instance_type() if loaded is not None else instance_name(detected or ""))[0]
        if not (node or opts.wants_job):
            raise UsageError("--model needs the instance type: pass --instance TYPE (e.g. p4d.24xlarge)")
        needs = opts.needs_of(node)
    fixed = None
    if loaded is not None:
        report = analyze(loaded, opts.instance, needs, deep=opts.deep, cpu_only=opts.cpu_only, mig=opts.mig)
    else:
        if opts.fix and os.environ.get("LOCAL_RANK", "0") == "0":  # one process per node changes its GPUs
            from .fix import apply_fixes

            fixed = apply_fixes()
        live = collect_live(None, opts.instance or detected, progress)
        if opts.dcgm is not None and os.environ.get("LOCAL_RANK", "0") == "0":
            add_dcgm(live, opts.dcgm, progress)
        if opts.deep:
            rank = add_deep(live, hot, shared, progress, opts.instance or detected)
            if rank != 0:  # under torchrun: every rank measured, rank 0 reports
                return None
        # a detected type travels in the bundle (instance-type.txt), where analyze judges it as found,
        # not as the user's word: one unknown to the catalog is checked without, not a usage error
        live.files.update(given)
        live.origins.update(origins)
        report = analyze(live, opts.instance, needs, deep=opts.deep, live=True, cpu_only=opts.cpu_only, mig=opts.mig)
    if fixed is not None:
        report = report.adding(fixed)
    if opts.dataset is not None:  # not part of the quick probes' budget: only when asked, after them
        from .dataset_scan import dataset_finding, scan_dataset

        report = report.adding(dataset_finding(scan_dataset(opts.dataset), opts.dataset))
    return report


def collect_live(out_dir: Path | None, instance: str | None, progress: Progress = no_progress) -> Any:
    from .probes import PROBE_COUNT, collect

    with progress("probing this node", PROBE_COUNT) as sink:
        return collect(out_dir, instance_type=instance, on_progress=sink.advance)


def add_dcgm(bundle: Any, level: int, progress: Progress = no_progress) -> None:
    from .dcgm import run_dcgm

    with progress(f"DCGM diagnostic level {level} (dcgmi diag)", 1) as sink:
        run_dcgm(bundle, level)
        sink.advance(1)


def add_deep(bundle: Any, hot: str | None, shared: str | None, progress: Progress = no_progress,
             instance_type: str | None = None) -> int:
    """Run the --deep measurements into the bundle; returns this process's rank (0 alone). Under torchrun
    (WORLD_SIZE > 1) every rank joins one process group (NCCL on GPUs, gloo otherwise) for the whole job."""
    from .deep import deep_steps, run_deep

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
        with progress(f"measuring (--deep): {what}", deep_steps(hot, shared)) as sink:
            bundle.files["deep.json"] = json.dumps(run_deep(hot, shared, on_progress=sink.advance,
                                                            instance_type=instance_type or bundle_type(bundle)))
    finally:
        if distributed:
            dist.barrier()
            dist.destroy_process_group()
    return rank


def bundle_type(bundle: Any) -> str | None:
    from .bundle import instance_name

    return instance_name(bundle.files.get("instance-type.txt") or "")[0]


def collect_bundle(out_path: str, instance: str | None, deep: bool, hot_dir: str | None, shared_dir: str | None,
                   dcgm: int | None, progress: Progress = no_progress) -> Any:
    """`check collect --out DIR`: every probe's raw output (and --dcgm, --deep) saved as a bundle; the Bundle."""
    from .probes import detect_instance_type

    out_dir = given_path(out_path, "--out")
    hot, shared = measured_dirs(deep, hot_dir, shared_dir)
    this_machine_only(None, dcgm, False)
    bundle = collect_live(out_dir, instance or detect_instance_type(), progress)
    if dcgm is not None:
        add_dcgm(bundle, dcgm, progress)
        bundle.save(out_dir)  # the manifest gains dcgmi's record; redacted, private
    if deep and add_deep(bundle, hot, shared, progress, instance_type=bundle_type(bundle)) == 0:
        bundle.save(out_dir, ["deep.json"])  # through the bundle writer: redacted, private
    return bundle
