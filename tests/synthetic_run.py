"""A synthetic run directory, written the way `trainready run` writes one (run.json and
telemetry.jsonl records of the documented shapes), for the HTML report's tests and its benchmark
(bench/report_html.py). Marked synthetic in run.json's environment; the numbers are made up:
a loss that decays, a step split into data/compute/comm/optimizer, one slow rank, a checkpoint
every `ckpt_every` steps, and a crash in the first launch that loses the steps after its last
checkpoint (the second launch restores it and finishes)."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path


def make_run_dir(path: Path, *, steps: int = 200, ranks: int = 8, ckpt_every: int = 50, usd_per_hour: float | None = 98.32,
                 command: list[str] | None = None, crash_message: str = "worker 3 exited with signal 9",
                 prediction: dict | None = None, seed: int = 0) -> Path:
    rng = random.Random(seed)
    path.mkdir(parents=True, exist_ok=True)
    command = command or ["python", "train.py", "--lr", "3e-4"]
    t = 1_767_225_600.0  # 2026-01-01 00:00 UTC
    step_s = 1.2
    crash_at = steps * 6 // 10 + ckpt_every // 2  # the first launch dies here, half an interval after a save ...
    restored = (crash_at // ckpt_every) * ckpt_every - 1  # ... and the second resumes from the newest checkpoint
    lines: list[dict] = []
    launches = []

    def rec(type_: str, source: str = "rank0", **fields) -> None:
        lines.append({"schema_version": 1, "type": type_, "t": round(t, 3), "source": source, **fields})

    for launch, (first, last) in enumerate(((0, crash_at), (restored + 1, steps - 1))):
        start = t
        rec("launch", "launcher", argv=["torchrun", "--nproc-per-node", str(ranks)], node_rank=0,
            prior_billed_s=sum(x["end_unix"] - x["start_unix"] for x in launches))
        t += 25.0  # start-up: torch import, rendezvous, model build
        rec("start", world_size=ranks, restart_count=0, backend="nccl", device="cuda", gpu="NVIDIA H100 80GB HBM3",
            peak_tflops=989.0, flops_per_token=6 * 7e9, hot=str(path / "checkpoints"), archive=None, ckpt_every=ckpt_every,
            total_steps=steps, budget_usd=None, usd_per_hour=usd_per_hour, nnodes=1,
            workers=[{"rank": r, "pid": 1000 + r, "host": "node0"} for r in range(ranks)],
            run_id=f"run{launch}", generation=launch, timing="host")
        t += 4.0 if launch else 0.0
        rec("restore", step=restored if launch else None, tier="hot" if launch else None, skipped=[],
            duration_s=4.0 if launch else 0.0)
        for step in range(first, last + 1):
            data = 0.02 + 0.01 * rng.random()
            comm = 0.10 + 0.03 * rng.random()
            opt = 0.05
            compute = step_s - data - comm - opt + 0.02 * rng.random()
            rank_s = [step_s + 0.02 * rng.random() + (0.15 if r == 5 else 0.0) for r in range(ranks)]
            rank_comm = [comm + (max(rank_s) - x) for x in rank_s]  # the others wait for the slow rank in comm
            work = sorted(x - c for x, c in zip(rank_s, rank_comm, strict=True))
            interval = max(rank_s) + 0.01
            stall = 0.0
            t += interval
            tokens = 4096 * 4 * ranks
            tps = tokens / interval
            loss = 2.0 + 8.0 * math.exp(-step / (steps / 5)) + 0.08 * rng.random()
            rec("step", step=step, step_s=max(rank_s), interval_s=round(interval, 4), timing="host", split_step=step,
                data_s=round(data, 4),
                data_s_max=round(data * 1.3, 4), comm_s=round(comm, 4), optimizer_s=opt, compute_s=round(compute, 4),
                unattributed_s=None, unmeasured=[], straggler_s=round(work[-1] - work[(len(work) - 1) // 2], 4),
                rank_step_s=[round(x, 4) for x in rank_s], rank_comm_s=[round(x, 4) for x in rank_comm],
                tokens=tokens, tokens_per_s=round(tps, 1), mfu=round(tps * 6 * 7e9 / (ranks * 989e12), 4),
                slowest_rank=5, cost_usd=None if usd_per_hour is None else round((t - start) / 3600 * usd_per_hour, 4),
                projected_usd=None, eta_s=(steps - step) * interval,
                ckpt={"last_saved": (step // ckpt_every) * ckpt_every - 1 if step >= ckpt_every else None,
                      "saving": False, "uploading": None, "archived": None, "dropped_unarchived": 0},
                metrics={"loss": round(loss, 4), "lr": 3e-4})
            if (step + 1) % ckpt_every == 0:
                stall = 0.3 + 0.2 * rng.random()
                t += stall
                rec("ckpt", step=step, stall_s=round(stall, 3), async_save=True, hot=str(path / "checkpoints"))
        if launch == 0:
            t += 2.0
            rec("exit", "launcher", exit_code=1, reason="failed", message=crash_message)
            launches.append({"start_unix": start, "end_unix": t, "exit_code": 1, "reason": "failed",
                             "message": crash_message, "pid": 4242, "pid_start_ticks": 1, "node_rank": 0,
                             "prior_billed_s": 0.0})
            t += 300.0  # idle until someone noticed and relaunched
        else:
            t += 3.0
            rec("end", last_step=last, steps_this_launch=last - first + 1, last_saved=last, archived=None)
            t += 5.0
            rec("exit", "launcher", exit_code=0, reason="finished", message="training finished")
            launches.append({"start_unix": start, "end_unix": t, "exit_code": 0, "reason": "finished",
                             "message": "training finished", "pid": 4243, "pid_start_ticks": 1, "node_rank": 0,
                             "prior_billed_s": launches[0]["end_unix"] - launches[0]["start_unix"]})
    config = {"nproc_per_node": ranks, "nnodes": 1, "usd_per_hour": usd_per_hour, "price_source": "synthetic"}
    if prediction is not None:
        config["prediction"] = prediction
    info = {"schema_version": 1, "kind": "trainready-run", "command": command, "config": config,
            "environment": {"synthetic": "tests/synthetic_run.py: made-up numbers"}, "created_unix": launches[0]["start_unix"],
            "launches": launches}
    (path / "run.json").write_text(json.dumps(info))
    with open(path / "telemetry.jsonl", "w") as f:
        for line in lines:
            f.write(json.dumps(line, separators=(",", ":")) + "\n")
    return path
