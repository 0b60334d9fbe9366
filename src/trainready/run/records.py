"""The documented shapes of what `trainready run` writes: telemetry.jsonl records, run.json,
stop.json and the `--json` result. docs/schemas/ holds their JSON Schemas; tests validate real
files against these models, so a field added in code and not here fails the suite.

The same models are the one decoder of what is read back (record_decoder.py): their types and bounds are checked
on every record read, and three class variables say what a bad value costs. READ_CORE: fields without which the
record means nothing (it is left out, counted); any other field with a bad value becomes unknown (None, or its
READ_FALLBACK), counted. READ_NEEDED: core fields that must be present (the others may be absent: an older writer
wrote fewer)."""

from __future__ import annotations

import math
from typing import Annotated, Any, ClassVar, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, RootModel

Number = float | int
MAX_S = 1e6
"""A duration above 11.6 days in one record is not a measurement."""
MAX_UNIX = 1e11  # year 5138
MAX_STEP = 10**12
MAX_WORLD = 10**6
MAX_COUNT = 1e18
"""Tokens, tokens/s, MFU, dollars: past this a figure is not one."""
MAX_USD = 1e12


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
    READ_CORE: ClassVar[frozenset[str]] = frozenset({"t"})
    READ_NEEDED: ClassVar[frozenset[str]] = frozenset({"t"})
    READ_FALLBACK: ClassVar[dict[str, Any]] = {}
    schema_version: Literal[1]
    t: float = Field(ge=0, le=MAX_UNIX, description="unix time, seconds")
    source: str = Field(description="rank0 or launcher")
    nonfinite: list[str] | None = Field(None, description="fields that were NaN/inf, written as null")


class Worker(BaseModel):
    rank: int
    pid: int
    host: str


class LaunchRecord(_Record):
    type: Literal["launch"]
    argv: list[str] = Field(description="the torchrun command line")
    node_rank: int = Field(ge=0, le=MAX_WORLD)
    prior_billed_s: float = Field(ge=0, le=MAX_UNIX, description="seconds billed by earlier launches of this run")


class StartRecord(_Record):
    READ_CORE = frozenset({"t"})  # a bad world size or price is unknown; the record's other fields still count
    READ_FALLBACK = {"restart_count": 0}
    type: Literal["start"]
    world_size: int = Field(ge=1, le=MAX_WORLD)
    restart_count: int = Field(ge=0, le=MAX_STEP, description="torchrun's TORCHELASTIC_RESTART_COUNT: 0 on first start")
    backend: str | None
    device: str
    gpu: str | None
    peak_tflops: float | None = Field(gt=0, le=MAX_COUNT)
    flops_per_token: float | None = Field(gt=0, le=MAX_COUNT)
    hot: str
    archive: str | None
    ckpt_every: int | str | None
    total_steps: int | None = Field(ge=0, le=MAX_STEP)
    budget_usd: float | None = Field(ge=0, le=MAX_USD)
    usd_per_hour: float | None = Field(ge=0, le=1e7)
    nnodes: int = Field(ge=1, le=MAX_WORLD)
    workers: list[Worker]
    run_id: str
    generation: int
    timing: Literal["host", "cuda-events"] | None = Field(None, description="how step splits are timed (None: "
                                                                            "written before it was recorded: host)")


class RestoreRecord(_Record):
    READ_CORE = frozenset({"t", "step"})
    type: Literal["restore"]
    step: int | None = Field(ge=0, le=MAX_STEP, description="the checkpoint restored (last completed step), None: "
                                                             "fresh start")
    tier: str | None
    skipped: list[str] = Field(description="newer checkpoints passed over, each with why")
    duration_s: float | None = Field(None, ge=0, le=MAX_S, description="seconds the restore took (finding, loading, "
                                                                      "verifying)")


class CkptStatus(BaseModel):
    model_config = ConfigDict(extra="forbid")
    last_saved: int | None = Field(ge=0, le=MAX_STEP)
    saving: bool
    uploading: str | None
    archived: int | None = Field(ge=0, le=MAX_STEP)
    dropped_unarchived: int = Field(0, ge=0, description="hot checkpoints deleted before they reached the archive, "
                                                         "so far")


class StepMetrics(BaseModel):
    """What the script passed to t.log() on rank 0 (any names), and which of them were NaN or infinite."""

    model_config = ConfigDict(extra="allow")
    nonfinite: list[str] | None = Field(None, description="names whose value was NaN or infinite, written as null")


Seconds = Annotated[float, Field(ge=0, le=MAX_S)]


class StepRecord(_Record):
    READ_CORE = frozenset({"t", "step", "interval_s"})
    READ_NEEDED = READ_CORE
    READ_FALLBACK = {"metrics": {}, "ckpt": {}, "unmeasured": [], "timing": "unknown"}
    type: Literal["step"]
    step: int = Field(ge=0, le=MAX_STEP)
    step_s: float | None = Field(ge=0, le=MAX_S, description="rank 0's host time inside `with sess.step()` (None: no "
                                                             "step block)")
    interval_s: float = Field(ge=0, le=MAX_S, description="rank 0's wall time since the previous step ended "
                                                          "(includes saves)")
    timing: Literal["host", "cuda-events"] = Field("host", description="source of the split below: host clocks, or "
                                                                       "CUDA events on the streams doing the work")
    split_step: int | None = Field(None, ge=0, le=MAX_STEP, description="the step the split (data_s .. unattributed_s, straggler_s, "
                                                     "rank_*) describes: this step with host clocks, the previous "
                                                     "one with CUDA events (read a step later); None: no split yet")
    data_s: float | None = Field(ge=0, le=MAX_S, description="data wait, mean over ranks; None: not measured (no "
                                                             "t.data())")
    data_s_max: float | None = Field(ge=0, le=MAX_S)
    comm_s: float | None = Field(ge=0, le=MAX_S, description="exposed communication, mean over ranks; None: not measured (several "
                                             "ranks and neither a watched DDP model nor t.comm())")
    optimizer_s: float | None = Field(ge=0, le=MAX_S, description="optimizer step, mean over ranks; None: not "
                                                                  "measured (no t.optimizer())")
    compute_s: float | None = Field(ge=0, le=MAX_S, description="the rest of the step; None when a part is unmeasured (then see "
                                                "unattributed_s)")
    unattributed_s: float | None = Field(None, ge=0, le=MAX_S, description="compute plus the unmeasured parts, when some part is "
                                                           "unmeasured: never folded into compute")
    unmeasured: list[str] = Field([], description="parts of the split not measured (data, comm, optimizer)")
    straggler_s: float | None = Field(None, ge=0, le=MAX_S, description="the slowest rank's work (step minus exposed comm) minus the "
                                                        "typical rank's (median_low): time every rank waited for it; "
                                                        "None when comm is unmeasured")
    rank_step_s: list[Seconds | None] | None = Field(None, description="each rank's step time (index = rank), in "
                                                                     "every k-th split (k = ceil(world size / 64))")
    rank_comm_s: list[Seconds | None] | None = Field(None, description="each rank's exposed communication, same steps")
    tokens: float = Field(ge=0, le=MAX_COUNT, description="tokens of this step, summed over ranks")
    tokens_per_s: float | None = Field(ge=0, le=MAX_COUNT)
    mfu: float | None = Field(ge=0, le=MAX_COUNT, description="model FLOPs utilization, 0-1; None without a FLOP model or GPU peak")
    slowest_rank: int = Field(ge=0, le=MAX_WORLD, description="the rank with the most work (step minus exposed comm; step time when "
                                          "comm is unmeasured)")
    cost_usd: float | None = Field(ge=0, le=MAX_USD)
    projected_usd: float | None = Field(ge=0, le=MAX_USD)
    eta_s: float | None = Field(ge=0, le=MAX_UNIX, description="remaining steps x pace (long runs: months)")
    ckpt: CkptStatus
    metrics: StepMetrics = Field(description="what the script passed to t.log() on rank 0")


class CkptRecord(_Record):
    READ_CORE = frozenset({"t", "step", "stall_s"})
    READ_NEEDED = READ_CORE
    type: Literal["ckpt"]
    step: int = Field(ge=0, le=MAX_STEP)
    stall_s: float = Field(ge=0, le=MAX_S, description="time training was blocked by the save")
    async_save: bool
    hot: str


class IntervalRecord(_Record):
    READ_CORE = frozenset({"t", "message"})
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
    READ_CORE = frozenset({"t", "message"})
    type: Literal["budget"]
    message: str
    spent_usd: float | None = Field(ge=0, le=MAX_USD)
    projected_usd: float | None = Field(ge=0, le=MAX_USD)


class StopInfo(BaseModel):
    """stop.json in the run directory, and the `stop` record."""

    model_config = ConfigDict(extra="forbid")
    schema_version: Literal[1] = 1
    reason: Literal["signal", "budget", "max_steps"]
    step: int = Field(ge=-1, le=MAX_STEP)
    checkpoint: int | None = Field(ge=-1, le=MAX_STEP)
    message: str
    exit_code: int = Field(ge=0, le=255)
    upload_error: str | None
    cost_usd: float | None = Field(ge=0, le=MAX_USD)


class StopRecord(StopInfo):
    READ_CORE: ClassVar[frozenset[str]] = frozenset({"t", "message"})
    READ_NEEDED: ClassVar[frozenset[str]] = frozenset({"t"})
    READ_FALLBACK: ClassVar[dict[str, Any]] = {}
    type: Literal["stop"]
    t: float = Field(ge=0, le=MAX_UNIX)
    source: str
    nonfinite: list[str] | None = None


class EndRecord(_Record):
    READ_CORE = frozenset({"t"})
    type: Literal["end"]
    last_step: int = Field(ge=-1, le=MAX_STEP)
    steps_this_launch: int = Field(ge=0, le=MAX_STEP)
    last_saved: int | None = Field(ge=-1, le=MAX_STEP, description="newest committed checkpoint, after the last save "
                                                                    "finished")
    archived: int | None = Field(None, ge=-1, le=MAX_STEP, description="newest checkpoint in the archive, after the last upload "
                                                   "finished (None: no archive, or none archived)")


class ExitRecord(_Record):
    READ_CORE = frozenset({"t", "message"})
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
    READ_CORE: ClassVar[frozenset[str]] = frozenset({"start_unix", "end_unix"})
    READ_NEEDED: ClassVar[frozenset[str]] = frozenset({"start_unix"})
    READ_FALLBACK: ClassVar[dict[str, Any]] = {}
    start_unix: float = Field(ge=0, le=MAX_UNIX)
    end_unix: float | None = Field(ge=0, le=MAX_UNIX)
    exit_code: int | None
    reason: str | None
    message: str | None = None
    pid: int | None = Field(ge=1, description="the launcher's pid; None in a launch rebuilt from telemetry")
    pid_start_ticks: int | None = Field(None, ge=0)
    node_rank: int = Field(ge=0, le=MAX_WORLD)
    prior_billed_s: float = Field(ge=0, le=MAX_UNIX)
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
