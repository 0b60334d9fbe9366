"""Local files: durable writes, hashing while writing, verification, private modes, safe creation.

- `write_synced`: a new file's bytes reach the disk (fsync) before anything names it as done.
- `replace_durable`: temp file + fsync + rename + fsync of the directory: a reader (or a node
  after a power cut) sees the old file or the new one, never a torn mix.
- `HashingWriter`: sha256 and size of everything written through it (no second read).
- Modes: what we create is private unless TRAINREADY_FILE_MODE says otherwise:
  "private" (default) 0700 directories / 0600 files, "group" 0750 / 0640, "umask" the process umask.
- `create_exclusive`: O_CREAT|O_EXCL|O_NOFOLLOW, for files in directories others may write to
  (a planted symlink or file makes it fail instead of clobbering its target).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import io
import os
import secrets
import stat
from pathlib import Path
from typing import IO, Any

from trainready.errors import TrainreadyError, UsageError

CHUNK = 8 << 20
MODE_ENV = "TRAINREADY_FILE_MODE"
_MODES = {"private": (0o700, 0o600), "group": (0o750, 0o640), "umask": (0o777, 0o666)}


def _modes() -> tuple[int, int]:
    choice = os.environ.get(MODE_ENV, "private").strip().lower() or "private"
    if choice not in _MODES:
        raise UsageError(f"{MODE_ENV}={choice!r}: valid values are {', '.join(_MODES)}")
    return _MODES[choice]


def dir_mode() -> int:
    return _modes()[0]


def file_mode() -> int:
    return _modes()[1]


def child_umask() -> int:
    """The umask for a child process that writes files of ours (torchrun's per-rank logs): what our modes take
    away from group and others; -1 (inherit) in "umask" mode."""
    directory = dir_mode()
    return -1 if directory == 0o777 else 0o777 & ~directory


def make_dir(path: str | os.PathLike, *, parents: bool = True) -> Path:
    """mkdir with our mode (existing directories are left as they are: the user chose them)."""
    path = Path(path)
    path.mkdir(parents=parents, exist_ok=True, mode=dir_mode())
    return path


def owned_private_dir(path: str | os.PathLike) -> Path:
    """A directory only we can write to, created 0700 if missing. An existing one must be a real
    directory (not a symlink), owned by us, and not writable by group or others: a cache or lock
    directory in a shared place is otherwise a way for a neighbour to plant files."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    problem = ""
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        problem = "is not a directory (a symlink or file is in its place)"
    elif st.st_uid != os.getuid():
        problem = f"belongs to uid {st.st_uid}, not to you (uid {os.getuid()})"
    elif st.st_mode & 0o022:
        problem = f"is writable by others (mode {stat.S_IMODE(st.st_mode):o})"
    if problem:
        fix = f" or fix it with `chmod 700 {path}`" if "writable" in problem else ""
        raise UsageError(f"{path} {problem}: pick a directory of your own (e.g. under $XDG_CACHE_HOME){fix}")
    return path


def confine(path: str, what: str = "path") -> str:
    """A relative path read from a file we did not write ourselves (a manifest, an index), checked
    to stay inside its directory: not empty, not absolute, no '..', no empty parts, no backslash,
    no NUL. ValueError names the bad value."""
    if not isinstance(path, str) or not path or path.startswith("/") or "\\" in path or "\0" in path or \
            any(part in ("..", "", ".") for part in path.split("/")):
        raise ValueError(f"{what} {path!r} escapes its directory (absolute, '..', empty or odd parts)")
    return path


def fsync_dir(path: str | os.PathLike) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def create_exclusive(path: str | os.PathLike, mode: int | None = None, *, read: bool = False) -> int:
    """A new file opened for writing (and reading): fails if anything, a symlink included, is there."""
    flags = (os.O_RDWR if read else os.O_WRONLY) | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.open(path, flags, file_mode() if mode is None else mode)


def open_nofollow(path: str | os.PathLike, *, create: bool = True) -> int:
    """A read-write descriptor of `path` (created if missing) that never follows a symlink: for lock
    files in directories others may have prepared."""
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_CREAT if create else 0)
    return os.open(path, flags, file_mode())


def write_synced(path: str | os.PathLike, data: bytes) -> None:
    """Write a file that we own the directory of (a checkpoint's temporary directory) and fsync it."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, file_mode())
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_durable(path: str | os.PathLike, data: bytes) -> None:
    """Atomically replace `path` with `data`, durable once this returns."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    fd = create_exclusive(tmp)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
        os.close(fd)
        fd = -1
        os.replace(tmp, path)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def fsync_file(path: str | os.PathLike) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class PreconditionFailed(TrainreadyError):
    """A conditional write lost: the object exists (create-only) or changed (update-if-unchanged)."""


def read_regular(path: str | os.PathLike, limit: int, *, dir_fd: int | None = None) -> bytes:
    """The bytes of a small file we did not write ourselves: opened without following a symlink
    and without blocking (a FIFO planted in its place must not hang us), refused unless it is a
    regular file of at most `limit` bytes. OSError (FileNotFoundError when absent) otherwise.
    `dir_fd`: `path` is a name relative to that open directory (no path lookup above it)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        if st.st_size > limit:
            raise OSError(errno.EFBIG, f"{st.st_size} bytes, more than the {limit} such a file may have", str(path))
        chunks, left = [], limit + 1
        while left > 0 and (chunk := os.read(fd, min(left, CHUNK))):
            chunks.append(chunk)
            left -= len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > limit:
        raise OSError(errno.EFBIG, f"grew past {limit} bytes while being read", str(path))
    return data


def local_tag(path: str | os.PathLike) -> str | None:
    """A version tag of a local file for compare-and-replace: None when absent, the sha256 of a
    regular file's content, and a tag naming what else sits there (a symlink, a directory)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return f"not-a-file:{stat.S_IFMT(st.st_mode):o}"
    try:
        return hashlib.sha256(read_regular(path, 1 << 26)).hexdigest()
    except OSError as exc:
        return f"unreadable:{exc.errno}"


def put_if_local(path: Path, data: bytes, *, if_match: str | None = None, create_only: bool = False) -> None:
    """A local conditional write: create-only (an atomic hard link of a finished temp file) or
    update-if-unchanged (`if_match`: the `local_tag` we read, compared under an flock on a side
    file). PreconditionFailed when the condition does not hold. Whatever sits at `path` (a
    symlink included) is replaced by the rename, never written through."""
    make_dir(path.parent)
    if create_only:
        tmp = path.with_name(f".{path.name}.new-{os.getpid()}-{os.urandom(4).hex()}")
        write_synced(tmp, data)
        try:
            os.link(tmp, path)  # atomic create-only: fails if the name exists
        except FileExistsError:
            raise PreconditionFailed(f"{path} exists") from None
        finally:
            tmp.unlink(missing_ok=True)
        fsync_dir(path.parent)
        return
    if if_match is None:
        replace_durable(path, data)
        return
    fd = open_nofollow(path.with_name(f".{path.name}.lock"))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if local_tag(path) != if_match:
            raise PreconditionFailed(f"{path} changed under us")
        replace_durable(path, data)
    finally:
        os.close(fd)


class HashingWriter(io.RawIOBase):
    """Wraps a binary file: everything written is hashed (sha256) and counted on the way.
    Closing the wrapper leaves the wrapped file open (its owner closes it)."""

    def __init__(self, raw: IO[bytes]):
        super().__init__()
        self.raw, self.digest, self.size = raw, hashlib.sha256(), 0

    def write(self, data: Any) -> int:  # type: ignore[override]
        view = memoryview(data).cast("B")
        self.digest.update(view)
        self.size += len(view)
        return self.raw.write(view)

    def hexdigest(self) -> str:
        return self.digest.hexdigest()

    def tell(self) -> int:
        return self.raw.tell()

    def flush(self) -> None:
        if not self.raw.closed:
            self.raw.flush()

    def fileno(self) -> int:
        return self.raw.fileno()

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False


def hash_stream(handle: IO[bytes]) -> tuple[str, int]:
    """(sha256 hex, size) of what is left in `handle`."""
    digest, size = hashlib.sha256(), 0
    while chunk := handle.read(CHUNK):
        digest.update(chunk)
        size += len(chunk)
    return digest.hexdigest(), size


def sha256_file(path: str | os.PathLike) -> str:
    with open(path, "rb") as handle:
        return hash_stream(handle)[0]


def mismatch(size: int, sha256: str, want_size: int, want_sha256: str, source: str = "the index") -> str:
    """Why (size, sha256) differs from what was recorded, or '' when it does not."""
    if size != want_size:
        return f"{size} bytes where {source} says {want_size}"
    if sha256 != want_sha256:
        return f"sha256 {sha256[:16]}... where {source} says {want_sha256[:16]}..."
    return ""


def verify_file(handle: IO[bytes], size: int, sha256: str, source: str = "the index") -> str:
    """Why the file does not match (size, sha256), or '' when it does (reads it to the end)."""
    got, seen = hash_stream(handle)
    return mismatch(seen, got, size, sha256, source)


def parse_json(data: str | bytes | bytearray, **options: Any) -> Any:
    """json.loads for text from a file, an endpoint or a shard: JSON nested past the parser's depth is a ValueError
    like any other malformed JSON. As a RecursionError it escaped every reader's `except ValueError` and ended as
    an internal error (exit 3) instead of a message naming the file."""
    import json

    try:
        return json.loads(data, **options)
    except RecursionError:
        raise ValueError("JSON nested too deep") from None


def xdg_dir(variable: str, fallback: str, what: str, other_way: str = "") -> Path:
    """$XDG_CACHE_HOME / $XDG_CONFIG_HOME (`variable`) when it is an absolute path (the XDG spec ignores a relative
    one), else ~/`fallback`: per user, never a name anyone can predict in a directory everyone can write to. With
    neither, a UsageError saying what (`what`: "the shard cache") needs it, which variable to set, and
    `other_way` (" or pass cache_dir")."""
    base = os.environ.get(variable, "")
    if not os.path.isabs(base):
        try:
            base = str(Path.home() / fallback)
        except RuntimeError:
            raise UsageError(f"no home directory to keep {what} in: set {variable}{other_way}") from None
    return Path(base) / "trainready"


def output_file(path: str | os.PathLike, option: str, example: str) -> Path:
    """Where `option` will write a file (atomically: a temporary file renamed over it): a directory, a
    device or FIFO there (the rename would put a file in its place, /dev/null as root) or a missing
    directory is a UsageError naming the path and an `example` file name; so is a path the system cannot
    look at (a name too long, a directory without search permission), which pathlib raises as OSError."""
    from trainready.errors import printable

    path = Path(path)
    try:
        if path.is_dir():
            raise UsageError(f"{option} {printable(path)}: is a directory; give a file name, e.g. "
                             f"{printable(path / example)}")
        if path.exists() and not path.is_file():
            raise UsageError(f"{option} {printable(path)}: not a regular file; give a file name, e.g. {example}")
        if not path.parent.is_dir():
            raise UsageError(f"{option} {printable(path)}: the directory {printable(path.parent)} does not exist")
    except OSError as exc:
        raise UsageError(f"{option} {printable(path)}: {printable(exc.strerror or str(exc))}; give a file name, "
                         f"e.g. {example}") from None
    return path
