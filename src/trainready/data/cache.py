"""A node-local, size-bounded cache of verified shards, shared by every rank and DataLoader worker
of one user.

Where: `cache_dir`, else $XDG_CACHE_HOME/trainready/shards, else ~/.cache/trainready/shards. The
directory must be yours alone (trainready.io.owned_private_dir: a real directory, not a symlink,
owned by you, not writable by group or others; created 0700 if missing), because whoever can
write to it could swap a verified shard for other bytes between two reads. That holds for a
directory you name too: a group-writable one is refused (`chmod 700 DIR` fixes it).

Layout of the cache directory:
    {sha256}.tar               committed shards, named by content: two datasets (or two packs of
                               one dataset) never collide, and a re-packed shard is a new entry
    .tmp-{sha256}-{pid}-{tid}  a download in progress, created at the shard's full size
    .locks/{sha256}.lock       per-shard flock: one process downloads, the others wait for it
    .cache.lock                cache-wide flock: space accounting, eviction and commits

A shard is verified while it downloads (size and sha256 in the same pass as the write), and the
rename is the commit. A committed file is not trusted for its name alone: before its first use in
a process it must be a regular file of ours that only we can write, of the right size and sha256
(checked once per process and inode); one that is not is deleted and downloaded again. Lock files
are opened without following symlinks and downloads are created with O_EXCL|O_NOFOLLOW, so nothing
planted at those names is ever written through. Lock order is always per-shard, then cache-wide;
the cache-wide holder only *tries* per-shard locks (never waits), so no cycle can form.

Accounting: the limit covers committed shards plus downloads in progress, whose files are
created at full size (reserving the space) under the cache-wide lock, after least-recently-used
shards (by mtime, touched on every get) are evicted to make room. The limit must hold at least
one shard; it should hold prefetch_shards + 1, or prefetching evicts shards before their use.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import stat
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

from trainready.errors import UsageError
from trainready.io import CHUNK, HashingWriter, create_exclusive, mismatch, open_nofollow, owned_private_dir, verify_file, xdg_dir

from .errors import CacheFullError, CorruptShardError, MissingShardError, ShardError  # noqa: F401 - raised here, imported from here

log = logging.getLogger(__name__)
TMP_PREFIX = ".tmp-"
SOURCE = "index.json"  # what a size or sha256 mismatch is measured against, in messages
_SHA256 = re.compile(r"[0-9a-f]{64}")
_SHARD_FILE = re.compile(r"([0-9a-f]{64})\.tar")
_TMP_FILE = re.compile(re.escape(TMP_PREFIX) + r"([0-9a-f]{64})-.*")


@dataclass
class CacheStats:
    hits: int = 0              # get()/open() found the shard (downloaded earlier, perhaps by prefetch)
    misses: int = 0            # shards this process downloaded
    bytes_downloaded: int = 0
    evictions: int = 0         # shards this process deleted to make room

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def default_cache_dir() -> Path:
    """$XDG_CACHE_HOME/trainready/shards, else ~/.cache/trainready/shards: per user, never a name
    anyone can predict in a directory everyone can write to (/tmp)."""
    return xdg_dir("XDG_CACHE_HOME", ".cache", "the shard cache", " or pass cache_dir") / "shards"


def cache_directory(cache_dir: str | os.PathLike | None) -> Path:
    """The shard cache directory (the default when None), created 0700 if missing; UsageError when
    it is a symlink, someone else's, or writable by group or others."""
    path = default_cache_dir() if cache_dir is None else Path(cache_dir).expanduser()
    return owned_private_dir(path.absolute())


def _foreign(st: os.stat_result, size: int, sha256: str) -> str:
    """Why a committed file is not one this cache wrote, or '': a regular file of ours that only
    we can write, of the size index.json records."""
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    if st.st_uid != os.getuid():
        return f"belongs to uid {st.st_uid}, not to you (uid {os.getuid()})"
    if st.st_mode & 0o022:
        return f"is writable by others (mode {stat.S_IMODE(st.st_mode):o})"
    if st.st_size != size:
        return f"does not match ({mismatch(st.st_size, '', size, sha256, SOURCE)})"
    return ""


def check_sha256(sha256: str, name: str | None = None) -> None:
    """A sha256 names files in the cache: only 64 lowercase hex digits may."""
    if not isinstance(sha256, str) or not _SHA256.fullmatch(sha256):
        shard = f"shard {name}: " if name else ""
        raise UsageError(f"{shard}sha256 {sha256!r} is not 64 lowercase hex digits")


@contextlib.contextmanager
def _flock(path: Path, blocking: bool = True) -> Iterator[bool]:
    """An exclusive flock on `path` for the block; yields False (held by someone else) when not blocking.
    Every call opens its own descriptor, so threads of one process exclude each other too. The
    lock file is never opened through a symlink: one planted there fails a blocking lock with a
    UsageError, and counts as held (skip it) for a non-blocking one."""
    try:
        fd = open_nofollow(path)
    except OSError as exc:
        if blocking:
            raise UsageError(f"cannot lock {path}: {exc.strerror} (a symlink or directory in its place? the shard "
                             f"cache directory must be yours alone)") from None
        fd = -1
    if fd < 0:
        yield False
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if blocking else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)  # closing the descriptor releases the lock


class ShardCache:
    """get()/open(): a verified local copy of a shard; prefetch(): fetch the next ones in the background."""

    def __init__(self, cache_dir: str | os.PathLike | None, limit_bytes: int, *, prefetch_shards: int = 2,
                 wait_timeout_s: float = 600.0):
        self.dir, self.limit = cache_directory(cache_dir), int(limit_bytes)
        self.prefetch_shards, self.wait_timeout_s = max(0, int(prefetch_shards)), wait_timeout_s
        self.stats = CacheStats()
        owned_private_dir(self.dir / ".locks")
        self._mutex = threading.Lock()  # stats and prefetch errors
        self._prefetch_errors: dict[str, ShardError] = {}
        self._verified: tuple[int, dict[str, tuple[int, int]]] = (os.getpid(), {})  # sha256 -> (st_dev, st_ino)
        self._queue: deque[tuple[Any, str, str, int, str]] = deque()
        self._wake, self._thread = threading.Condition(), None

    def path_for(self, sha256: str) -> Path:
        check_sha256(sha256)
        return self.dir / f"{sha256}.tar"

    def get(self, fs: Any, remote_path: str, name: str, size: int, sha256: str) -> Path:
        """Path of the verified local copy, downloaded if needed. Another process may evict it once
        this returns (an open descriptor survives that, a path does not): to read, prefer open()."""
        check_sha256(sha256, name)
        with _flock(self._lock_path(sha256)):
            self._ensure(fs, remote_path, name, size, sha256).close()
            return self.path_for(sha256)

    def open(self, fs: Any, remote_path: str, name: str, size: int, sha256: str) -> IO[bytes]:
        """The verified local copy, opened for reading. Opened under the shard's lock, which eviction
        needs, so the file cannot vanish in between; deleting it later is harmless (Linux keeps the
        inode until the last descriptor closes). The descriptor is the one that was verified."""
        check_sha256(sha256, name)
        with _flock(self._lock_path(sha256)):
            return self._ensure(fs, remote_path, name, size, sha256)

    def usage(self) -> tuple[int, int]:
        """(bytes counted against the limit, committed shards), read under the cache-wide lock."""
        with _flock(self.dir / ".cache.lock"):
            used, committed = self._scan()
        return used, len(committed)

    def prefetch(self, fs: Any, items: Iterable[tuple[str, str, int, str]]) -> None:
        """Download the first `prefetch_shards` of items ((remote_path, name, size, sha256), next first)
        in a background thread, replacing what was queued. A failure is kept and raised by the
        get()/open() of that shard (a network error is not kept: that call simply retries)."""
        if not self.prefetch_shards:
            return
        wanted = [(fs, *item) for item in items][: self.prefetch_shards]
        for item in wanted:
            check_sha256(item[4], item[2])
        with self._wake:
            self._queue = deque(wanted)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._prefetch_loop, name="shard-prefetch", daemon=True)
                self._thread.start()
            self._wake.notify()

    def close(self, timeout: float | None = 60.0) -> None:
        """Stop prefetching: drop what is queued and wait for a download in flight to end."""
        with self._wake:
            thread, self._thread = self._thread, None
            self._queue = deque([None])  # type: ignore[list-item]  # the stop signal
            self._wake.notify()
        if thread is not None:
            thread.join(timeout)

    # -- internals -------------------------------------------------------------------------

    def _lock_path(self, sha256: str) -> Path:
        return self.dir / ".locks" / f"{sha256}.lock"

    def _count(self, **deltas: int) -> None:
        with self._mutex:
            for key, value in deltas.items():
                setattr(self.stats, key, getattr(self.stats, key) + value)

    def _verified_here(self) -> dict[str, tuple[int, int]]:
        """The shards this process has verified (a forked child starts with none of its parent's)."""
        if self._verified[0] != os.getpid():
            self._verified = (os.getpid(), {})
        return self._verified[1]

    def _ensure(self, fs: Any, remote_path: str, name: str, size: int, sha256: str, *, count_hit: bool = True) -> IO[bytes]:
        """With the shard's lock held: the committed file opened for reading, downloading and
        verifying it if absent or not trustworthy."""
        final = self.path_for(sha256)
        handle = self._cached(final, name, size, sha256)
        if handle is not None:
            os.utime(handle.fileno())  # LRU by mtime (atime is often not updated: noatime mounts)
            if count_hit:
                self._count(hits=1)
            return handle
        with self._mutex:
            failed = self._prefetch_errors.pop(sha256, None)
        if failed is not None:
            raise failed
        if size > self.limit:
            raise UsageError(f"shard {name} is {size} bytes but the shard cache {self.dir} is limited to {self.limit} "
                             f"bytes: the limit must hold at least one shard (better prefetch_shards + 1 of them)")
        self._count(misses=1)
        for stale in self.dir.glob(f"{TMP_PREFIX}{sha256}-*"):  # we hold the lock: leftovers of a killed download
            stale.unlink(missing_ok=True)
        tmp, out = self._reserve(size, sha256)
        try:
            self._download(fs, remote_path, name, size, sha256, out)
            with _flock(self.dir / ".cache.lock"):
                os.replace(tmp, final)  # the commit; a crash before it leaves only a stale temp
        except BaseException:
            out.close()
            tmp.unlink(missing_ok=True)
            raise
        self._count(bytes_downloaded=size)
        st = os.fstat(out.fileno())
        self._verified_here()[sha256] = (st.st_dev, st.st_ino)
        out.seek(0)
        return out

    def _cached(self, path: Path, name: str, size: int, sha256: str) -> IO[bytes] | None:
        """The committed file at `path` opened for reading if it can be trusted; else None, after
        removing whatever is at its name."""
        try:  # O_NONBLOCK: a FIFO in its place must not hang the open
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as exc:  # ELOOP: a symlink
            why = f"cannot be opened ({exc.strerror})"
        else:
            st = os.fstat(fd)
            why = _foreign(st, size, sha256)
            if why:
                os.close(fd)
            else:
                handle = os.fdopen(fd, "rb")
                why = self._verify_once(handle, st, size, sha256)
                if not why:
                    return handle
                handle.close()
        log.warning("cached shard %s at %s %s: removing it and downloading the shard again", name, path, why)
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            raise UsageError(f"{path} is in the way of shard {name} and cannot be removed ({exc.strerror}): "
                             "remove it") from None
        return None

    def _verify_once(self, handle: IO[bytes], st: os.stat_result, size: int, sha256: str) -> str:
        """'' when the file matches index.json: hashed once per process and inode."""
        verified = self._verified_here()
        if verified.get(sha256) == (st.st_dev, st.st_ino):
            return ""
        why = verify_file(handle, size, sha256, SOURCE)
        if why:
            return f"does not match ({why})"
        verified[sha256] = (st.st_dev, st.st_ino)
        handle.seek(0)
        return ""

    def _download(self, fs: Any, remote_path: str, name: str, size: int, sha256: str, out: IO[bytes]) -> None:
        url = fs.unstrip_protocol(remote_path)
        try:
            source = fs.open(remote_path, "rb")
        except FileNotFoundError:
            raise MissingShardError(name, url) from None
        writer = HashingWriter(out)  # hashed on the way: the download is never read back
        with source:
            while chunk := source.read(CHUNK):
                if writer.size + len(chunk) > size:
                    raise CorruptShardError(name, url, f"more than the {size} bytes index.json records")
                writer.write(chunk)
        out.flush()
        os.fsync(out.fileno())
        # the parent directory is not fsynced: a rename lost in a power cut only costs a download
        why = mismatch(writer.size, writer.hexdigest(), size, sha256, SOURCE)
        if why:
            raise CorruptShardError(name, url, why)

    def _reserve(self, size: int, sha256: str) -> tuple[Path, IO[bytes]]:
        """Evict least-recently-used shards until `size` fits, then create the download's file at
        full size so every process counts it. Waits while the space is held by downloads or readers.
        The file is created O_EXCL|O_NOFOLLOW and written through this descriptor only."""
        deadline = time.monotonic() + self.wait_timeout_s
        while True:
            with _flock(self.dir / ".cache.lock"):
                used, committed = self._scan()
                for _mtime, fsize, path in sorted(committed):
                    if used + size <= self.limit:
                        break
                    if self._evict(path):
                        used -= fsize
                if used + size <= self.limit:
                    return self._create_download(size, sha256)
            if time.monotonic() > deadline:
                raise CacheFullError(f"shard cache {self.dir} stayed full for {self.wait_timeout_s:.0f}s: {used} of "
                                     f"{self.limit} bytes held by downloads and open shards; raise the cache limit")
            time.sleep(0.05)

    def _create_download(self, size: int, sha256: str) -> tuple[Path, IO[bytes]]:
        tmp = self.dir / f"{TMP_PREFIX}{sha256}-{os.getpid()}-{threading.get_ident()}"
        try:
            fd = create_exclusive(tmp, 0o600, read=True)  # 0600: only our own processes read the cache
        except FileExistsError:  # we removed our leftovers under the shard's lock: something else put it there
            raise UsageError(f"{tmp} appeared while downloading into the shard cache: something else writes to "
                             f"{self.dir}; use a cache directory of your own") from None
        out = os.fdopen(fd, "r+b")
        try:
            out.truncate(size)  # sparse: this is accounting, the bytes come with the download
        except BaseException:
            out.close()
            tmp.unlink(missing_ok=True)
            raise
        return tmp, out

    def _scan(self) -> tuple[int, list[tuple[float, int, Path]]]:
        """With the cache-wide lock: bytes counted (committed + downloads) and the committed shards
        as (mtime, size, path). Removes downloads whose process died (their shard lock is free).
        Names the cache does not write are neither counted nor touched."""
        used, committed = 0, []
        for entry in os.scandir(self.dir):
            shard, download = _SHARD_FILE.fullmatch(entry.name), _TMP_FILE.fullmatch(entry.name)
            if not (shard or download):
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:  # a failed download removing its temp without the cache-wide lock
                continue
            if not stat.S_ISREG(st.st_mode):
                continue
            if shard:
                committed.append((st.st_mtime, st.st_size, Path(entry.path)))
                used += st.st_size
                continue
            with _flock(self._lock_path(download.group(1)), blocking=False) as free:
                if free:
                    Path(entry.path).unlink(missing_ok=True)
                    continue
            used += st.st_size
        return used, committed

    def _evict(self, path: Path) -> bool:
        """Delete a committed shard unless someone holds its lock (downloading or opening it).
        A process already reading it keeps its open descriptor and inode: deletion is safe."""
        with _flock(self._lock_path(path.stem), blocking=False) as free:
            if not free:
                return False
            path.unlink(missing_ok=True)
        self._count(evictions=1)
        return True

    def _prefetch_loop(self) -> None:
        while True:
            with self._wake:
                while not self._queue:
                    self._wake.wait()
                item = self._queue.popleft()
            if item is None:
                return
            fs, remote_path, name, size, sha256 = item
            try:  # the error is recorded under the shard's lock, before a waiting reader gets it
                with _flock(self._lock_path(sha256)):
                    try:  # a cached shard is verified here too, off the reader's path
                        self._ensure(fs, remote_path, name, size, sha256, count_hit=False).close()
                    except ShardError as exc:
                        with self._mutex:
                            self._prefetch_errors[sha256] = exc
            except Exception as exc:  # network trouble, cache full: the reader's own get() retries and reports it
                log.debug("prefetch of %s failed: %s", name, exc)
