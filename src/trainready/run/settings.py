"""What a training process needs to know from its launcher, as environment variables.

`trainready run` writes these into every worker's environment; `trainready.init()` reads
them, and its keyword arguments override them. Without any (plain `python train.py`) the
defaults give one process, checkpoints in ./checkpoints and no telemetry file.
The variables are documented in docs/run.md; `TRAINREADY_` + the field name in capitals.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from trainready.errors import UsageError
from trainready.limits import MAX_USD_PER_HOUR

PREFIX = "TRAINREADY_"
CkptEvery = int | Literal["auto"]


class RunSettings(BaseModel):
    """Settings of one training run, shared by the launcher and every worker."""

    model_config = ConfigDict(extra="forbid")

    run_dir: Path | None = Field(None, description="run directory: telemetry.jsonl, run.json, logs, summary.json")
    hot: str | None = Field(None, description="hot checkpoint tier (local NVMe); default RUN_DIR/checkpoints or ./checkpoints")
    archive: str | None = Field(None, description="archive tier URL (shared path, s3://bucket/prefix)")
    ckpt_every: CkptEvery | None = Field(None, description="checkpoint every N steps, or 'auto' (Young/Daly); None or 'off': only at the end and when stopping")
    keep_hot: int = Field(2, ge=1, le=1000, description="checkpoints kept on the hot tier")
    async_save: bool = Field(True, description="stage checkpoints in host memory and write in the background")
    total_steps: int | None = Field(None, gt=0, description="steps the run will take: ETA, projected cost, final save")
    max_steps: int | None = Field(None, gt=0, description="stop after this many steps in this launch, without a checkpoint (scaling probes)")
    budget_usd: float | None = Field(None, gt=0, le=1e9, description="stop with a final checkpoint before spending more")
    usd_per_hour: float | None = Field(None, gt=0, le=MAX_USD_PER_HOUR, description="price of one node-hour")
    nnodes: int = Field(1, ge=1, description="nodes the run is billed for")
    instance: str | None = Field(None, description="instance type (catalog name)")
    spot: bool = Field(False, description="spot capacity: shorter MTBF for --ckpt-every auto")
    mtbf_h: float | None = Field(None, gt=0, le=1e6, description="the job's mean time between failures, hours (default from the catalog assumptions)")
    flops_per_token: float | None = Field(None, gt=0, description="model FLOPs per token (MFU numerator)")
    peak_tflops: float | None = Field(None, gt=0, description="dense peak of one GPU/process in TFLOP/s (default: detected GPU, bf16)")
    prior_s: float = Field(0.0, ge=0, description="seconds billed by earlier launches of this run (budget spans restarts)")
    launch_unix: float | None = Field(None, description="when this launch started (unix time); default: process start")
    launcher_pid: int | None = Field(None, description="pid of `trainready run`: workers exit when it is gone")
    launcher_start_ticks: int | None = Field(None, description="its start time (/proc/PID/stat), so a reused pid is not mistaken for it")
    grace_s: float = Field(100.0, ge=1, le=86400, description="time from a stop signal to exit: final save and upload")
    timing: Literal["auto", "host", "cuda-events"] = Field("auto", description="how the step split is timed: 'auto' = CUDA events on a GPU (read a step later, no synchronize), host clocks elsewhere; 'host' forces host clocks (a GPU step then ends with a synchronize)")
    exit_s: float | None = Field(None, ge=0, description="seconds from the workers' stop to the launcher's end: the slowest measured in earlier launches x 1.5 (the budget keeps them in reserve; default EXIT_S_DEFAULT)")

    @field_validator("ckpt_every", mode="before")
    @classmethod
    def _ckpt_every(cls, value: object) -> object:
        if isinstance(value, str) and value.strip().lower() == "auto":
            return "auto"
        if isinstance(value, str) and value.strip().lower() == "off":
            return None
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            value = int(value)
        if isinstance(value, int) and value < 1:
            raise ValueError("must be >= 1 step, or 'auto'")
        return value

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: object) -> RunSettings:
        env = os.environ if environ is None else environ
        raw: dict[str, object] = {}
        for name in cls.model_fields:
            value = env.get(PREFIX + name.upper())
            if value not in (None, ""):
                raw[name] = value
        raw.update({k: v for k, v in overrides.items() if v is not None})
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            raise UsageError("; ".join(_describe(e, k in overrides) for e in exc.errors()
                                       for k in [str(e["loc"][0]) if e["loc"] else ""])) from None

    def to_env(self) -> dict[str, str]:
        out = {}
        for name, value in self.model_dump(exclude_none=True).items():
            if isinstance(value, bool):
                value = "1" if value else "0"
            out[PREFIX + name.upper()] = str(value)
        return out

    @property
    def hot_dir(self) -> str:
        if self.hot:
            return self.hot
        return str(self.run_dir / "checkpoints") if self.run_dir else "checkpoints"


def _describe(err: dict, from_argument: bool) -> str:
    name = str(err["loc"][0]) if err["loc"] else "?"
    where = f"init({name}=...)" if from_argument else PREFIX + name.upper()
    return f"{where}={err.get('input')!r}: {err['msg']}"


NODE_DIR_PREFIX = "node"
STOP_FILE = "stop.json"  # what the workers write when they stop on purpose; the launcher reads it


def node_run_dir(run_dir: Path, nnodes: int, node_rank: int) -> Path:
    """Where this node's launcher keeps run.json, telemetry, logs and (by default) the hot tier.

    A multi-node job gets RUN_DIR/node<R>: on a filesystem the nodes share (a Slurm cluster's home
    directory) every launcher would otherwise claim the same directory, and the second would be
    refused by the first one's lock; on separate disks it changes nothing but the path."""
    return run_dir / f"{NODE_DIR_PREFIX}{node_rank}" if nnodes > 1 else run_dir


def node_run_dirs(run_dir: Path) -> list[Path]:
    """The node<R>/ directories under a multi-node run's --run-dir, by node rank."""
    found = [(int(p.name[len(NODE_DIR_PREFIX):]), p) for p in run_dir.glob(NODE_DIR_PREFIX + "*")
             if p.name[len(NODE_DIR_PREFIX):].isdigit()]
    return [p for _, p in sorted(found)]
