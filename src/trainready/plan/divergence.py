"""Predicted vs measured, per part of the step: which part diverges most, and what to do about it.

Pure: the planner's StepResult and a run's measured parts in, a PlanCheck out (`trainready report`
shows it; `report --json` has it as `plan_check`). A part is named as the divergence only when it
differs from its prediction by RATIO or more *and* the difference is at least SHARE of the measured
step: a 3x on a part that takes 1% of the step changes nothing anyone would act on.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, Field

RATIO = 1.25
SHARE = 0.05

Part = Literal["step", "compute", "communication", "optimizer", "data wait"]


class PartCheck(BaseModel):
    part: Part
    predicted_s: float | None = Field(description="the planner's seconds per step (None: not predicted: data wait)")
    measured_s: float | None = Field(description="the run's median seconds per step (None: not measured)")
    ratio: float | None = Field(description="measured / predicted (None: one side unknown)")


class PlanCheck(BaseModel):
    """The run's measured step against what the planner predicts for its configuration."""

    configuration: str = Field(description="what was predicted, in words")
    factors: str = Field(description="the efficiency factors the prediction used")
    parts: list[PartCheck]
    divergence: Part | None = Field(description="the part furthest from its prediction (None: all within "
                                                 f"{RATIO:g}x or under {SHARE:.0%} of the step)")
    ratio: float | None = Field(description="measured / predicted of that part")
    message: str = Field(description="the finding and what to do, in words")


def _advice(part: str, slower: bool, multi_node: bool, run_dir: str, job: str | None) -> str:
    flags = f"--job {job}" if job else "<the run's flags>"
    calibrate = f"`trainready estimate {flags} --calibrate {run_dir}` fits the planner to this run"
    if part == "communication":
        if not slower:
            return f"the run hides more communication than the planner assumes; {calibrate}"
        if multi_node:
            return ("run `trainready check --deep` on the nodes (under torchrun, so the all-reduce spans them), "
                    "look at nccl.allreduce and net.efa")
        return "run `trainready check --deep`, look at nccl.allreduce and gpu.nvlink-links"
    if part == "compute":
        if slower:
            return f"run `trainready check --deep`, look at gpu.matmul and gpu.throttle; {calibrate}"
        return f"the kernels are faster than the stack assumes (fused or compiled? see --stack); {calibrate}"
    if part == "optimizer":
        if slower:
            return "use a fused AdamW (torch.optim.AdamW(fused=True)); with CPU offload, bind cores to ranks"
        return calibrate
    if part == "data wait":
        return "the data loader keeps the GPUs waiting: `trainready data bench` measures the pipeline"
    return f"measure the step's split (`trainready run` times data, communication and optimizer); {calibrate}"


def compare(*, predicted_step_s: float, predicted_compute_s: float, predicted_comm_s: float,
            predicted_optimizer_s: float, measured_step_s: float | None, measured_compute_s: float | None,
            measured_comm_s: float | None, measured_optimizer_s: float | None, measured_data_s: float | None,
            configuration: str, factors: str, multi_node: bool, run_dir: str, job: str | None = None) -> PlanCheck:
    """Each part's measured/predicted ratio and the biggest divergence worth acting on. Measured
    step = the run's step less data wait and time outside the step (checkpoint saves), like the
    planner's; data wait is shown but never predicted."""
    rows = [("step", predicted_step_s, measured_step_s), ("compute", predicted_compute_s, measured_compute_s),
            ("communication", predicted_comm_s, measured_comm_s),
            ("optimizer", predicted_optimizer_s, measured_optimizer_s), ("data wait", None, measured_data_s)]
    parts = [PartCheck(part=name, predicted_s=p, measured_s=m,
                       ratio=m / p if (p is not None and m is not None and p > 0) else None) for name, p, m in rows]
    whole = measured_step_s or predicted_step_s
    candidates = []
    for c in parts:
        if c.part == "step" or c.measured_s is None:
            continue
        gap = abs(c.measured_s - (c.predicted_s or 0.0))
        r = c.ratio
        score = math.inf if not r else abs(math.log(r))  # not predicted (data wait, nothing exposed) or 0 measured
        if score >= math.log(RATIO) and whole > 0 and gap >= SHARE * whole:
            candidates.append((score, gap, c))
    if not candidates:
        step = parts[0]
        if step.ratio is not None and max(step.ratio, 1 / step.ratio) >= RATIO:
            msg = (f"step {step.ratio:.2g}x predicted, and no measured part explains it: "
                   f"{_advice('step', step.ratio > 1, multi_node, run_dir, job)}")
            return PlanCheck(configuration=configuration, factors=factors, parts=parts, divergence="step",
                             ratio=step.ratio, message=msg)
        within = f"within {RATIO:g}x of the prediction" + (f" (step {step.ratio:.2f}x)" if step.ratio else "")
        return PlanCheck(configuration=configuration, factors=factors, parts=parts, divergence=None, ratio=None,
                         message=f"every measured part is {within}")
    _, _, worst = max(candidates, key=lambda t: (t[0], t[1]))
    if not worst.ratio:
        what = f"{worst.part} {worst.measured_s:.3g} s per step, predicted {worst.predicted_s or 0:.3g} s"
        slower = worst.measured_s > (worst.predicted_s or 0.0)
    else:
        what = f"{worst.part} {worst.ratio:.2g}x predicted ({worst.measured_s:.3g} s vs {worst.predicted_s:.3g} s)"
        slower = worst.ratio > 1
    return PlanCheck(configuration=configuration, factors=factors, parts=parts, divergence=worst.part,
                     ratio=worst.ratio, message=f"{what}: {_advice(worst.part, slower, multi_node, run_dir, job)}")
