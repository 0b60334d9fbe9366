"""A node-local, size-bounded cache of verified shards, shared by every rank and DataLoader worker.

Layout of the cache directory:
    {sha256}.tar               committed shards, named by content: two datasets (or two packs of
                               one dataset) never collide, and a re-packed shard is a new entry
    .tmp-{sha256}-{pid}-{tid}  a download in progress, created at the shard's full size
    .locks/{sha256}.lock       per-shard flock: one process downloads, the others wait for it
    .cache.lock                cache-wide flock: space accounting, eviction and commits

A shard is verified once, while it downloads (size and sha256 in the same pass as the write),
and the rename is the commit: no `.ok` marker, because a file only ever gets its final name
after it verified and was fsynced. Lock order is always per-shard, then cache-wide; the
cache-wide holder only *tries* per-shard locks (never waits), so no cycle can form.

Accounting: the limit covers committed shards plus downloads in progress, whose files are
created at full size (reserving the space) under the cache-wide lock, after least-recently-used
shards (by mtime, touched on every get) are evicted to make room. The limit must hold at least
one shard; it should hold prefetch_shards + 1, or prefetching evicts shards before their use.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

from trainready.errors import TrainreadyError, UsageError
from trainready.io import redact

log = logging.getLogger(__name__)
CHUNK = 8 << 20
TMP_PREFIX = ".tmp-"


class ShardError(TrainreadyError):
    """A shard that cannot be used; names the shard and where it lives."""

    exit_code = 1

    def __init__(self, name: str, url: str, why: str):
        self.name, self.url, self.why = name, redact(url), why
        super().__init__(f"shard {name} ({self.url}) {why}. Re-pack or re-upload the dataset "
                         f"(`trainready data pack`), or read it with on_corrupt='skip' to skip this shard.")


class CorruptShardError(ShardError):
    def __init__(self, name: str, url: str, why: str):
        super().__init__(name, url, f"is corrupt: {why}")


class MissingShardError(ShardError):
    def __init__(self, name: str, url: str):
        super().__init__(name, url, "is missing: index.json lists it but the object does not exist")


class CacheFullError(TrainreadyError):
    exit_code = 1


@dataclass
class CacheStats:
    hits: int = 0              # get()/open() found the shard (downloaded earlier, perhaps by prefetch)
    misses: int = 0            # shards this process downloaded
    bytes_downloaded: int = 0
    evictions: int = 0         # shards this process deleted to make room

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def verify_file(handle: IO[bytes], size: int, sha256: str) -> str:
    """Why the file does not match (size, sha256), or '' when it does."""
    digest, seen = hashlib.sha256(), 0
    while chunk := handle.read(CHUNK):
        digest.update(chunk)
        seen += len(chunk)
    return _mismatch(seen, size, digest.hexdigest(), sha256)


def _mismatch(seen: int, size: int, got: str, sha256: str) -> str:
    if seen != size:
        return f"{seen} bytes where index.json says {size}"
    if got != sha256:
        return f"sha256 {got[:16]}... where index.json says {sha256[:16]}..."
    return ""


@contextlib.contextmanager
def _flock(path: Path, blocking: bool = True) -> Iterator[bool]:
    """An exclusive flock on `path` for the block; yields False (held by someone else) when not blocking.
    Every call opens its own descriptor, so threads of one process exclude each other too."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
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

    def __init__(self, cache_dir: str | os.PathLike, limit_bytes: int, *, prefetch_shards: int = 2,
                 wait_timeout_s: float = 600.0):
        self.dir, self.limit = Path(cache_dir).expanduser().absolute(), int(limit_bytes)
        self.prefetch_shards, self.wait_timeout_s = max(0, int(prefetch_shards)), wait_timeout_s
        self.stats = CacheStats()
        (self.dir / ".locks").mkdir(parents=True, exist_ok=True, mode=0o700)
        self._mutex = threading.Lock()  # stats and prefetch errors
        self._prefetch_errors: dict[str, ShardError] = {}
        self._queue: deque[tuple[Any, str, str, int, str]] = deque()
        self._wake, self._thread = threading.Condition(), None

    def path_for(self, sha256: str) -> Path:
        return self.dir / f"{sha256}.tar"

    def get(self, fs: Any, remote_path: str, name: str, size: int, sha256: str) -> Path:
        """Path of the verified local copy, downloaded if needed. Another process may evict it once
        this returns (an open descriptor survives that, a path does not): to read, prefer open()."""
        with _flock(self._lock_path(sha256)):
            return self._ensure(fs, remote_path, name, size, sha256)

    def open(self, fs: Any, remote_path: str, name: str, size: int, sha256: str) -> IO[bytes]:
        """The verified local copy, opened for reading. Opened under the shard's lock, which eviction
        needs, so the file cannot vanish in between; deleting it later is harmless (Linux keeps the
        inode until the last descriptor closes)."""
        with _flock(self._lock_path(sha256)):
            return open(self._ensure(fs, remote_path, name, size, sha256), "rb")

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

    def _ensure(self, fs: Any, remote_path: str, name: str, size: int, sha256: str) -> Path:
        """With the shard's lock held: the committed file, downloading and verifying it if absent."""
        final = self.path_for(sha256)
        if final.exists():
            os.utime(final)  # LRU by mtime (atime is often not updated: noatime mounts)
            self._count(hits=1)
            return final
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
        tmp = self._reserve(size, sha256)
        try:
            self._download(fs, remote_path, name, size, sha256, tmp)
            with _flock(self.dir / ".cache.lock"):
                os.replace(tmp, final)  # the commit; a crash before it leaves only a stale temp
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        self._count(bytes_downloaded=size)
        return final

    def _download(self, fs: Any, remote_path: str, name: str, size: int, sha256: str, tmp: Path) -> None:
        url = fs.unstrip_protocol(remote_path)
        try:
            source = fs.open(remote_path, "rb")
        except FileNotFoundError:
            raise MissingShardError(name, url) from None
        digest, seen = hashlib.sha256(), 0
        with source, open(tmp, "r+b") as out:  # r+b: keep the reserved size, overwrite from the start
            while chunk := source.read(CHUNK):
                seen += len(chunk)
                if seen > size:
                    raise CorruptShardError(name, url, f"more than the {size} bytes index.json records")
                digest.update(chunk)
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        # the parent directory is not fsynced: a rename lost in a power cut only costs a download
        why = _mismatch(seen, size, digest.hexdigest(), sha256)
        if why:
            raise CorruptShardError(name, url, why)

    def _reserve(self, size: int, sha256: str) -> Path:
        """Evict least-recently-used shards until `size` fits, then create the download's file at
        full size so every process counts it. Waits while the space is held by downloads or readers."""
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
                    tmp = self.dir / f"{TMP_PREFIX}{sha256}-{os.getpid()}-{threading.get_ident()}"
                    with open(tmp, "wb") as handle:
                        handle.truncate(size)  # sparse: this is accounting, the bytes come with the download
                    return tmp
            if time.monotonic() > deadline:
                raise CacheFullError(f"shard cache {self.dir} stayed full for {self.wait_timeout_s:.0f}s: {used} of "
                                     f"{self.limit} bytes held by downloads and open shards; raise the cache limit")
            time.sleep(0.05)

    def _scan(self) -> tuple[int, list[tuple[float, int, Path]]]:
        """With the cache-wide lock: bytes counted (committed + downloads) and the committed shards
        as (mtime, size, path). Removes downloads whose process died (their shard lock is free)."""
        used, committed = 0, []
        for entry in os.scandir(self.dir):
            try:
                st = entry.stat()
            except FileNotFoundError:  # a failed download removing its temp without the cache-wide lock
                continue
            if entry.name.endswith(".tar"):
                committed.append((st.st_mtime, st.st_size, Path(entry.path)))
                used += st.st_size
            elif entry.name.startswith(TMP_PREFIX):
                sha = entry.name[len(TMP_PREFIX):].split("-", 1)[0]
                with _flock(self._lock_path(sha), blocking=False) as free:
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
            if self.path_for(sha256).exists():
                continue
            with _flock(self._lock_path(sha256)):  # the error is recorded before a waiting reader gets the lock
                try:
                    self._ensure(fs, remote_path, name, size, sha256)
                except ShardError as exc:
                    with self._mutex:
                        self._prefetch_errors[sha256] = exc
                except Exception as exc:  # network trouble, cache full: the reader's own get() retries and reports it
                    log.debug("prefetch of %s failed: %s", name, exc)
