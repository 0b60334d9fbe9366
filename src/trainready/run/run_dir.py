"""One run directory and the files in it, named once: run.json (the command, settings and one entry per launch),
telemetry.jsonl (the records), stop.json (why the workers stopped on purpose), summary.json and logs/.

Every file here may have been edited, torn by a crash or replaced by an attacker: reads go through the bounded
regular-file reader (no symlink followed, no FIFO blocking us, size-capped), and what cannot be read is a
UsageError naming the file, or "unknown" (None) where the caller can go on without it. Writes are durable and
private (replace_durable)."""

from __future__ import annotations

import errno
import json
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from trainready.clock import SYSTEM_CLOCK, Clock
from trainready.errors import UsageError, printable
from trainready.io import parse_json, read_regular, replace_durable

from .record_decoder import decode_launches, decode_records
from .records import StopInfo
from .settings import STOP_FILE
from .telemetry import FILE as TELEMETRY_FILE
from .telemetry import TelemetryWriter, read_records

RUN_FILE = "run.json"
SUMMARY_FILE = "summary.json"
LOGS_DIR = "logs"
RUN_INFO_LIMIT = 64 << 20
"""run.json holds the command, settings and one entry per launch: a few KB; past this it is not ours."""
STOP_LIMIT = 1 << 20
"""stop.json is one small object."""


@dataclass(frozen=True)
class RunDir:
    path: Path

    @property
    def run_json(self) -> Path:
        return self.path / RUN_FILE

    @property
    def telemetry(self) -> Path:
        return self.path / TELEMETRY_FILE

    @property
    def stop_json(self) -> Path:
        return self.path / STOP_FILE

    @property
    def summary_json(self) -> Path:
        return self.path / SUMMARY_FILE

    @property
    def logs(self) -> Path:
        return self.path / LOGS_DIR

    def holds_a_run(self) -> bool:
        """Whether a launch has written here (run.json or telemetry)."""
        return self.run_json.exists() or self.telemetry.exists()

    def read_run_info(self) -> dict[str, Any]:
        """run.json: {} when absent; anything that is not a JSON object in a regular file of at most
        RUN_INFO_LIMIT bytes is a UsageError naming it."""
        path = self.run_json
        try:
            info = parse_json(read_regular(path, RUN_INFO_LIMIT))
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise UsageError(f"{printable(path)}: unreadable ({_why(exc, RUN_INFO_LIMIT)})") from None
        except ValueError as exc:
            raise UsageError(f"{printable(path)}: unreadable ({printable(str(exc))})") from None
        except RecursionError:  # nested deeper than json's parser goes
            raise UsageError(f"{printable(path)}: unreadable (JSON nested too deep)") from None
        if not isinstance(info, dict):
            raise UsageError(f"{printable(path)}: unreadable (a JSON {type(info).__name__}, not an object)")
        problem = run_info_problem(info)
        if problem:
            raise UsageError(f"{printable(path)}: unreadable ({problem})")
        return info

    def telemetry_writer(self, source: str, clock: Clock = SYSTEM_CLOCK) -> TelemetryWriter:
        """An appender of records to telemetry.jsonl (one O_APPEND write each; private mode) as `source` writes them
        ("launcher" or "rank0"), stamped by `clock`."""
        return TelemetryWriter(self.path, source=source, clock=clock)

    def read_records(self, skipped: dict[str, int] | None = None) -> list[dict[str, Any]]:
        """telemetry.jsonl's records, decoded against the documented models (record_decoder): lines that are not
        records, and records that are malformed, are left out and counted in `skipped` by reason ([] when the file
        is absent). A directory, device, FIFO or symlink loop in its place is a UsageError naming it."""
        path = _regular(self.telemetry)
        skipped = skipped if skipped is not None else {}
        try:
            raw = read_records(path, skipped=skipped)[0]
        except OSError as exc:  # permission denied, an I/O error
            raise UsageError(f"{printable(path)}: unreadable ({exc.strerror})") from None
        return decode_records(raw, skipped)

    def read_new_records(self, since: int = 0) -> tuple[list[dict[str, Any]], int]:
        """Records appended since byte offset `since`, decoded as read_records decodes them, and the offset to go
        on from (a line still being written waits for the next call): how the launcher follows a live run."""
        raw, offset = read_records(self.telemetry, since)
        return decode_records(raw), offset

    def read_launches(self, skipped: dict[str, int] | None = None) -> list[dict[str, Any]]:
        """run.json's launches that can be used, decoded (record_decoder.decode_launches); the others counted in
        `skipped`. [] when there is no run.json; one that cannot be read is a UsageError (read_run_info)."""
        return decode_launches(self.read_run_info().get("launches", []), skipped)

    def read_run_bytes(self) -> bytes:
        """run.json's bytes for the launcher, which rebuilds a torn one from telemetry: FileNotFoundError when
        absent; a file that is not regular or too large is a UsageError naming it."""
        try:
            return read_regular(self.run_json, RUN_INFO_LIMIT)
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise UsageError(f"cannot read {printable(self.run_json)} ({_why(exc, RUN_INFO_LIMIT)}): fix it or use "
                             "another --run-dir") from None

    def write_run_info(self, info: dict[str, Any]) -> None:
        replace_durable(self.run_json, json.dumps(info, indent=2, default=str).encode())

    def read_stop(self) -> StopInfo | None:
        """stop.json as the workers wrote it, decoded into its documented shape (records.StopInfo; fields this
        version does not know are ignored, as an older or newer writer may add some); None (unknown) when absent,
        not a regular file, too large, not JSON, or not that shape (a wrong type, an exit code outside 0..255):
        the launcher then explains the exit from the exit status alone."""
        try:
            info = parse_json(read_regular(self.stop_json, STOP_LIMIT))
        except (OSError, ValueError, RecursionError):
            return None
        if not isinstance(info, dict):
            return None
        try:  # the model bounds the exit code to 0..255
            return StopInfo.model_validate({k: v for k, v in info.items() if k in StopInfo.model_fields})
        except ValidationError:
            return None

    def write_stop(self, info: dict[str, Any]) -> None:
        replace_durable(self.stop_json, json.dumps(info, indent=2).encode())

    def clear_stop(self) -> None:
        self.stop_json.unlink(missing_ok=True)

    def write_summary(self, text: str) -> None:
        replace_durable(self.summary_json, text.encode())


def run_info_problem(info: dict[str, Any], every_launch: bool = False) -> str | None:
    """What makes a run.json object unusable, by the fields its readers rely on (records.RunInfo's types); None:
    usable. Unknown fields and missing ones are left to the readers (an older version wrote fewer), and so are
    launch entries that are not objects (report leaves them out) unless `every_launch` (the launcher, which
    rebuilds such a file from telemetry rather than lose what a launch spent)."""
    command = info.get("command", [])
    if not isinstance(command, list) or not all(isinstance(word, str) for word in command):
        return f"'command' is a JSON {_kind(command)}, not a list of strings"
    for name in ("config", "environment"):
        if name in info and not isinstance(info[name], dict):
            return f"'{name}' is a JSON {_kind(info[name])}, not an object"
    launches = info.get("launches", [])
    if not isinstance(launches, list):
        return f"'launches' is a JSON {_kind(launches)}, not an array"
    if every_launch:
        if not all(isinstance(launch, dict) for launch in launches):
            return "'launches' is not a list of objects"
        unusable: dict[str, int] = {}
        if len(decode_launches(launches, unusable)) != len(launches):  # its spend cannot be counted: rebuild
            return f"{sum(unusable[k] for k in unusable if k.startswith('launch: '))} unusable launch(es): " + \
                ", ".join(k for k in unusable if k.startswith("launch: "))
    return None


def _regular(path: Path) -> Path:
    """`path` when it is a regular file or absent; a directory, a device (/dev/zero never ends), a FIFO or a
    symlink loop in its place is a UsageError, not a hang or a traceback."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return path
    except OSError as exc:
        raise UsageError(f"{printable(path)}: unreadable ({exc.strerror})") from None
    if not stat.S_ISREG(mode):
        raise UsageError(f"{printable(path)}: not a regular file")
    return path


def _kind(value: object) -> str:
    return {bool: "boolean", int: "number", float: "number", str: "string", list: "array", dict: "object",
            type(None): "null"}.get(type(value), type(value).__name__)


def _why(exc: OSError, limit: int) -> str:
    if exc.errno in (errno.ELOOP, errno.EINVAL, errno.EISDIR):
        return "not a regular file"
    if exc.errno == errno.EFBIG:
        return f"more than {limit >> 20} MiB"
    return exc.strerror or str(exc)
