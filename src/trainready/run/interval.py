"""`--ckpt-every auto`: the Young/Daly checkpoint interval from measured times.

tau = sqrt(2 x stall x MTBF) - stall, with stall the time a save blocks training (measured
here, on this node) and MTBF the whole job's (plan/reliability.py states the assumptions:
on-demand from the Llama 3 paper's failure rate per GPU, spot one interruption per node-day).
The interval in steps is tau over the measured step time, at least 1.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainready.plan.reliability import SPOT_NODE_MTBF_H, job_mtbf_h, young_daly


@dataclass(frozen=True, slots=True)
class IntervalChoice:
    every_steps: int
    tau_s: float
    stall_s: float
    step_s: float
    mtbf_h: float
    assumption: str

    def describe(self) -> str:
        return (f"checkpoint every {self.every_steps} steps (Young/Daly: tau = sqrt(2 x {self.stall_s:.2f} s stall x "
                f"{self.mtbf_h:.1f} h MTBF) - stall = {self.tau_s:.0f} s at {self.step_s:.2f} s/step; {self.assumption})")


def job_mtbf(nnodes: int, gpus_per_node: int, spot: bool, override_h: float | None) -> tuple[float, str]:
    if override_h is not None:
        return override_h, f"MTBF {override_h:g} h given"
    mtbf = job_mtbf_h(nnodes, gpus_per_node, spot)
    if spot:
        return mtbf, (f"spot: assumed one interruption per node every {SPOT_NODE_MTBF_H:g} h, {nnodes} node(s); "
                      "set --mtbf-hours if you know better")
    return mtbf, f"on-demand: Llama 3 paper's failure rate for {nnodes * gpus_per_node} GPU(s)"


def choose_interval(stall_s: float, step_s: float, mtbf_h: float, assumption: str) -> IntervalChoice:
    stall = max(stall_s, 1e-3)
    tau = young_daly(stall, mtbf_h * 3600.0)
    every = max(1, round(tau / step_s)) if step_s > 0 else 1
    return IntervalChoice(every, tau, stall_s, step_s, mtbf_h, assumption)
