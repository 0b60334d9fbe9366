"""How long does `plan` take to search the whole catalog for one model? (target: < 2 s on one core)

Runs the search in-process (no CLI start-up) for several models and methods, a few times
each, and prints the best and median wall time with the number of configurations searched.
Pin it to one core to compare with the target: `taskset -c 0 python bench/plan_speed.py`.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from trainready.catalog import load_catalog  # noqa: E402
from trainready.plan.job import JobSpec  # noqa: E402
from trainready.plan.search import PlanRequest, plan  # noqa: E402

CASES = [("llama-2-13b", "full"), ("llama-2-70b", "full"), ("llama-3-8b", "qlora"), ("llama-3.1-405b", "full"),
         ("mistral-7b", "lora"), ("mixtral-8x7b", "full"), ("deepseek-v3", "full")]  # MoE: the search adds EP degrees


def main() -> None:
    catalog = load_catalog()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"plan over the whole catalog ({len(catalog.instances)} instance types), {cores} core(s) available")
    worst = 0.0
    for model, method in CASES:
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            result = plan(PlanRequest(job=JobSpec(model=model, method=method, tokens=2e9)), catalog)
            times.append(time.perf_counter() - t0)
        worst = max(worst, statistics.median(times))
        print(f"  {model:15s} {method:6s} best {min(times):5.2f} s  median {statistics.median(times):5.2f} s  "
              f"({result.searched:,} configurations, {len(result.rows)} rows)")
    print(f"slowest median: {worst:.2f} s (target < 2 s on one core)")


if __name__ == "__main__":
    main()
