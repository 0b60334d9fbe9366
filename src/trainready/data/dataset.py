"""ShardedDataset: stream a packed dataset (a local directory or object storage) into training.

Who reads what in an epoch (a pure function of seed, epoch, rank and worker):
  * The shard order is a permutation seeded by (seed, epoch) (index order if shuffle=False);
    the epoch's sample sequence is the shards' samples in that order.
  * N samples, W ranks. remainder="drop": each rank gets N // W samples, the last N % W of the
    sequence are dropped (which ones rotates with the shard order). remainder="pad": each rank
    gets ceil(N / W), the sequence wrapping around to its start (a few samples seen twice).
    Rank r reads the contiguous block [r*n, (r+1)*n), so it touches ~1/W of the shards.
  * DataLoader worker k of K reads a contiguous sub-block of its rank's (sizes differ by <= 1),
    through a shuffle buffer of `shuffle_buffer` samples seeded by (seed, epoch, rank, worker).
  * on_corrupt="skip" drops a bad or missing shard (logged; counted in `skipped_shards` and the
    state). Ranks then get unequal counts: stop at the shortest rank, or keep "error".

Exact resume: state_dict() holds the epoch, the samples this worker yielded in it, the runs it
skipped and the settings that must match. The buffer's output order depends only on indices and
the seed, so iter() after load_state_dict() replays the buffer over indices (no data read),
re-reads what was still in it (~shuffle_buffer * ln(shuffle_buffer) samples back) and goes on.
StatefulDataLoader saves and restores each worker's state in that worker. The state resumes
its own epoch unless set_epoch() names a later one, which then starts from its beginning: after
a state saved at the end of epoch e, set_epoch(e + 1) as usual (with num_workers > 0 set_epoch
reaches workers only when they start: keep persistent_workers=False).

Storage: a local dataset (a path or file://) is read in place, each shard's size and sha256
checked the first time a process opens it (verify_local=False skips that). Remote shards go
through a ShardCache; cache_dir=None is $XDG_CACHE_HOME/trainready/shards (else
~/.cache/trainready/shards) with a 10 GiB limit. The cache directory must be yours alone (see
cache.py); it is checked here, so a bad one fails at construction, not in a worker.
"""

from __future__ import annotations

import logging
import os
import random
import stat
import tarfile
from collections.abc import Iterator
from typing import IO, Any, Literal

try:
    from torch.utils.data import IterableDataset, get_worker_info
except ImportError as exc:  # pragma: no cover - torch is an optional extra
    raise ImportError("trainready.data.dataset needs torch: pip install 'trainready[torch,data]'") from exc

from trainready.dist import identity
from trainready.errors import UsageError
from trainready.io import mismatch, verify_file

from . import owner_watch
from .assign import Run, Throughput, samples_per_rank, shard_order, simulate_buffer, span_runs, worker_span  # noqa: F401
from .cache import SOURCE, CorruptShardError, MissingShardError, ShardCache, ShardError, cache_directory
from .format import Format, decode, iter_members, sample_key
from .index_io import is_local, load_index, open_dataset, shard_url

log = logging.getLogger(__name__)
DEFAULT_CACHE_LIMIT = 10 << 30
STATE_VERSION = 1


def _dist_defaults(rank: int | None, world_size: int | None) -> tuple[int, int]:
    if rank is None or world_size is None:  # the one answer every subsystem uses (torch.distributed, else torchrun's env)
        me = identity()
        rank, world_size = me.rank if rank is None else rank, me.world_size if world_size is None else world_size
    if world_size < 1 or not 0 <= rank < world_size:
        raise UsageError(f"rank {rank} is not in 0..{world_size - 1} (world_size {world_size})")
    return rank, world_size


def _worker() -> tuple[int, int]:
    info = get_worker_info()
    return (info.id, info.num_workers) if info else (0, 1)


class ShardedDataset(IterableDataset):
    """Samples of a packed dataset for this rank and DataLoader worker; see the module docstring."""

    def __init__(self, url: str, *, format: Format | None = None, seed: int = 0, shuffle: bool = True,
                 shuffle_buffer: int = 1000, cache_dir: str | os.PathLike | None = None,
                 cache_limit_bytes: int = DEFAULT_CACHE_LIMIT, prefetch_shards: int = 2,
                 remainder: Literal["drop", "pad"] = "drop", on_corrupt: Literal["error", "skip"] = "error",
                 decode: bool = True, with_keys: bool = False, verify_local: bool = True,
                 rank: int | None = None, world_size: int | None = None):
        if remainder not in ("drop", "pad") or on_corrupt not in ("error", "skip"):
            raise UsageError(f"remainder must be drop|pad and on_corrupt error|skip, not {remainder!r}/{on_corrupt!r}")
        self.url = str(url)
        self.index, fs, self._root = load_index(self.url)
        if format is not None and format != self.index.format:
            raise UsageError(f"{self.url} holds {self.index.format} samples, not {format}")
        if not self.index.shards:
            raise UsageError(f"{self.url} lists no shards yet (is `trainready data pack` still running?)")
        self.format: Format = self.index.format
        self.seed, self.shuffle, self.shuffle_buffer = seed, shuffle, max(0, int(shuffle_buffer))
        self.remainder, self.on_corrupt, self.decode, self.with_keys = remainder, on_corrupt, decode, with_keys
        self.verify_local, self.prefetch_shards = verify_local, prefetch_shards
        self.rank, self.world_size = _dist_defaults(rank, world_size)
        self.local = is_local(fs)
        self.cache_dir = cache_dir if self.local else cache_directory(cache_dir)  # a local dataset needs no cache
        self.cache_limit_bytes = int(cache_limit_bytes)
        biggest = max(s.bytes for s in self.index.shards)
        if not self.local and biggest > self.cache_limit_bytes:
            raise UsageError(f"cache_limit_bytes={self.cache_limit_bytes} is smaller than a shard of {self.url} ({biggest} "
                             f"bytes): the cache must hold at least one shard, better prefetch_shards + 1")
        if not self.local and biggest * (prefetch_shards + 1) > self.cache_limit_bytes:
            log.warning("shard cache limit %d bytes holds fewer than prefetch_shards + 1 shards of up to %d bytes: "
                        "prefetched shards may be evicted unread", self.cache_limit_bytes, biggest)
        self.epoch = 0
        self.skipped_shards = 0  # shards skipped by this process (the workers' counts are in their states)
        self._pending: dict[str, Any] | None = None  # a loaded state, consumed by the next iter()
        self._cur: dict[str, Any] | None = None      # position of the current iteration
        self._pid, self._fs, self._cache, self._verified = -1, None, None, set()

    # -- public API --------------------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)
        if self._cur is not None and self._cur["epoch"] != self.epoch:
            self._cur = None  # state_dict() now describes the new epoch, not yet started

    def close(self) -> None:
        """Stop this process's prefetch thread (it is a daemon: exiting does not need this)."""
        if self._cache is not None:
            self._cache.close()

    @property
    def samples_per_rank(self) -> int:
        return samples_per_rank(self.index.total_samples, self.world_size, self.remainder)

    @property
    def cache_stats(self) -> dict[str, int]:
        return self._cache.stats.as_dict() if self._cache else {}

    def state_dict(self) -> dict[str, Any]:
        worker, workers = _worker()
        cur = self._cur or self._fresh(worker, workers)
        return {"version": STATE_VERSION, "epoch": cur["epoch"], "samples_yielded": cur["yielded"], "epoch_done": cur["done"],
                "skipped_runs": sorted([run, at] for run, at in cur["skipped"].items()),
                "skipped_shards": self.skipped_shards, **self._settings(cur["worker"], cur["num_workers"])}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("version") != STATE_VERSION:
            raise UsageError(f"not a ShardedDataset state (version {state.get('version')!r}, expected {STATE_VERSION})")
        self._pending = dict(state)

    def __iter__(self) -> Iterator[Any]:
        # Not a generator itself: the loaded state is consumed (and the position set) when iter()
        # is called, which is when StatefulDataLoader reads the state back for the next snapshot.
        worker, workers = _worker()
        if get_worker_info() is not None:  # a forkserver-started worker exits with the process that started it
            owner_watch.watch_starter()
        pending, self._pending = self._pending, None
        cur = self._fresh(worker, workers)
        if pending is not None and pending["epoch"] < self.epoch:
            pending = None  # set_epoch() moved past the saved epoch (finished, or abandoned on purpose)
        if pending is not None:
            wrong = [f"{k} {pending.get(k)!r} -> {v!r}" for k, v in self._settings(worker, workers).items()
                     if pending.get(k) != v]
            if wrong:
                raise UsageError("cannot resume this data stream exactly, settings changed: " + ", ".join(wrong))
            if pending["epoch"] != self.epoch:
                log.info("resuming epoch %d from the saved state (set_epoch said %d)", pending["epoch"], self.epoch)
            cur.update(epoch=pending["epoch"], yielded=pending["samples_yielded"], done=pending["epoch_done"],
                       skipped={int(run): at for run, at in pending["skipped_runs"]})
        self._cur = cur
        return self._generate(cur)

    # -- reading -----------------------------------------------------------------------------

    def _fresh(self, worker: int, workers: int) -> dict[str, Any]:
        return {"epoch": self.epoch, "yielded": 0, "done": False, "skipped": {}, "worker": worker, "num_workers": workers}

    def _settings(self, worker: int, workers: int) -> dict[str, Any]:
        return {"rank": self.rank, "world_size": self.world_size, "worker": worker, "num_workers": workers,
                "seed": self.seed, "shuffle": self.shuffle, "shuffle_buffer": self.shuffle_buffer,
                "remainder": self.remainder, "total_samples": self.index.total_samples}

    def _generate(self, cur: dict[str, Any]) -> Iterator[Any]:
        sizes = [s.samples for s in self.index.shards]
        order = shard_order(len(sizes), self.seed, cur["epoch"], self.shuffle)
        span = worker_span(sum(sizes), self.rank, self.world_size, cur["worker"], cur["num_workers"], self.remainder)
        runs, skipped, size = span_runs(span, order, sizes), cur["skipped"], self.shuffle_buffer
        if not self.shuffle or size <= 1:
            buffer, stream = [], self._stream(runs, skipped, cur["yielded"])
            for _, key, data in stream:
                cur["yielded"] += 1
                yield self._output(key, data)
        else:
            rng = random.Random(f"shuffle/{self.seed}/{cur['epoch']}/{self.rank}/{cur['worker']}")
            n_inputs = sum(max(0, min(hi, skipped.get(i, hi)) - lo) for i, (_, lo, hi) in enumerate(runs))
            slots, taken, flush = simulate_buffer(n_inputs, size, rng, cur["yielded"])
            need = flush if flush is not None else slots
            stream, got, wanted = self._stream(runs, skipped, min(need, default=taken)), {}, set(need)
            for idx, key, data in stream if need else ():  # refill: what was in the buffer at the saved point
                if idx in wanted:
                    got[idx] = (key, data)
                if idx >= taken - 1:
                    break
            if len(got) < len(need):
                raise UsageError(f"cannot resume {self.url} exactly: {len(need) - len(got)} samples that were in the "
                                 "shuffle buffer could not be read again (a shard changed or went bad since)")
            buffer = [got[i] for i in need]
            for _, key, data in stream if flush is None else ():
                if len(buffer) < size:  # filling
                    buffer.append((key, data))
                    continue
                slot = rng.randrange(size)  # full: the new sample takes a random slot, whose sample comes out
                out, buffer[slot] = buffer[slot], (key, data)
                cur["yielded"] += 1
                yield self._output(*out)
            if flush is None:
                rng.shuffle(buffer)
        for key, data in buffer:  # input exhausted: what is left in the buffer, in shuffled order
            cur["yielded"] += 1
            yield self._output(key, data)
        cur["done"] = True

    def _output(self, key: str, data: bytes) -> Any:
        sample = decode(self.format, data) if self.decode else {"key": key, "data": data}
        return (key, sample) if self.with_keys else sample

    def _stream(self, runs: list[Run], skipped: dict[int, int], start: int) -> Iterator[tuple[int, str, bytes]]:
        """(input index, key, bytes) of the worker's samples from input index `start` on. A shard
        failing in skip mode records where its run stopped: later offsets of that run are absent."""
        idx = 0
        self._clients()
        for r, (shard, lo, hi) in enumerate(runs):
            stop = min(hi, skipped.get(r, hi))
            if idx + max(0, stop - lo) <= start:
                idx += max(0, stop - lo)
                continue
            at = lo + (start - idx if start > idx else 0)
            idx += at - lo
            self._prefetch(runs[r + 1:])
            try:
                for key, data in self._read(shard, at, stop):
                    yield idx, key, data
                    idx, at = idx + 1, at + 1
            except ShardError as exc:
                if self.on_corrupt == "error":
                    raise
                skipped[r] = at
                self.skipped_shards += 1
                log.warning("skipping the rest of a shard (on_corrupt='skip'): %s", exc)

    def _read(self, shard: int, first: int, stop: int) -> Iterator[tuple[str, bytes]]:
        info = self.index.shards[shard]
        url = shard_url(self.url, info.name)
        offset = 0
        with self._open(info) as handle:
            try:
                for member, data in iter_members(handle):
                    if offset >= stop:
                        return
                    if offset >= first:
                        key, want = member.split(".", 1)[0], sample_key(info.first_sample + offset)
                        if key != want:
                            raise CorruptShardError(info.name, url, f"member {member} where sample {want} belongs")
                        yield key, data
                    offset += 1
            except (tarfile.TarError, OSError, EOFError) as exc:
                raise CorruptShardError(info.name, url, f"unreadable tar after {offset} samples ({exc})") from None
        if offset < stop:
            raise CorruptShardError(info.name, url, f"has {offset} samples where index.json says {info.samples}")

    def _clients(self) -> None:
        if self._pid != os.getpid():  # first use in this process (a DataLoader worker): its own clients and threads
            self._pid, self._fs, self._verified = os.getpid(), open_dataset(self.url)[0], set()
            self._cache = None if self.local else ShardCache(self.cache_dir, self.cache_limit_bytes,
                                                             prefetch_shards=self.prefetch_shards)

    def _open(self, info: Any) -> IO[bytes]:
        path = shard_url(self._root, info.name)
        if self._cache is not None:
            return self._cache.open(self._fs, path, info.name, info.bytes, info.sha256)
        try:  # O_NONBLOCK: a FIFO in a shard's place must not hang the open
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            raise MissingShardError(info.name, path) from None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # a directory, or a device that never ends
            os.close(fd)
            raise CorruptShardError(info.name, path, "is not a regular file")
        handle = os.fdopen(fd, "rb")
        why = self._verify_local(handle, st.st_size, info)
        if why:
            handle.close()
            raise CorruptShardError(info.name, path, why)
        return handle

    def _verify_local(self, handle: IO[bytes], size: int, info: Any) -> str:
        """Why a local shard does not match index.json, or '': checked on its first use in this
        process (unless verify_local=False), by size first, so a huge file is not read to the end."""
        if not self.verify_local or info.name in self._verified:
            return ""
        why = mismatch(size, "", info.bytes, info.sha256, SOURCE) if size != info.bytes else \
            verify_file(handle, info.bytes, info.sha256, SOURCE)
        if not why:
            self._verified.add(info.name)
            handle.seek(0)
        return why

    def _prefetch(self, next_runs: list[Run]) -> None:
        if self._cache is None or not self.prefetch_shards:
            return
        shards = list(dict.fromkeys(shard for shard, _, _ in next_runs))[: self.prefetch_shards]
        infos = [self.index.shards[s] for s in shards]
        self._cache.prefetch(self._fs, [(shard_url(self._root, i.name), i.name, i.bytes, i.sha256) for i in infos])

    def __getstate__(self) -> dict[str, Any]:  # spawn-started workers: no clients, threads or caches across
        state = self.__dict__.copy()
        state.update(_pid=-1, _fs=None, _cache=None, _verified=set())
        return state
