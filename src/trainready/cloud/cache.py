"""Cloud API answers kept on disk with their timestamp, so a second `account` or `plan --live`
within `--max-age` asks nothing again.

The cache directory is shared with whatever else runs as the user, so every file is treated as
hostile: JSON only (never pickle, never code), a regular file (not a symlink, FIFO or device) of
at most MAX_BYTES, written by this version, for this very key, with a timestamp that is not in
the future, and a value that validates against the caller's strict pydantic model. Anything else
is ignored with a note and asked again; nothing in it can raise past `get`.
Location: $TRAINREADY_CACHE_DIR, else $XDG_CACHE_HOME/trainready, else ~/.cache/trainready.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import stat
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from trainready.errors import printable
from trainready.io import parse_json
from trainready.io.files import read_regular

VERSION = 1
MAX_BYTES = 4 * 1024 * 1024  # a week of spot history for one type is ~100 KB; 40x that is not an answer we wrote
FUTURE_SLACK_S = 300  # clocks differ a little; a timestamp further ahead was not written by us
DEFAULT_MAX_AGE_S = 3600.0

M = TypeVar("M", bound=BaseModel)


def default_dir() -> Path:
    if os.environ.get("TRAINREADY_CACHE_DIR"):
        return Path(os.environ["TRAINREADY_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "trainready"


class Cache:
    """get/put JSON answers by key under `directory/<namespace>/`; `notes` says what was ignored and why."""

    def __init__(self, directory: Path | None = None, *, max_age_s: float = DEFAULT_MAX_AGE_S,
                 namespace: str = "aws", enabled: bool = True):
        self.dir = (directory or default_dir()) / namespace
        self.max_age_s = max_age_s
        self.enabled = enabled and max_age_s > 0
        self.notes: list[str] = []
        self.hits = 0
        self.misses = 0
        self._lock = threading.Lock()
        self._writable: bool | None = None

    def _note(self, text: str) -> None:
        with self._lock:
            if text not in self.notes:
                self.notes.append(text)

    def path(self, key: str) -> Path:
        return self.dir / (hashlib.sha256(key.encode()).hexdigest()[:40] + ".json")

    def get(self, key: str, model: type[M]) -> tuple[M, float] | None:
        """(value, age in seconds) when a fresh, valid answer for `key` is on disk; else None."""
        if not self.enabled or not self._dir_ok():
            return None
        path = self.path(key)
        try:
            value = self._read(path, key, model)
        except _Ignored as why:
            self._note(f"ignored cache file {printable(path)}: {why}")
            value = None
        with self._lock:
            if value is None:
                self.misses += 1
            else:
                self.hits += 1
        return value

    def _read(self, path: Path, key: str, model: type[M]) -> tuple[M, float] | None:
        try:
            data = read_regular(path, MAX_BYTES)  # no symlink followed, no FIFO blocked on, at most MAX_BYTES
        except FileNotFoundError:
            return None
        except OSError as exc:
            why = {errno.ELOOP: "a symlink, not a file we wrote", errno.EINVAL: "not a regular file",
                   errno.EFBIG: f"more than the {MAX_BYTES // 2**20} MiB an answer may have"}.get(exc.errno)
            raise _Ignored(why or exc.strerror or str(exc)) from None
        try:
            doc = parse_json(data.decode("utf-8"), parse_constant=_no_constant)
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise _Ignored(f"not JSON ({type(exc).__name__})") from None
        if not isinstance(doc, dict) or set(doc) != {"version", "key", "stored_unix", "value"}:
            raise _Ignored("not a cache record (fields differ)")
        if doc["version"] != VERSION or isinstance(doc["version"], bool):
            raise _Ignored(f"written by another version ({printable(repr(doc['version']))[:20]})")
        if doc["key"] != key:
            raise _Ignored("holds the answer to another question")
        stored = doc["stored_unix"]
        if isinstance(stored, bool) or not isinstance(stored, (int, float)) or not math.isfinite(stored):
            raise _Ignored("its timestamp is not a number")
        age = time.time() - stored
        if age < -FUTURE_SLACK_S:
            raise _Ignored("its timestamp is in the future")
        if age > self.max_age_s:
            return None  # stale: asked again, and the new answer replaces it
        try:
            return model.model_validate(doc["value"]), max(0.0, age)
        except (ValidationError, ValueError, TypeError) as exc:
            first = exc.errors()[0] if isinstance(exc, ValidationError) else {"loc": (), "msg": str(exc)}
            where = ".".join(map(str, first["loc"])) or "value"
            raise _Ignored(f"field {printable(where)[:60]}: {printable(first['msg'])[:80]}") from None

    def put(self, key: str, value: BaseModel) -> None:
        """Store `value` (atomically; a cache that cannot be written is a note, not an error)."""
        if not self.enabled or self._writable is False:
            return
        record = {"version": VERSION, "key": key, "stored_unix": time.time(), "value": value.model_dump(mode="json")}
        try:
            self._ensure_dir()
            fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=".tmp-", suffix=".json")
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    json.dump(record, f, separators=(",", ":"))
                os.replace(tmp, self.path(key))
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        except OSError as exc:
            self._writable = False
            self._note(f"cannot write the cache in {printable(self.dir)}: {exc.strerror or exc}; answers are not kept")

    def _ensure_dir(self) -> None:
        if self._writable:
            return
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not self._dir_ok():
            raise OSError(0, "see the note above")
        self._writable = True

    def _dir_ok(self) -> bool:
        """The directory is ours alone (or not there yet): a directory others may write to could hold
        answers they made up, so it is not used at all."""
        try:
            st = os.lstat(self.dir)
        except FileNotFoundError:
            return True
        except OSError as exc:
            why = exc.strerror or str(exc)
        else:
            if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
                why = "it is a symlink or not a directory"
            elif st.st_uid != os.getuid() or st.st_mode & 0o022:
                why = "it belongs to another user or others may write to it"
            else:
                return True
        self._note(f"cache directory {printable(self.dir)} not used: {why}")
        self.enabled = False
        return False


class _Ignored(Exception):
    """Why a cache file is not used."""


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")
