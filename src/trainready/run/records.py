"""The documented shapes of what `trainready run` writes: telemetry.jsonl records, run.json,
stop.json and the `--json` result. docs/schemas/ holds their JSON Schemas; tests validate real
files against these models, so a field added in code and not here fails the suite."""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, RootModel

Number = float | int


def finite(value: object) -> float | None:
    """A number field of a record read back from a file, as a float; None (unknown) when it is not a
    number (a bool, a string), not finite (a NaN literal) or an integer past a float's range (10**400)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    try:
        return float(value) if math.isfinite(value) else None
    except OverflowError:
        return None


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid")
    schema_version: Literal[1]
    t: float = Field(description="unix time, seconds")
    source: str = Field(description="rank0 or launcher")
    nonfinite: list[str] | None = Field(None, description="fields that were NaN/inf, written as null")


class Worker(BaseModel):
    rank: int
    pid: int
    host: str


class LaunchRecord(_Record):
    type: Literal["launch"]
    argv: list[str] = Field(description="the torchrun command line")
    node_rank: int
    prior_billed_s: float = Field(description="seconds billed by earlier launches of this run")


class StartRecord(_Record):
    type: Literal["start"]
    world_size: int
    restart_count: int = Field(description="torchrun's TORCHELASTIC_RESTART_COUNT: 0 on first start")
    backend: str | None
    device: str
    gpu: str | None
    peak_tflops: float | None
    flops_per_token: float | None
    hot: str
    archive: str | None
    ckpt_every: int | str | None
    total_steps: int | None
    budget_usd: float | None
    usd_per_hour: float | None
    nnodes: int
    workers: list[Worker]
    run_id: str
    generation: int
    timing: Literal["host", "cuda-events"] | None = Field(None, description="how step splits are timed (None: "
                                                                            "written before it was recorded: host)")


class RestoreRecord(_Record):
    type: Literal["restore"]
    step: int | None = Field(description="the checkpoint restored (last completed step), None: fresh start")
    tier: str | None
    skipped: list[str] = Field(description="newer checkpoints passed over, each with why")
    duration_s: float | None = Field(None, description="seconds the restore took (finding, loading, verifying)")


class CkptStatus(BaseModel):
    model_config = ConfigDict(extra="forbid")
    last_saved: int | None
    saving: bool
    uploading: str | None
    archived: int | None
    dropped_unarchived: int = Field(0, description="hot checkpoints deleted before they reached the archive, so far")


class StepRecord(_Record):
    type: Literal["step"]
    step: int
    step_s: float | None = Field(description="rank 0's host time inside `with sess.step()` (None: no step block)")
    interval_s: float = Field(description="rank 0's wall time since the previous step ended (includes saves)")
    timing: Literal["host", "cuda-events"] = Field("host", description="source of the split below: host clocks, or "
                                                                       "CUDA events on the streams doing the work")
    split_step: int | None = Field(None, description="the step the split (data_s .. unattributed_s, straggler_s, "
                                                     "rank_*) describes: this step with host clocks, the previous "
                                                     "one with CUDA events (read a step later); None: no split yet")
    data_s: float | None = Field(description="data wait, mean over ranks; None: not measured (no t.data())")
    data_s_max: float | None
    comm_s: float | None = Field(description="exposed communication, mean over ranks; None: not measured (several "
                                             "ranks and neither a watched DDP model nor t.comm())")
    optimizer_s: float | None = Field(description="optimizer step, mean over ranks; None: not measured (no t.optimizer())")
    compute_s: float | None = Field(description="the rest of the step; None when a part is unmeasured (then see "
                                                "unattributed_s)")
    unattributed_s: float | None = Field(None, description="compute plus the unmeasured parts, when some part is "
                                                           "unmeasured: never folded into compute")
    unmeasured: list[str] = Field([], description="parts of the split not measured (data, comm, optimizer)")
    straggler_s: float | None = Field(None, description="the slowest rank's work (step minus exposed comm) minus the "
                                                        "typical rank's (median_low): time every rank waited for it; "
                                                        "None when comm is unmeasured")
    rank_step_s: list[float | None] | None = Field(None, description="each rank's step time (index = rank), in "
                                                                     "every k-th split (k = ceil(world size / 64))")
    rank_comm_s: list[float | None] | None = Field(None, description="each rank's exposed communication, same steps")
    tokens: float = Field(description="tokens of this step, summed over ranks")
    tokens_per_s: float | None
    mfu: float | None = Field(description="model FLOPs utilization, 0-1; None without a FLOP model or GPU peak")
    slowest_rank: int = Field(description="the rank with the most work (step minus exposed comm; step time when "
                                          "comm is unmeasured)")
    cost_usd: float | None
    projected_usd: float | None
    eta_s: float | None
    ckpt: CkptStatus
    metrics: dict[str, Any] = Field(description="what the script passed to t.log() on rank 0")


class CkptRecord(_Record):
    type: Literal["ckpt"]
    step: int
    stall_s: float = Field(description="time training was blocked by the save")
    async_save: bool
    hot: str


class IntervalRecord(_Record):
    type: Literal["ckpt_interval"]
    every_steps: int
    tau_s: float
    stall_s: float
    step_s: float
    mtbf_h: float
    assumption: str
    message: str


class CkptDroppedRecord(_Record):
    type: Literal["ckpt_dropped"]
    message: str
    names: list[str] = Field(description="the checkpoints dropped from the hot tier without an archived copy")


class BudgetRecord(_Record):
    type: Literal["budget"]
    message: str
    spent_usd: float | None
    projected_usd: float | None


class StopInfo(BaseModel):
    """stop.json in the run directory, and the `stop` record."""

    model_config = ConfigDict(extra="forbid")
    schema_version: Literal[1] = 1
    reason: Literal["signal", "budget", "max_steps"]
    step: int
    checkpoint: int | None
    message: str
    exit_code: int
    upload_error: str | None
    cost_usd: float | None


class StopRecord(StopInfo):
    type: Literal["stop"]
    t: float
    source: str
    nonfinite: list[str] | None = None


class EndRecord(_Record):
    type: Literal["end"]
    last_step: int
    steps_this_launch: int
    last_saved: int | None = Field(description="newest committed checkpoint, after the last save finished")
    archived: int | None = Field(None, description="newest checkpoint in the archive, after the last upload "
                                                   "finished (None: no archive, or none archived)")


class ExitRecord(_Record):
    type: Literal["exit"]
    exit_code: int
    reason: str
    message: str


TelemetryRecord = Annotated[Union[LaunchRecord, StartRecord, RestoreRecord, StepRecord, CkptRecord, IntervalRecord,
                                  BudgetRecord, CkptDroppedRecord, StopRecord, EndRecord, ExitRecord],
                           Field(discriminator="type")]


class TelemetryLine(RootModel[TelemetryRecord]):
    """One line of telemetry.jsonl."""


class Launch(BaseModel):
    model_config = ConfigDict(extra="forbid")
    start_unix: float
    end_unix: float | None
    exit_code: int | None
    reason: str | None
    message: str | None = None
    pid: int | None = Field(description="the launcher's pid; None in a launch rebuilt from telemetry")
    pid_start_ticks: int | None = None
    node_rank: int
    prior_billed_s: float
    recovered_from: str | None = Field(None, description="'telemetry.jsonl' when run.json was unreadable and this "
                                                         "launch was rebuilt from its launch and exit records")
    host: str | None = Field(None, description="the launcher's host name: its pid means something only there")
    pid_ns: str | None = Field(None, description="the launcher's pid namespace (/proc/self/ns/pid)")
    boot_id: str | None = Field(None, description="the machine's boot id when the launch began: a launch that "
                                                  "vanished across a reboot was not killed")
    oom_kill: dict[str, Any] | None = Field(None, description="{file, count}: the OOM killer's kills in the "
                                                              "launcher's memory cgroup when the launch began")


class RunInfo(BaseModel):
    """run.json: what was run, where, and each launch's start, end and outcome."""

    model_config = ConfigDict(extra="forbid")
    schema_version: Literal[1]
    kind: Literal["trainready-run"]
    command: list[str]
    config: dict[str, Any] = Field(description="the launcher options as given (price source, checkpoint tiers, ...)")
    environment: dict[str, Any] = Field(description="versions, host, platform, cwd, git commit of the script")
    created_unix: float
    launches: list[Launch]


class RunOutcome(BaseModel):
    """`trainready run --json`."""

    schema_version: int = 1
    kind: Literal["trainready-run-result"] = "trainready-run-result"
    exit_code: int
    reason: str = Field(description="finished | failed | budget | signal | max_steps")
    message: str
    run_dir: str
    failed_ranks: list[dict[str, Any]]
    log_tail: dict[str, list[str]] = Field(description="last lines of the failing ranks' logs, by file")
    log_files: list[str]
    diagnoses: list[dict[str, Any]] = Field(description="`trainready diagnose` findings for the failing logs")
    summary: dict[str, Any] = Field(description="the run summary (run-summary schema)")
