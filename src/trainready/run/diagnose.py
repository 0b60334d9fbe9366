"""`trainready diagnose`: explain known failures in NCCL, torch, torchrun and training logs.

`diagnose_files` reads log files (a directory: its *.log, *.txt and *.jsonl files, recursively, as
torchrun's --log-dir writes them; `-`: standard input; a pipe or FIFO, e.g. bash's `<(cmd)`: read
until its writer closes it) and returns a `DiagnosisReport`; `diagnose_text` does the same for a
string. The rules themselves live in `log_rules`. Reading never fails on odd bytes (invalid UTF-8
is replaced, very long lines are cut) and holds one line at a time, so a stream of any length
reads in bounded memory; an empty, missing or unreadable path, a device or socket, or a FIFO no
writer opens within FIFO_WAIT_S seconds is a `UsageError`.
"""

from __future__ import annotations

import errno
import io
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

from trainready.errors import TrainreadyError, UsageError, printable
from trainready.io import redact

from .log_rules import Detail, Finding, Line, run_rules

if TYPE_CHECKING:
    from trainready.plan.job import JobSpec

DIAGNOSE_SCHEMA_VERSION = 1
LOG_SUFFIXES = (".log", ".txt", ".jsonl")
MAX_EVIDENCE = 5
MAX_LINE_BYTES = 64 * 1024  # a longer "line" is binary or a dump: only its start is matched
EVIDENCE_CHARS = 500
STDIN = "-"  # as a LOGFILE: standard input, read until end of input
STDIN_NAME = "<stdin>"  # how evidence and the report name it
FIFO_WAIT_S = 10.0  # how long a named FIFO may go without a writer before it is an error (never a hang)


class Evidence(BaseModel):
    model_config = ConfigDict(extra="forbid")

    file: str
    line: int = Field(description="1-based line number in that file")
    text: str = Field(description="the line, stripped, at most 500 characters")


class Diagnosis(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str = Field(description="stable rule id, e.g. nccl.watchdog-timeout")
    title: str
    severity: Literal["error", "warning"]
    count: int = Field(description="matching lines in all files")
    evidence: list[Evidence] = Field(description=f"the first {MAX_EVIDENCE} matching lines")
    explanation: str = Field(description="what happened and why")
    fixes: list[str]
    details: dict[str, str | int | float | None] = Field(description="values read from the log (rank, GiB, ...)")


class DiagnosisReport(BaseModel):
    model_config = ConfigDict(extra="forbid")

    schema_version: int = DIAGNOSE_SCHEMA_VERSION
    kind: Literal["trainready-diagnose"] = "trainready-diagnose"
    files: list[str] = Field(description="every file read, in reading order")
    diagnoses: list[Diagnosis] = Field(description="errors first, then in order of first evidence")
    summary: str


def diagnose_text(text: str, source: str = "<text>") -> list[Diagnosis]:
    """Diagnose log text already in memory (e.g. a worker's captured output)."""
    lines = (Line(source, n, _clip(raw.rstrip("\r")), (0, n)) for n, raw in enumerate(text.split("\n"), 1))
    return _to_diagnoses(run_rules(lines))


def diagnose_files(paths: list[Path | str], job: JobSpec | None = None) -> DiagnosisReport:
    """Diagnose log files and directories (`-`: standard input); with `job`, an out-of-memory
    diagnosis gets the plan's estimate."""
    files = log_files(paths)
    lines = (line for index, path in enumerate(files) for line in _read_lines(path, index))
    diagnoses = _to_diagnoses(run_rules(lines))
    if job is not None:
        for diagnosis in diagnoses:
            if diagnosis.id == "cuda.oom":
                add_memory_estimate(diagnosis, job)
    names = [_name(f) for f in files]
    return DiagnosisReport(files=names, diagnoses=diagnoses, summary=_summary(diagnoses, files))


def log_files(paths: list[Path | str]) -> list[Path]:
    """The files to read: files, pipes and FIFOs as given (`-`: standard input, as Path("-")),
    directories expanded to their log files (sorted). Devices, sockets and empty paths (never
    taken to mean the current directory) are refused."""
    if not paths:
        raise UsageError("no log file given: pass one or more log files or directories (- reads standard input)")
    files: list[Path] = []
    for raw in paths:
        if os.fspath(raw) == STDIN:
            files.append(Path(STDIN))
            continue
        if not os.fspath(raw).strip():
            raise UsageError(f"log file {os.fspath(raw)!r} is empty: name a log file or directory (an empty path is "
                             "never taken to mean the current directory; write . for that, - for standard input)")
        path = Path(raw)
        try:
            mode = os.stat(path).st_mode
        except FileNotFoundError:
            raise UsageError(f"cannot read log file {printable(path)}: no such file or directory") from None
        except OSError as exc:  # a name too long, a loop of links, a parent that is a file, no permission
            raise UsageError(f"cannot read log file {printable(path)}: {exc.strerror or exc}") from None
        if stat.S_ISDIR(mode):
            try:
                found = sorted(p for p in path.rglob("*") if p.suffix in LOG_SUFFIXES and p.is_file())
            except OSError as exc:
                raise UsageError(f"cannot read log directory {printable(path)}: {exc.strerror or exc}") from None
            if not found:
                raise UsageError(f"{printable(path)}: directory has no {', '.join('*' + s for s in LOG_SUFFIXES)} "
                                 "files to read")
            files += found
        elif stat.S_ISREG(mode) or stat.S_ISFIFO(mode):
            files.append(path)
        else:
            raise UsageError(f"cannot read log file {printable(path)}: not a regular file, pipe or directory "
                             "(a device or socket)")
    return list(dict.fromkeys(files))  # the same file given twice is read once


def _name(path: Path) -> str:
    return STDIN_NAME if str(path) == STDIN else str(path)


def _read_lines(path: Path, index: int) -> Iterator[Line]:
    name = _name(path)
    try:
        with _open_log(path) as fh:
            number, continued = 0, False
            while chunk := fh.readline(MAX_LINE_BYTES):
                if not continued:  # the rest of an over-long line is skipped, keeping line numbers right
                    number += 1
                    text = chunk.decode("utf-8", errors="replace").rstrip("\r\n")
                    yield Line(name, number, text, (index, number))
                continued = not chunk.endswith(b"\n")
    except OSError as exc:
        shown = "standard input" if name == STDIN_NAME else f"log file {printable(path)}"
        raise UsageError(f"cannot read {shown}: {exc.strerror or exc}") from None


class _FdReader(io.RawIOBase):
    """A file descriptor read with os.read, after the bytes a probe already took from it."""

    def __init__(self, fd: int, prefix: bytes = b"", own: bool = True):
        super().__init__()
        self.fd, self.prefix, self.own = fd, prefix, own

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[no-untyped-def]
        if self.prefix:
            data, self.prefix = self.prefix[:len(buffer)], self.prefix[len(buffer):]
        else:
            data = os.read(self.fd, len(buffer))
        buffer[:len(data)] = data
        return len(data)

    def close(self) -> None:
        if not self.closed and self.own:
            os.close(self.fd)
        super().close()


def _open_log(path: Path) -> io.BufferedReader:
    """A log for reading line by line. Opened without blocking (opening a FIFO blocks until a
    writer comes), then checked again by what was opened: a regular file, standard input, or a
    pipe/FIFO read until its writer closes it; a named FIFO no writer opens within FIFO_WAIT_S
    is an error, never a hang."""
    if str(path) == STDIN:
        return io.BufferedReader(_FdReader(os.dup(0)))  # (EBADF: stdin closed)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        prefix = b""
        if stat.S_ISFIFO(mode):
            prefix = _first_bytes(fd, path)
        elif not stat.S_ISREG(mode):
            raise OSError(errno.EINVAL, "not a regular file, pipe or directory (a device or socket)")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return io.BufferedReader(_FdReader(fd, prefix))


def _first_bytes(fd: int, path: Path) -> bytes:
    """The first bytes of a pipe opened without blocking, once a writer is there: read() says
    EAGAIN (a writer, nothing written yet: from then on reads block until data or its close) or
    returns data; b'' means no writer. For an inherited pipe (/dev/stdin, /dev/fd/N: bash's
    <(cmd)) no writer means it is done: an empty log. A named FIFO's writer may not have opened it
    yet: wait for one up to FIFO_WAIT_S."""
    deadline = time.monotonic() + FIFO_WAIT_S
    anonymous = _anonymous_pipe(fd)
    while True:
        try:
            data = os.read(fd, 1 << 16)
        except BlockingIOError:
            return b""
        if data or anonymous:
            return data
        if time.monotonic() >= deadline:
            raise OSError(errno.ETIMEDOUT, f"a FIFO that no writer opened within {FIFO_WAIT_S:g} s (a pipe is read "
                                           "until its writer closes it)")
        time.sleep(0.05)


def _anonymous_pipe(fd: int) -> bool:
    """A pipe with no name (bash's <(cmd), a | into /dev/stdin), not a FIFO in the filesystem (Linux)."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:")
    except OSError:
        return False


def _clip(text: str) -> str:
    return text if len(text) <= MAX_LINE_BYTES else text[:MAX_LINE_BYTES]


def _to_diagnoses(findings: list[Finding]) -> list[Diagnosis]:
    findings = sorted(findings, key=lambda f: (f.severity != "error", min(x.position for x in f.lines)))
    # evidence quotes log lines, and reports get pasted into tickets: secrets redacted (before the cut,
    # so half a token is never shown)
    return [Diagnosis(id=f.id, title=f.title, severity=f.severity, count=f.count,
                      evidence=[Evidence(file=x.file, line=x.number, text=redact(x.text.strip())[:EVIDENCE_CHARS])
                                for x in sorted(f.lines, key=lambda x: x.position)[:MAX_EVIDENCE]],
                      explanation=redact(f.explanation), fixes=f.fixes,
                      details={k: redact(v) if isinstance(v, str) else v for k, v in f.details.items()}) for f in findings]


def _summary(diagnoses: list[Diagnosis], files: list[Path]) -> str:
    read = f"{len(files)} file{'s' if len(files) != 1 else ''}"
    if not diagnoses:
        return f"no known problem found in {read}"
    errors = sum(d.severity == "error" for d in diagnoses)
    warnings = len(diagnoses) - errors
    counts = ", ".join(part for part in (f"{errors} error{'s' * (errors != 1)}" if errors else "",
                                         f"{warnings} warning{'s' * (warnings != 1)}" if warnings else "") if part)
    return f"{len(diagnoses)} problem{'s' * (len(diagnoses) != 1)} in {read}: {counts} ({', '.join(d.id for d in diagnoses)})"


# ------------------------------------------------------------ out of memory, with a job

def _oom_variants(job: JobSpec) -> list[tuple[str, dict[str, object]]]:
    """Cheap changes that lower memory per GPU, each alone and then combined, cheapest first."""
    sharded = job.strategy in ("zero3", "fsdp")
    single: list[tuple[str, dict[str, object]]] = []
    if job.activation_checkpointing != "full":
        single.append(("activation_checkpointing=full", {"activation_checkpointing": "full"}))
    if (job.micro_batch or 1) > 1:
        single.append(("micro_batch=1", {"micro_batch": 1}))
    if not sharded:
        single.append(("strategy=fsdp", {"strategy": "fsdp"}))
    variants = list(single)
    combined: dict[str, object] = {}
    for _, change in single:
        combined.update(change)
        if len(combined) > 1:
            variants.append((_label(combined), dict(combined)))
    if job.offload == "none" and combined.get("strategy", job.strategy) != "ddp":  # offload needs ZeRO / FSDP
        offload = {**combined, "offload": "optimizer"}
        variants.append((_label(offload), offload))
    return variants


def _label(change: dict[str, object]) -> str:
    return " + ".join(f"{key}={value}" for key, value in change.items())


def add_memory_estimate(diagnosis: Diagnosis, job: JobSpec) -> None:
    """Put the plan's memory estimate for `job` next to an OOM, and say which cheap change would fit."""
    from trainready.catalog import load_catalog
    from trainready.plan.estimate import estimate_setup
    from trainready.plan.setup import resolve

    catalog = load_catalog()
    try:
        memory = estimate_setup(resolve(job, catalog)).memory
    except TrainreadyError as exc:
        reason = str(exc)[:240]
        diagnosis.details["estimate_error"] = reason
        diagnosis.explanation += f" The job file could not be estimated, so no plan estimate is shown: {reason.rstrip('.')}."
        return
    peak, capacity = round(memory.per_gpu_gib.peak, 1), round(memory.gpu_gib, 1)
    fitting: list[tuple[str, float]] = []
    for label, change in _oom_variants(job):
        try:
            # judged on whichever framework runs the variant: the job's may not run another strategy or offload
            variant = estimate_setup(resolve(job.model_copy(update={**change, "framework": None}), catalog)).memory
        except TrainreadyError:
            continue  # e.g. a global batch the new micro-batch does not divide
        if variant.fits:
            fitting.append((label, round(variant.per_gpu_gib.peak, 1)))
    details: dict[str, Detail] = {"estimate_peak_gib": peak, "estimate_capacity_gib": capacity,
                                  "estimate_fits": "yes" if memory.fits else "no",
                                  "fits_with": fitting[0][0] if fitting else None}
    diagnosis.details.update(details)
    if memory.fits:
        diagnosis.explanation += (f" The plan estimate for this job is {peak:g} GiB per GPU of {capacity:g} GiB, so "
                                  "the extra memory comes from what the estimate does not model: fragmentation, "
                                  "unusually long batches, evaluation or generation steps, a leak, or another process "
                                  "on the GPU.")
    else:
        diagnosis.explanation += (f" The plan estimate agrees: this job needs about {peak:g} GiB per GPU but the GPU "
                                  f"has {capacity:g} GiB.")
    observed = diagnosis.details.get("total_gib")
    if isinstance(observed, float) and abs(observed - capacity) > 0.1 * capacity:
        diagnosis.explanation += (f" Note: the log's GPU has {observed:g} GiB but the job's GPU has {capacity:g} GiB; "
                                  "check that the job spec is the one that ran.")
    if fitting:
        shown = "; ".join(f"{label} -> {gib:g} GiB" for label, gib in fitting[:3])
        diagnosis.fixes.insert(0, f"Per the plan estimate these changes fit in {capacity:g} GiB per GPU: {shown}.")
    elif not memory.fits:
        diagnosis.fixes.insert(0, "No single cheap change fits per the plan estimate: run `trainready plan` for a "
                                  "setup that does (more GPUs, tensor or pipeline parallelism, a larger GPU).")
