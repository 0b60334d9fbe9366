"""`estimate|plan --calibrate RUN_DIR|BUNDLE_DIR` and `--calibration NAME|FILE`: read what runs and
`check --deep` measured, fit the factors (plan/calibration.py), store and apply the calibration; and `report`'s
predicted-against-measured check. Library code (it lived in cli/ until issue 25): it reads run/ and check/ results
and plan/'s model, and prints nothing; the commands render what it returns."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from trainready.catalog import Catalog
from trainready.errors import UsageError, printable
from trainready.io import output_file, parse_json
from trainready.plan import calibration as cal
from trainready.plan import calibration_file as cf
from trainready.plan.job import JobSpec, load_job
from trainready.plan.setup import Setup, resolve
from trainready.run.records import finite


# --- what a run measured ------------------------------------------------------------------------
def _is_run_dir(path: Path) -> bool:
    from trainready.run.run_dir import RunDir
    from trainready.run.settings import node_run_dirs

    return RunDir(path).holds_a_run() or bool(node_run_dirs(path))


def _job_of_run(run_dir: Path, info: dict[str, Any]) -> Path | None:
    config = info.get("config") if isinstance(info.get("config"), dict) else {}
    job = config.get("job")
    if not isinstance(job, str) or not job:
        return None
    path = Path(job)
    if not path.is_absolute():
        env = info.get("environment") if isinstance(info.get("environment"), dict) else {}
        cwd = env.get("cwd")
        path = Path(cwd) / path if isinstance(cwd, str) and cwd else run_dir / path
    return path if path.exists() else None


def run_setup(run_dir: Path, lead: Path, catalog: Catalog, fallback: Setup | None) -> tuple[Setup, str, Path | None]:
    """The configuration a run ran: its job spec (`trainready run --job`) when it still loads, else
    `fallback` (the estimate's own flags), else a UsageError saying what to give. `lead`: the directory
    its summary was made from (a multi-node run: the node where global rank 0 ran)."""
    from trainready.run.summary import load_run_info

    job = _job_of_run(lead, load_run_info(lead))
    if job is not None:
        return resolve(load_job(job, regular_only=True), catalog), f"the run's job spec {printable(job)}", job
    if fallback is None:
        raise UsageError(f"run {printable(run_dir)} recorded no job spec (launch with `trainready run --job FILE`): "
                         f"name its configuration with `trainready estimate <its flags, --micro-batch too> "
                         f"--calibrate {printable(run_dir)}`")
    return fallback, "this estimate's flags (the run recorded no job spec: they must be the run's)", None


def run_measurement(run_dir: Path, catalog: Catalog, fallback: Setup | None,
                    summary: Any = None) -> tuple[cal.StepMeasurement, list[str], Path | None]:
    """A run's median step, split into the parts it measured (summary.TimeShares x the median step)."""
    from trainready.run.summary import summarize

    s = summary or summarize(run_dir)
    if not s.step_s_median:
        raise UsageError(f"run {printable(run_dir)} has no timed steps yet: nothing to calibrate from")
    setup, where, job = run_setup(run_dir, Path(s.run_dir), catalog, fallback)
    if s.world_size and s.world_size != setup.n_gpus:
        raise UsageError(f"run {printable(run_dir)} ran {s.world_size} processes; the configuration from {where} has "
                         f"{setup.n_gpus} GPUs: give the run's configuration (--gpus {s.world_size} ...)")
    interval, sh = s.step_s_median, s.shares
    notes = [f"configuration: {where}"]
    label = f"run {run_dir.name}"
    if sh is None:
        notes.append("no step split recorded: the whole step only")
        m = cal.StepMeasurement(label, setup, step_s=interval, tokens_per_s=s.tokens_per_s_median)
        return m, notes, job
    part = lambda v: None if v is None else v * interval  # noqa: E731
    outside = sh.other + (sh.data or 0.0)  # data wait and what lies outside the step: not in the planner's step
    if sh.data is None:
        notes.append("data wait not measured: it is inside the step compared")
    unmeasured = [k for k, v in (("communication", sh.comm), ("optimizer", sh.optimizer)) if v is None]
    if unmeasured:
        notes.append(f"{' and '.join(unmeasured)} not measured: skipped (not taken as zero)")
    m = cal.StepMeasurement(label, setup, step_s=interval * max(0.0, 1 - outside), compute_s=part(sh.compute),
                            comm_s=part(sh.comm), optimizer_s=part(sh.optimizer), tokens_per_s=s.tokens_per_s_median)
    return m, notes, job


# --- what check --deep measured ----------------------------------------------------------------------
def _number(x: Any) -> float | None:
    """A positive figure of deep.json (records.finite: not a bool, a string, a NaN or an integer past a float)."""
    v = finite(x)
    return v if v is not None and v > 0 else None


def bundle_measurements(path: Path, catalog: Catalog) -> tuple[list[cal.Measurement], list[str], str | None]:
    """GEMM TFLOP/s, HBM copy GB/s and all-reduce busbw from a bundle's deep.json; (measurements, notes, instance)."""
    from trainready.check.bundle import Bundle

    bundle = Bundle.load(path)
    text = bundle.text("deep.json")
    if text is None and "deep.json" in bundle.refused:  # a symlink, a FIFO, over its size cap
        raise UsageError(f"bundle {printable(path)}: {printable(bundle.why_missing('deep.json'))}")
    if text is None:
        raise UsageError(f"bundle {printable(path)} has no deep.json: collect it with "
                         f"`trainready check --deep --out DIR`")
    try:
        deep = parse_json(text)
    except ValueError:
        raise UsageError(f"bundle {printable(path)}: deep.json is not JSON") from None
    if not isinstance(deep, dict):
        raise UsageError(f"bundle {printable(path)}: deep.json is not a JSON object")
    inst_name, _why = bundle.instance_type()
    inst = None
    if inst_name:
        try:
            inst = catalog.instance(inst_name)
        except UsageError:
            inst = None
    gemm = deep.get("gemm") if isinstance(deep.get("gemm"), dict) else {}
    gpu = catalog.gpu_of(inst) if inst else None
    if gpu is None and isinstance(gemm.get("device"), str):
        try:
            gpu = catalog.gpu(gemm["device"])
        except UsageError:
            gpu = None
    if gpu is None:
        raise UsageError(f"bundle {printable(path)}: which GPU it measured is unknown (no instance-type.txt the "
                         f"catalog knows, no GPU name in deep.json)")
    out: list[cal.Measurement] = []
    notes: list[str] = []
    label = f"bundle {path.name}"
    tflops, size = _number(gemm.get("tflops")), _number(gemm.get("size"))
    if tflops and size:
        out.append(cal.GemmMeasurement(label, gpu, tflops, int(size)))
        notes.append(f"GEMM {tflops:,.0f} TFLOP/s at {int(size)}^3")
    hbm = deep.get("memory") if isinstance(deep.get("memory"), dict) else {}
    copies = sorted(g["gbps"] for g in hbm.get("gpus", []) if isinstance(g, dict) and _number(g.get("gbps"))) \
        if isinstance(hbm.get("gpus"), list) else []
    if copies and hbm.get("counted") == "read + write":
        median = copies[len(copies) // 2]
        out.append(cal.HbmCopyMeasurement(label, gpu, float(median)))
        notes.append(f"HBM copy {median:,.0f} GB/s (median of {len(copies)} GPUs)")
    ar = deep.get("allreduce") if isinstance(deep.get("allreduce"), dict) else {}
    rows = [r for r in ar.get("rows", []) if isinstance(r, dict) and _number(r.get("busbw_gbps"))
            and _number(r.get("size_bytes"))] if isinstance(ar.get("rows"), list) else []
    world = ar.get("world_size")
    if ar.get("backend") == "nccl" and rows and isinstance(world, int) and world > 1:
        big = max(rows, key=lambda r: r["size_bytes"])
        per_node = inst.gpu_count if inst else min(world, 8)
        try:
            s = resolve(JobSpec(params=1e9, instance=inst.name if inst else None, gpu=None if inst else gpu.name,
                                gpus=world, gpus_per_node=min(world, per_node)), catalog)
            out.append(cal.BusbwMeasurement(label, s, float(big["busbw_gbps"]), float(big["size_bytes"])))
            notes.append(f"all-reduce {float(big['busbw_gbps']):,.0f} GB/s busbw over {world} GPUs")
        except UsageError as exc:
            notes.append(f"all-reduce not used: {exc}")
    elif ar:
        notes.append("all-reduce not used (not NCCL over several GPUs)")
    if not out:
        raise UsageError(f"bundle {printable(path)}: deep.json has no GEMM, HBM copy or NCCL all-reduce figure to "
                         f"calibrate from")
    return out, notes, inst.name if inst else None


# --- fit, save, apply ----------------------------------------------------------------------------------
def calibrate(paths: list[Path], ref: str | None, catalog: Catalog,
              setup: Setup | None) -> tuple[cf.CalibrationFile, Path]:
    """Fit to every path (run directories and bundles), save it as `ref` (a name in the config directory,
    or a file; None: GPU-stack), return it and where it went."""
    measurements: list[cal.Measurement] = []
    sources: list[cf.CalibrationSource] = []
    instance = setup.instance.name if setup is not None and setup.instance else None
    run_stack: str | None = None  # None: check --deep alone, which holds for any stack
    for path in paths:
        if not path.is_dir():
            raise UsageError(f"--calibrate {printable(path)}: not a directory (a run directory or a check bundle)")
        if _is_run_dir(path):
            m, notes, _job = run_measurement(path, catalog, setup)
            if run_stack is not None and m.setup.stack != run_stack:
                raise UsageError(f"--calibrate: these runs used different stacks ({run_stack}, {m.setup.stack}); "
                                 f"a calibration is for one stack: calibrate each on its own")
            measurements.append(m)
            run_stack = m.setup.stack
            instance = m.setup.instance.name if m.setup.instance else instance
            sources.append(cf.CalibrationSource(kind="run", path=str(path.absolute())[:4096], what=notes))
        elif not ((path / "deep.json").exists() or (path / "manifest.json").exists()):
            raise UsageError(f"--calibrate {printable(path)}: neither a run directory (run.json, telemetry.jsonl) nor "
                             f"a check bundle (deep.json from `trainready check --deep --out DIR`)")
        else:
            ms, notes, inst = bundle_measurements(path, catalog)
            measurements += ms
            instance = inst or instance
            sources.append(cf.CalibrationSource(kind="bundle", path=str(path.absolute())[:4096], what=notes))
    gpus = {cal.gpu_of(m).name for m in measurements}
    if len(gpus) > 1:
        raise UsageError(f"--calibrate: these sources ran on different GPUs ({', '.join(sorted(gpus))}); "
                         f"a calibration is for one GPU")
    try:
        result = cal.fit(measurements)
    except ValueError as exc:
        raise UsageError(f"--calibrate: {exc}") from None
    gpu = gpus.pop()
    target = Path(ref) if ref is not None and cf.is_path(ref) else None
    if target is not None:
        output_file(target, "--calibration", "my-gpu.json")  # where the fit is saved
        name = target.stem if re.fullmatch(cf.NAME_PATTERN, target.stem) else cf.default_name(gpu, run_stack)
    else:
        name = cf.valid_name(ref) if ref else cf.default_name(gpu, run_stack)
    out = cf.from_fit(name, result, gpu=gpu, instance=instance, stack=run_stack, sources=sources)
    return out, cf.save(out, target)


def applied(calibration: cf.CalibrationFile, setup: Setup) -> Setup:
    """`setup` with the calibration's factors (its GPU and stack checked)."""
    cf.check_applies(calibration, setup.gpu.name, setup.stack)
    return setup.with_(efficiency=cf.efficiency_for(calibration, setup))


def resolve_calibration(calibrate_paths: list[Path] | None, ref: str | None, catalog: Catalog,
                        setup: Setup | None) -> tuple[cf.CalibrationFile | None, str | None]:
    """The calibration to use (fitted now, or stored) and a line saying where it came from."""
    if calibrate_paths:
        made, path = calibrate(calibrate_paths, ref, catalog, setup)
        f = made.fit
        err, what = ((f.step_error_before, f.step_error_after), "step") if f.step_error_before is not None else \
            ((f.error_before, f.error_after), "figure")
        change = f"; {what} error {err[0]:.1%} -> {err[1]:.1%} on what it was fitted to" if err[0] is not None else ""
        later = path if ref is not None and cf.is_path(ref) else made.name
        return made, f"calibrated: saved '{made.name}' to {path}{change} (use it later with --calibration {later})"
    if ref is not None:
        return cf.load(ref, catalog), None
    return None, None


# --- report: predicted vs measured ----------------------------------------------------------------------
def plan_check(run_dir: Path, summary: Any, catalog: Catalog | None = None) -> Any:
    """The run's measured parts against the planner's prediction for its job spec (None: no timed steps,
    no job spec recorded, or one that no longer loads: the report goes on without the comparison)."""
    from trainready.catalog import load_catalog
    from trainready.plan.divergence import compare
    from trainready.plan.performance import estimate_step

    if not summary.step_s_median:
        return None
    try:
        catalog = catalog or load_catalog()
        m, _notes, job = run_measurement(run_dir, catalog, None, summary)
    except UsageError:  # no job spec recorded (or it no longer loads): nothing to compare with
        return None
    s = m.setup
    r = estimate_step(s)
    sh, interval = summary.shares, summary.step_s_median
    what = (f"{s.model.name}, {s.n_gpus} x {s.gpu.name}, {s.strategy}, micro-batch {s.micro_batch} x {s.seq_len}, "
            f"{s.grad_accum} micro-batch(es) per step")
    e = s.efficiency
    factors = e.source if e is not None else f"efficiency.py's for {s.gpu.arch}"
    return compare(predicted_step_s=r.step_s, predicted_compute_s=r.step_s - r.exposed_comm_s - r.optimizer_s,
                   predicted_comm_s=r.exposed_comm_s, predicted_optimizer_s=r.optimizer_s,
                   measured_step_s=m.step_s, measured_compute_s=m.compute_s, measured_comm_s=m.comm_s,
                   measured_optimizer_s=m.optimizer_s,
                   measured_data_s=sh.data * interval if sh is not None and sh.data is not None else None,
                   configuration=what, factors=factors, multi_node=s.nodes > 1, run_dir=str(run_dir),
                   job=str(job) if job else None)
