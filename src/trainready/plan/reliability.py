"""Failures, checkpoint interval and their cost in time: one place for the assumptions.

Young/Daly: the checkpoint interval that minimizes lost time is
    tau = sqrt(2 * delta * M) - delta
with delta the time training is blocked per checkpoint and M the job's mean time between
failures. The expected overhead fraction is then delta/tau + (tau/2 + restart)/M.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# On-demand: Llama 3 paper (Dubey et al. 2024, Sec. 3.3.4): 419 unexpected interruptions
# in 54 days on 16,384 H100 GPUs -> MTBF per GPU = 54*24*16384/419 = 50,676 h.
ON_DEMAND_GPU_MTBF_H = 50_676.0
# Spot: no public per-type rate; assumed one interruption per node per day. Override it.
SPOT_NODE_MTBF_H = 24.0
RESTART_S = {"on-demand": 600.0, "spot": 900.0}  # relaunch + reload; spot adds new capacity
STALL_FLOOR_S = 1.0  # staging never takes less than this (sync, snapshot of RNG/loader state)


@dataclass(frozen=True, slots=True)
class Reliability:
    mtbf_h: float  # the whole job's MTBF
    stall_s: float  # blocked per checkpoint
    interval_s: float  # Young/Daly
    overhead: float  # expected fraction of extra time (checkpoints + rework + restarts)
    restart_s: float


def job_mtbf_h(nodes: int, gpus_per_node: int, spot: bool, spot_mtbf_h: float | None = None) -> float:
    if spot:
        return (spot_mtbf_h or SPOT_NODE_MTBF_H) / nodes
    return ON_DEMAND_GPU_MTBF_H / (nodes * gpus_per_node)


def young_daly(stall_s: float, mtbf_s: float) -> float:
    return max(stall_s, math.sqrt(2 * stall_s * mtbf_s) - stall_s)


def reliability(stall_s: float, mtbf_h: float, spot: bool) -> Reliability:
    stall = max(stall_s, STALL_FLOOR_S)
    mtbf_s = mtbf_h * 3600
    tau = young_daly(stall, mtbf_s)
    restart = RESTART_S["spot" if spot else "on-demand"]
    overhead = stall / tau + (tau / 2 + restart) / mtbf_s
    return Reliability(mtbf_h=mtbf_h, stall_s=stall, interval_s=tau, overhead=overhead, restart_s=restart)
