"""Launching the test training job (tests/ckpt_worker.py) as real processes: one per rank,
gloo, optional "nodes" each with their own hot directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from torch.distributed import TCPStore

WORKER = Path(__file__).with_name("ckpt_worker.py")
SRC = Path(__file__).resolve().parents[1] / "src"


def base_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINREADY_FAULT", "RANK", "WORLD_SIZE"))}
    env["PYTHONPATH"] = str(SRC) + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra or {})
    return env


def run_job(args: list[str], *, nodes: int = 1, per_node: int = 1, env: dict[str, str] | None = None,
            rank_env: dict[int, dict[str, str]] | None = None, timeout: float = 120, grace: float = 0.5) -> list[int]:
    """Run the worker on nodes x per_node ranks; returns every rank's exit code."""
    world = nodes * per_node
    # Like torchrun's agent, this process hosts the ranks' store on a port it binds and keeps: a free port
    # handed to rank 0 to bind later can be taken by a parallel test in between (EADDRINUSE).
    store = TCPStore("127.0.0.1", 0, world_size=world, is_master=True, wait_for_workers=False) if world > 1 else None
    procs = []
    for rank in range(world):
        extra = dict(env or {})
        if store is not None:
            extra.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank % per_node),
                         LOCAL_WORLD_SIZE=str(per_node), GROUP_RANK=str(rank // per_node),
                         MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store.port), TORCHELASTIC_USE_AGENT_STORE="True")
        extra.update((rank_env or {}).get(rank, {}))
        procs.append(subprocess.Popen([sys.executable, str(WORKER), *args], env=base_env(extra),
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    # Like torchrun: once one rank dies, the others (blocked in collectives) are killed too.
    deadline = time.monotonic() + timeout
    while any(p.poll() is None for p in procs):
        if any(p.poll() not in (None, 0) for p in procs) or time.monotonic() > deadline:
            stop = time.monotonic() + grace  # the others may still be exiting on their own
            while any(p.poll() is None for p in procs) and time.monotonic() < stop:
                time.sleep(0.05)
            for other in procs:
                if other.poll() is None:
                    other.kill()
            if time.monotonic() > deadline:
                raise TimeoutError(f"worker ranks still running after {timeout}s")
        time.sleep(0.05)
    codes = []
    for proc in procs:
        codes.append(proc.returncode)
        output = proc.stdout.read()
        if proc.returncode not in (0, -9):
            print(output)
    return codes


def result(path: Path) -> dict:
    return json.loads(path.read_text())
