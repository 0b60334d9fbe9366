"""telemetry.jsonl: one JSON object per line, appended by rank 0 and by the launcher.

Every record has `schema_version`, `type` and `t` (unix seconds); the types and their fields
are documented in docs/run.md and docs/schemas/run-telemetry.schema.json. Non-finite numbers
(a NaN loss) are written as null and named in `nonfinite`, so every line is strict JSON.
Each record is one write() on an O_APPEND descriptor: the launcher and rank 0 can append to
the same file, and a crash leaves at most one torn last line, which readers skip.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trainready.clock import SYSTEM_CLOCK, Clock
from trainready.io import file_mode, make_dir, parse_json

TELEMETRY_SCHEMA_VERSION = 1
FILE = "telemetry.jsonl"


def _clean(record: dict[str, Any]) -> dict[str, Any]:
    nonfinite = []
    out: dict[str, Any] = {}
    for key, value in record.items():
        if isinstance(value, float) and not math.isfinite(value):
            nonfinite.append(key)
            value = None
        elif isinstance(value, dict):
            value = _clean(value)
        out[key] = value
    if nonfinite:
        out["nonfinite"] = nonfinite
    return out


class TelemetryWriter:
    """Appends records to RUN_DIR/telemetry.jsonl (or nowhere, when there is no run dir)."""

    def __init__(self, run_dir: Path | None, source: str, clock: Clock = SYSTEM_CLOCK):
        self.path = Path(run_dir) / FILE if run_dir else None
        self.source, self.clock = source, clock
        self._fd: int | None = None
        self._failed = False
        if self.path is not None:
            make_dir(self.path.parent)  # private unless TRAINREADY_FILE_MODE says otherwise (trainready.io)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, file_mode())

    def write(self, type_: str, **fields: Any) -> dict[str, Any]:
        record = _clean({"schema_version": TELEMETRY_SCHEMA_VERSION, "type": type_, "t": round(self.clock.time(), 3),
                         "source": self.source, **fields})
        if self._fd is not None:
            line = json.dumps(record, separators=(",", ":"), allow_nan=False) + "\n"
            try:
                os.write(self._fd, line.encode())
            except OSError as exc:  # telemetry must never stop rank 0 alone (the others would hang)
                if not self._failed:
                    sys.stderr.write(f"trainready: cannot write {self.path} ({exc.strerror}); telemetry is lost until it can\n")
                self._failed = True
        return record

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> TelemetryWriter:
        return self

    def __exit__(self, *exc: object) -> None:  # closed whatever a write raised
        self.close()


def read_records(path: Path, since: int = 0, skipped: dict[str, int] | None = None) -> tuple[list[dict[str, Any]], int]:
    """Complete records from byte offset `since`; returns them and the offset to continue from
    (a line still being written is left for the next call). `skipped`: counts lines that are not
    a record (torn, not JSON, not an object with a type) under "unreadable line"."""
    try:
        with open(path, "rb") as f:
            f.seek(since)
            data = f.read()
    except FileNotFoundError:
        return [], since
    end = data.rfind(b"\n") + 1
    records = list(_parse_lines(data[:end], skipped))
    return records, since + end


def median_step_s(records: list[dict[str, Any]]) -> float | None:
    """Median step interval of the step records, or None when none has one."""
    import statistics

    steps = [r["interval_s"] for r in records if r.get("type") == "step" and r.get("interval_s")]
    return statistics.median(steps) if steps else None


# orjson, where installed (the report extra), parses the same lines 3x faster: 7.3 MB of a 10,000-step run in
# 0.07 s against 0.22 s (bench/report_html.py). Whatever it refuses (NaN, Infinity, a lone surrogate) goes to
# json, and so does a line with an integer of 19+ digits (it would make a float of one past 64 bits): the same
# records either way.
try:
    import orjson
except ImportError:  # pragma: no cover - depends on the installed extras
    orjson = None
_DIGITS = bytes(0x30 if 0x30 <= i <= 0x39 else 0x20 for i in range(256))  # every digit "0", the rest " "


def _long_int(data: bytes) -> bool:
    """A run of 19+ digits in `data` (a translate and a substring search: a regex takes 10x longer on 7 MB)."""
    return b"0" * 19 in data.translate(_DIGITS)


def _loads(line: bytes, fast: bool) -> Any:
    if fast:
        try:
            return orjson.loads(line)
        except orjson.JSONDecodeError:
            pass
    return parse_json(line)


def _parse_lines(data: bytes, skipped: dict[str, int] | None = None) -> Iterator[dict[str, Any]]:
    fast = orjson is not None
    check = fast and _long_int(data)
    for line in data.splitlines():
        try:
            record = _loads(line, fast and not (check and _long_int(line)))
        except (ValueError, UnicodeDecodeError, RecursionError):
            record = None  # torn by a crash: skip, never fail the reader
        if isinstance(record, dict) and "type" in record:
            yield record
        elif skipped is not None and line.strip():
            skipped["unreadable line"] = skipped.get("unreadable line", 0) + 1
