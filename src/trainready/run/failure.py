"""When workers fail for good: which rank, how, its last log lines, and what the logs say.

torchrun ends with a ChildFailedError summary ("Root Cause (first observed failure)") naming
each failed rank, its local rank and exit code; its per-rank logs are under
RUN_DIR/logs/<rdzv-run-id>_<random>/attempt_<n>/<local_rank>/{stdout,stderr}.log.
"""

from __future__ import annotations

import re
import signal
from pathlib import Path
from typing import Any

from trainready.io import redact

from .launch_spec import EXIT_FAILED, LaunchResult, LaunchSpec
from .log_rules_torch import signal_name

TAIL_LINES = 25  # shown for the failing ranks
VICTIM_LINES = 60  # searched for signs that a rank only saw a peer die
_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)\s*\(local_rank:\s*(\d+)\)")
_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)\s*\(pid:\s*(\d+)\)")


def failed_ranks(output: list[str]) -> list[dict[str, Any]]:
    """Ranks in torchrun's failure summary, the root cause (first observed failure) first."""
    found: list[dict[str, Any]] = []
    rank = None
    root = False
    for line in output:
        if "Root Cause" in line:
            root = True
        elif line.startswith("Failures:"):
            root = False
        if m := _RANK.match(line):
            rank = {"rank": int(m.group(1)), "local_rank": int(m.group(2)), "root_cause": root}
        elif (m := _EXIT.match(line)) and rank is not None:
            rank.update(exit_code=int(m.group(1)), pid=int(m.group(2)))
            if rank not in found:
                found.append(rank)
            rank = None
    return sorted(found, key=lambda r: not r["root_cause"])


# what a rank prints when a *peer* died: it is a victim, not the cause
_VICTIM = re.compile(r"Connection closed by peer|Connection reset by peer|remote process exited|communicator was aborted"
                     r"|Broken pipe|Socket Timeout|SIGTERM", re.IGNORECASE)


def latest_attempt(run_dir: Path) -> Path | None:
    attempts = sorted((run_dir / "logs").glob("*/attempt_*"), key=lambda p: p.stat().st_mtime)
    return attempts[-1] if attempts else None


def _tail(path: Path, n: int) -> list[str]:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    return lines[-n:]


def raised_then_aborted(code: int, lines: list[str]) -> bool:
    """SIGABRT after a Python traceback: the script raised, and torch (2.x) then aborted at interpreter
    exit ("terminate called without an active exception") with its process group still alive. The
    exception is the cause, not the signal."""
    return code == -signal.SIGABRT and any("Traceback (most recent call last)" in line for line in lines)


def describe_exit(code: int, raised: bool = False, sigkill_by: str | None = None) -> str:
    """`sigkill_by`: who sent a SIGKILL where that is known (kill_cause.sigkill_cause)."""
    if code < 0:
        name = signal_name(code)
        hint = ""
        if code == -9:
            hint = f" ({sigkill_by})" if sigkill_by else " (often the kernel's OOM killer: host memory; see `dmesg`)"
        if raised:
            hint = (" after raising a Python exception (torch aborts at exit when the process group is still "
                    "alive; the traceback in its log is the cause)")
        return f"killed by {name}{hint}"
    return f"exit code {code}"


def explain_failure(spec: LaunchSpec, output: list[str], returncode: int, sigkill_by: str | None = None) -> LaunchResult:
    ranks = failed_ranks(output)
    attempt = latest_attempt(spec.run_dir)
    tails: dict[str, list[str]] = {}
    files: list[str] = []
    read: dict[Path, list[str]] = {}  # each log's last VICTIM_LINES lines, read once

    def last_lines(path: Path, n: int) -> list[str]:
        if path not in read:
            read[path] = _tail(path, VICTIM_LINES)
        return read[path][-n:]

    if attempt is None:
        shown: list[dict[str, Any]] = []
    else:  # the ranks torchrun named, else every local rank of the last attempt
        shown = ranks or [{"local_rank": int(p.name)} for p in sorted(attempt.iterdir()) if p.name.isdigit()]
    for rank in shown:
        for stream in ("stderr.log", "stdout.log"):
            path = attempt / str(rank["local_rank"]) / stream
            if path.exists():
                files.append(str(path))
                lines = last_lines(path, TAIL_LINES)
                if lines and str(path) not in tails and (stream == "stderr.log" or not tails):
                    tails[str(path)] = [redact(line) for line in lines]  # shown and put in --json: may be shared
    restarts = spec.max_restarts
    raised: set[int] = set()
    if ranks and attempt is not None:  # a rank whose own log shows the error goes first
        victims = set()
        for rank in ranks:
            code, lines = rank.get("exit_code", 1), last_lines(attempt / str(rank["local_rank"]) / "stderr.log", VICTIM_LINES)
            if raised_then_aborted(code, lines):
                raised.add(rank["rank"])
            if any(_VICTIM.search(line) for line in lines) or (code < 0 and rank["rank"] not in raised):
                victims.add(rank["rank"])
        ranks.sort(key=lambda rank: rank["rank"] in victims)
    if ranks:
        first = ranks[0]
        what = describe_exit(first.get("exit_code", returncode), raised=first["rank"] in raised, sigkill_by=sigkill_by)
        message = (f"worker rank {first['rank']} (local rank {first['local_rank']}) failed: {what}"
                   f"{f', after {restarts} restart(s)' if restarts else ''}")
    else:
        message = (f"torchrun exited with {describe_exit(returncode, sigkill_by=sigkill_by)} before any worker reported "
                   "(see launcher.log)")
    return LaunchResult(EXIT_FAILED, "failed", message, failed_ranks=ranks, log_tail=tails,
                        log_files=files + [str(spec.run_dir / "launcher.log")])
