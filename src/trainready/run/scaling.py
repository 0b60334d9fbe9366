"""`trainready run --scaling 1,2,4,8`: the same job briefly at each process count.

Weak scaling: every process keeps its batch, so ideally the step time stays flat and
throughput grows with the count. Efficiency = tokens/s at N / (N/base x tokens/s at base).
Where the lost time went is the growth of each part of the step over the smallest count:
data wait, exposed communication, compute, optimizer, and other (outside `sess.step()`).
Each point runs in its own fresh run directory (no checkpoints are resumed or kept).
"""

from __future__ import annotations

import shutil
import statistics
from dataclasses import replace
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from trainready.errors import UsageError
from trainready.io import redact_argv

from .launcher import Launcher, LaunchSpec
from .run_dir import RunDir
from .summary import SPLIT_PARTS, WARMUP_STEPS, has_split, split_total

PARTS = ("data", "comm", "compute", "optimizer", "other", "unattributed")
ADVICE = {
    "data": "the data loader does not keep up at this count: more loader workers, pinned memory, shards on local "
            "NVMe or streamed from object storage (`trainready data`)",
    "comm": "gradient communication is exposed: check links with `trainready check --deep` (NVLink, EFA), larger "
            "DDP buckets or FSDP prefetch for overlap, bf16 reduction, a larger per-process batch",
    "compute": "each process computes slower when more run: they share CPU cores, memory bandwidth or a throttled "
               "GPU (see `trainready check`: vCPUs per GPU, clocks, PCIe)",
    "optimizer": "the optimizer step grows: a non-sharded optimizer on a larger world, or CPU offload contention",
    "other": "time outside the step grows: synchronization, logging or checkpoint stalls",
    "unattributed": "the growth is in compute or in a part the script does not let trainready measure (named "
                    "above): time it with `sess.watch(ddp_model)`, `with t.comm():`, `with t.optimizer():`, "
                    "`t.data(batch)` to see which",
}


class ScalingPoint(BaseModel):
    model_config = ConfigDict(extra="forbid")
    processes: int
    exit_code: int
    steps_measured: int
    tokens_per_s: float | None
    tokens_per_s_per_process: float | None
    efficiency: float | None
    step_s: float | None
    data_s: float | None
    comm_s: float | None
    compute_s: float | None
    optimizer_s: float | None
    other_s: float | None
    unattributed_s: float | None = Field(None, description="median compute plus unmeasured parts, when a part is "
                                                           "unmeasured (then that part and compute_s are None)")
    unmeasured: list[str] = Field([], description="parts some measured step did not measure")
    timing: str | None = Field(None, description="host or cuda-events")


class ScalingReport(BaseModel):
    model_config = ConfigDict(extra="forbid")
    schema_version: int = 1
    kind: Literal["trainready-scaling"] = "trainready-scaling"
    command: list[str]
    steps_per_point: int
    points: list[ScalingPoint]
    findings: list[str]
    ok: bool


def parse_counts(text: str) -> list[int]:
    try:
        counts = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise UsageError(f"--scaling {text!r}: comma-separated process counts, e.g. 1,2,4,8") from None
    if not counts or counts[0] < 1:
        raise UsageError(f"--scaling {text!r}: process counts must be >= 1")
    return counts


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def measure(run_dir, processes: int, exit_code: int) -> ScalingPoint:
    records = RunDir(run_dir).read_records()
    steps = [r for r in records if r["type"] == "step"][WARMUP_STEPS:]
    split = [r for r in steps if has_split(r)]
    # a part any step did not measure is unknown for the point: never counted as zero (issue 15)
    unknown = [k for k in SPLIT_PARTS if any(not isinstance(r.get(f"{k}_s"), (int, float)) for r in split)]
    col = {k: [r[f"{k}_s"] for r in split] for k in SPLIT_PARTS if k not in unknown}
    rest = [split_total(r) - sum(r[f"{k}_s"] for k in col) for r in split]
    other = [max(0.0, (r.get("interval_s") or 0.0) - split_total(r)) for r in split]
    tps = _median([r["tokens_per_s"] for r in steps if r.get("tokens_per_s")])
    return ScalingPoint(processes=processes, exit_code=exit_code, steps_measured=len(steps), tokens_per_s=tps,
                        tokens_per_s_per_process=tps / processes if tps else None, efficiency=None,
                        step_s=_median([r["interval_s"] for r in steps if r.get("interval_s")]),
                        data_s=_median(col.get("data", [])), comm_s=_median(col.get("comm", [])),
                        compute_s=None if unknown else _median(rest), optimizer_s=_median(col.get("optimizer", [])),
                        other_s=_median(other), unattributed_s=_median(rest) if unknown else None, unmeasured=unknown,
                        timing="+".join(sorted({r.get("timing") or "host" for r in split})) or None)


def findings(points: list[ScalingPoint]) -> list[str]:
    base = points[0]
    out = []
    for p in points[1:]:
        if not (p.tokens_per_s and base.tokens_per_s and p.step_s and base.step_s):
            out.append(f"{p.processes} processes: no measurement (exit code {p.exit_code})")
            continue
        lost = p.step_s - base.step_s
        growth = _growth(base, p)
        line = (f"{p.processes} vs {base.processes} processes: {p.tokens_per_s:,.0f} tokens/s, efficiency "
                f"{p.efficiency:.0%}; step time {base.step_s:.3f} -> {p.step_s:.3f} s")
        unmeasured = sorted(set(p.unmeasured) | set(base.unmeasured))
        if unmeasured:
            line += f" ({', '.join(unmeasured)} not measured: counted as unknown, not zero)"
        if lost > 0.02 * base.step_s and growth:
            worst = max(growth, key=growth.get)
            split = ", ".join(f"{part} {g:+.3f} s" for part, g in growth.items() if abs(g) >= 0.0005)
            line += f" ({split}); most went to {worst}: {ADVICE[worst]}"
        else:
            line += ": scales as it should"
        out.append(line)
    return out


def _growth(base: ScalingPoint, p: ScalingPoint) -> dict[str, float]:
    """Each part's growth over the base count, for the parts measured at both (an unmeasured part
    is left out, and compute with it: their time is `unattributed`, compared only with itself)."""
    out = {}
    for part in PARTS:
        a, b = getattr(base, f"{part}_s"), getattr(p, f"{part}_s")
        if part == "unattributed" and (a is None) != (b is None):
            a = base.compute_s if a is None else a  # compute at one count, compute + unknowns at the other
            b = p.compute_s if b is None else b
        if a is not None and b is not None:
            out[part] = b - a
    if "unattributed" in out:
        out.pop("compute", None)
    return out


def run_scaling(spec: LaunchSpec, counts: list[int], steps: int, quiet: bool = False) -> ScalingReport:
    points = []
    for n in counts:
        run_dir = spec.run_dir / "scaling" / f"n{n}"
        shutil.rmtree(run_dir, ignore_errors=True)
        settings = spec.settings.model_copy(update={
            "run_dir": run_dir, "hot": str(run_dir / "checkpoints"), "archive": None, "ckpt_every": None,
            "max_steps": steps, "budget_usd": None})
        sub = replace(spec, settings=settings, nproc_per_node=n, max_restarts=0)
        say = (lambda _line: None) if quiet else print
        say(f"trainready: scaling point: {n} process(es), {steps} steps")
        result = Launcher(sub, say, lambda _records: None).run()
        points.append(measure(run_dir, n, result.exit_code))
        if result.reason == "signal":  # Ctrl-C ends the probe, not just this point
            break
    base = points[0]
    for p in points:
        if p.tokens_per_s and base.tokens_per_s:
            p.efficiency = p.tokens_per_s / (base.tokens_per_s * p.processes / base.processes)
    ok = all(p.exit_code == 0 and p.tokens_per_s for p in points)
    return ScalingReport(command=redact_argv(spec.command), steps_per_point=steps, points=points,
                         findings=findings(points), ok=ok)
