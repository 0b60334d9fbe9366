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

import contextlib
import errno
import hashlib
import json
import math
import os
import secrets
import stat
import threading
import time
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from trainready.errors import printable
from trainready.io import parse_json, xdg_dir
from trainready.io.files import read_regular

VERSION = 1
MAX_BYTES = 4 * 1024 * 1024  # a week of spot history for one type is ~100 KB; 40x that is not an answer we wrote
FUTURE_SLACK_S = 300  # clocks differ a little; a timestamp further ahead was not written by us
DEFAULT_MAX_AGE_S = 3600.0

M = TypeVar("M", bound=BaseModel)


def default_dir() -> Path:
    if os.environ.get("TRAINREADY_CACHE_DIR"):
        return Path(os.environ["TRAINREADY_CACHE_DIR"])
    return xdg_dir("XDG_CACHE_HOME", ".cache", "the cloud answers cache", " or TRAINREADY_CACHE_DIR")


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
        self._fd: int | None = None  # the checked directory, once opened

    def _note(self, text: str) -> None:
        with self._lock:
            if text not in self.notes:
                self.notes.append(text)

    def path(self, key: str) -> Path:
        return self.dir / (hashlib.sha256(key.encode()).hexdigest()[:40] + ".json")

    def get(self, key: str, model: type[M]) -> tuple[M, float] | None:
        """(value, age in seconds) when a fresh, valid answer for `key` is on disk; else None."""
        if not self.enabled:
            return None
        fd = self._dir_fd(create=False)
        if fd is None:
            return None
        path = self.path(key)
        try:
            value = self._read(fd, path, key, model)
        except _Ignored as why:
            self._note(f"ignored cache file {printable(path)}: {why}")
            value = None
        with self._lock:
            if value is None:
                self.misses += 1
            else:
                self.hits += 1
        return value

    def _read(self, fd: int, path: Path, key: str, model: type[M]) -> tuple[M, float] | None:
        try:  # relative to the directory we checked: no symlink, no FIFO blocked on, at most MAX_BYTES
            data = read_regular(path.name, MAX_BYTES, dir_fd=fd)
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
        data = json.dumps(record, separators=(",", ":")).encode()
        tmp = f".tmp-{secrets.token_hex(8)}.json"
        try:
            fd = self._dir_fd(create=True)
            if fd is None:
                return
            out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=fd)
            try:
                with os.fdopen(out, "wb") as f:
                    f.write(data)
                os.replace(tmp, self.path(key).name, src_dir_fd=fd, dst_dir_fd=fd)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=fd)
                raise
            self._writable = True
        except OSError as exc:
            self._writable = False
            self._note(f"cannot write the cache in {printable(self.dir)}: {exc.strerror or exc}; answers are not kept")

    def _dir_fd(self, *, create: bool) -> int | None:
        """The cache directory, opened once and checked (it and its parent): None when it is not there yet (and
        not `create`) or may not be used, with a note saying why. Files are then read and written relative to
        this descriptor, so swapping a path component after the check changes nothing we read. Nothing here is
        fatal: a cache that cannot be used is a note, and every answer is asked again."""
        with self._lock:
            if self._fd is not None or not self.enabled:
                return self._fd
            try:
                fd = self._open_checked(create)
            except _Ignored as why:
                fd, problem = None, str(why)
            else:
                if fd is not None:
                    self._fd = fd
                return fd
            self.enabled = False
        self._note(f"cache directory {printable(self.dir)} not used: {problem}")
        return None

    def _open_checked(self, create: bool) -> int | None:
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
        try:
            try:
                parent = os.open(self.dir.parent, flags)
            except FileNotFoundError:
                if not create:
                    return None
                self.dir.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                parent = os.open(self.dir.parent, flags)
        except OSError as exc:  # not a directory, a symlink loop, no permission
            raise _Ignored(exc.strerror or str(exc)) from None
        try:
            why = _parent_problem(os.fstat(parent))
            if why is not None:
                raise _Ignored(why)
            try:
                fd = os.open(self.dir.name, flags | os.O_NOFOLLOW, dir_fd=parent)
            except FileNotFoundError:
                if not create:
                    return None
                with contextlib.suppress(FileExistsError):
                    os.mkdir(self.dir.name, 0o700, dir_fd=parent)
                fd = os.open(self.dir.name, flags | os.O_NOFOLLOW, dir_fd=parent)
            why = _dir_problem(os.fstat(fd))
            if why is not None:
                os.close(fd)
                raise _Ignored(why)
            return fd
        except OSError as exc:
            raise _Ignored("it is a symlink or not a directory" if exc.errno in (errno.ELOOP, errno.ENOTDIR)
                           else exc.strerror or str(exc)) from None
        finally:
            os.close(parent)

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


def _dir_problem(st: os.stat_result) -> str | None:
    """Why the cache directory itself may not be used: ours alone, or someone could plant answers in it."""
    if st.st_uid != os.getuid() or st.st_mode & 0o022:
        return "it belongs to another user or others may write to it"
    return None


def _parent_problem(st: os.stat_result) -> str | None:
    """Why the directory above it may not hold our cache: whoever may rename entries there can put their own
    directory (with planted answers) in its place. It must be ours or root's, and not writable by group or others
    unless sticky (/tmp: nobody may rename an entry they do not own)."""
    if st.st_uid not in (os.getuid(), 0):
        return f"the directory above it belongs to another user (uid {st.st_uid})"
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        return "others may write to the directory above it (not sticky): they could swap the cache for theirs"
    return None


class _Ignored(Exception):
    """Why a cache file is not used."""


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")
