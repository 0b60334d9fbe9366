"""Tensors in and out through torch.distributed.checkpoint (DCP), without ever unpickling.

- Writing: DCP's FileSystemWriter with fsync on, a stream wrapper that hashes every byte as it
  is written (no second read for checksums), and, on several nodes, a planner that writes each
  replicated tensor once per node so every node's hot tier can restore its own ranks. The
  tensor index is produced twice, per node: `tensors.json` (ours, read back) and DCP's pickled
  `.metadata` (written for other tools, never read by trainready).
- Reading: DCP's planner and FileSystemReader, except that the metadata comes from the
  validated `tensors.json` (see tensor_index; checkpoints that predate it: `.metadata` decoded as
  data) and each tensor record is decoded by tensor_records instead of torch.load. Data files are
  opened without following symlinks, and every record must lie inside its file.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import io
import os
import pickle
import stat
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.filesystem import FileSystem, FileSystemReader, FileSystemWriter

from trainready.io import HashingWriter, file_mode, read_regular

from .errors import CheckpointError
from .tensor_index import DCP_METADATA, TENSOR_INDEX_JSON, TensorIndex, TensorIndexError, legacy_index
from .tensor_records import RecordError, read_record

# Files written in parallel per rank (measured best at 4 even on 2 cores: the threads mostly wait
# on the disk). Each thread hashes what it writes, so the checksum costs
# no extra pass and (hashlib releases the GIL) overlaps with the other thread's disk writes.
WRITE_THREADS = 4
_NO_DIST_WARNING = "torch.distributed is disabled"


@functools.cache
def _quiet_single_process() -> None:
    """We pass no_dist deliberately for single-process use and DCP warns about it on every call: that one
    warning is silenced, on the first single-process call rather than on import (importing us changes nothing).
    Not warnings.catch_warnings() around each call: it swaps the process-wide filters, which is unsafe while a
    background save runs in another thread."""
    warnings.filterwarnings("ignore", message=_NO_DIST_WARNING, category=UserWarning)


class _HashingFileSystem(FileSystem):
    """Records (sha256, size) of every file DCP writes, keyed by file name; files are created with our mode."""

    def __init__(self) -> None:
        super().__init__()
        self.digests: dict[str, tuple[str, int]] = {}
        self._lock = threading.Lock()

    @contextmanager
    def create_stream(self, path: Any, mode: str) -> Iterator[io.IOBase]:
        if "w" not in mode:
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, file_mode())
        with os.fdopen(fd, "wb") as raw:
            stream = HashingWriter(raw)
            yield stream  # type: ignore[misc]
            raw.flush()
        with self._lock:
            self.digests[Path(path).name] = (stream.hexdigest(), stream.size)


class _Writer(FileSystemWriter):
    """Writes the data files; the index files are produced as bytes per node, written by the caller."""

    def __init__(self, path: Path, node_of_rank: list[int] | None):
        super().__init__(path, single_file_per_rank=True, sync_files=True, thread_count=WRITE_THREADS)
        self.fs = _HashingFileSystem()
        self.node_of_rank = node_of_rank or [0]
        self.node_index: dict[int, dict[str, bytes]] = {}

    def finish(self, metadata: Any, results: list[list[Any]]) -> None:
        from torch.distributed.checkpoint.filesystem import CURRENT_DCP_VERSION

        metadata.version = CURRENT_DCP_VERSION
        metadata.storage_meta = self.storage_meta()
        everything = {w.index: w.storage_data for writes in results for w in writes}
        # Each node's own index: the global one, pointing at that node's copy of every item it
        # wrote (replicated tensors exist once per node). Node 0's is also a valid global index.
        for node in sorted(set(self.node_of_rank)):
            storage = dict(everything)
            for rank, writes in enumerate(results):
                if rank < len(self.node_of_rank) and self.node_of_rank[rank] == node:
                    storage.update({w.index: w.storage_data for w in writes})
            node_md = copy.copy(metadata)
            node_md.storage_data = storage
            self.node_index[node] = {DCP_METADATA: pickle.dumps(node_md),
                                     TENSOR_INDEX_JSON: TensorIndex.from_metadata(node_md).to_bytes()}


class _NodeLocalPlanner(DefaultSavePlanner):
    """Dedups replicated tensors within each node instead of across the job (private DCP API,
    used only on more than one node)."""

    def __init__(self, node_of_rank: list[int]):
        super().__init__()
        self.node_of_rank = node_of_rank

    def _create_global_plan(self, all_plans: list[Any]) -> tuple[list[Any], Any]:
        from torch.distributed.checkpoint._dedup_save_plans import dedup_save_plans

        global_plans, metadata = super()._create_global_plan(all_plans)
        per_node = list(all_plans)
        for node in sorted(set(self.node_of_rank)):
            ranks = [r for r, n in enumerate(self.node_of_rank) if n == node]
            for rank, plan in zip(ranks, dedup_save_plans([all_plans[r] for r in ranks]), strict=True):
                per_node[rank] = dataclasses.replace(plan, planner_data=global_plans[rank].planner_data)
        return per_node, metadata


@dataclasses.dataclass
class WrittenTensors:
    files: dict[str, tuple[str, int]]          # this rank's data files: name -> (sha256, size)
    node_index: dict[int, dict[str, bytes]]    # coordinator only: node -> {index file name: bytes}


def save_tensors(tensors: dict[str, torch.Tensor], directory: Path, process_group: Any,
                 node_of_rank: list[int] | None) -> WrittenTensors:
    """Write this rank's tensors (collective over `process_group`)."""
    writer = _Writer(directory, node_of_rank)
    multi_node = node_of_rank is not None and len(set(node_of_rank)) > 1
    planner = _NodeLocalPlanner(node_of_rank) if multi_node else DefaultSavePlanner()
    if process_group is None:
        _quiet_single_process()
    dcp.save(tensors, storage_writer=writer, planner=planner, process_group=process_group,
             no_dist=process_group is None)
    return WrittenTensors(dict(writer.fs.digests), writer.node_index)


# ---- reading --------------------------------------------------------------------------------

MAX_INDEX_BYTES = 256 << 20


def read_index(directory: Path, listed: set[str] | None = None) -> TensorIndex:
    """The checkpoint's tensor index: tensors.json, or for an older checkpoint `.metadata` decoded
    as data. Never unpickles. `listed`: the files the manifest vouches for (sizes checked before
    loading); the index and every data file it names must be among them. CheckpointError names
    the file and what is wrong with it."""
    json_path, legacy_path = directory / TENSOR_INDEX_JSON, directory / DCP_METADATA
    if listed is None:
        path = json_path if os.path.lexists(json_path) else legacy_path
    else:
        path = json_path if TENSOR_INDEX_JSON in listed else legacy_path
        if path.name not in listed:
            raise CheckpointError(f"{directory.name}: the manifest lists no tensor index ({TENSOR_INDEX_JSON})")
    try:
        data = read_regular(path, MAX_INDEX_BYTES)
        index = TensorIndex.from_bytes(data) if path is json_path else legacy_index(data)
    except FileNotFoundError:
        raise CheckpointError(f"{directory.name} has no tensor index ({TENSOR_INDEX_JSON})") from None
    except (TensorIndexError, OSError) as exc:
        raise CheckpointError(f"{directory.name}/{path.name} is not a valid tensor index: {exc}") from None
    unlisted = sorted(index.files() - listed) if listed is not None else []
    if unlisted:
        raise CheckpointError(f"{directory.name}/{path.name} names {unlisted[0]}, which the manifest does not list")
    _check_ranges(directory, index)
    return index


def _check_ranges(directory: Path, index: TensorIndex) -> None:
    """Every record lies inside a regular file of the checkpoint directory."""
    sizes: dict[str, int] = {}
    for name in index.files():
        try:
            st = os.lstat(directory / name)
        except OSError:
            raise CheckpointError(f"{directory.name}: the tensor index names {name}, which is missing") from None
        if not stat.S_ISREG(st.st_mode):
            raise CheckpointError(f"{directory.name}/{name} is not a regular file")
        sizes[name] = st.st_size
    for entry in index.storage:
        if entry.at + entry.length > sizes[entry.file]:
            raise CheckpointError(f"{directory.name}: the tensor index places {entry.fqn} at bytes {entry.at}.."
                                  f"{entry.at + entry.length} of {entry.file}, which has {sizes[entry.file]}")


class _Region(io.RawIOBase):
    """A read-only, seekable view of bytes [start, start + length) of a file descriptor."""

    def __init__(self, fd: int, start: int, length: int):
        super().__init__()
        self.fd, self.start, self.length, self.pos = fd, start, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.length}[whence]
        self.pos = min(max(0, base + offset), self.length)
        return self.pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        want = min(len(view), self.length - self.pos)
        done = 0
        while done < want:
            got = os.preadv(self.fd, [view[done:want]], self.start + self.pos + done)
            if got <= 0:
                break
            done += got
        self.pos += done
        return done


class _SafeReader(FileSystemReader):
    def __init__(self, path: Path, index: TensorIndex):
        super().__init__(path)
        self.index = index

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        from torch.distributed.checkpoint.metadata import StorageMeta

        return self.index.to_metadata(StorageMeta(load_id=self.load_id))

    def set_up_storage_reader(self, metadata: Any, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        super().set_up_storage_reader(metadata, is_coordinator, *args, **kwargs)
        # DCP plans reads from the coordinator's index; on several nodes each node holds its own
        # copy of replicated tensors, so every rank resolves locations from its node's index.
        self.storage_data = self.index.to_metadata().storage_data

    def read_data(self, plan: Any, planner: Any) -> Any:
        from torch.distributed._shard._utils import narrow_tensor_by_index
        from torch.distributed.checkpoint.planner import LoadItemType
        from torch.futures import Future

        per_file: dict[str, list[Any]] = {}
        for item in plan.items:
            if item.type == LoadItemType.BYTE_IO:
                raise CheckpointError("checkpoint holds pickled byte items; trainready never writes them and will not load them")
            per_file.setdefault(self.storage_data[item.storage_index].relative_path, []).append(item)
        for name, items in per_file.items():
            fd = os.open(Path(self.path) / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                for item in items:
                    info = self.storage_data[item.storage_index]
                    try:
                        tensor = read_record(_Region(fd, info.offset, info.length))
                    except RecordError as exc:
                        raise CheckpointError(f"{Path(self.path).name}/{name}: {item.storage_index.fqn}: {exc}") from None
                    tensor = narrow_tensor_by_index(tensor, item.storage_offsets, item.lengths)
                    target = planner.resolve_tensor(item).detach()
                    if target.size() != tensor.size() or target.dtype != tensor.dtype:
                        raise CheckpointError(f"{Path(self.path).name}/{name}: {item.storage_index.fqn} holds "
                                              f"{tuple(tensor.size())} {tensor.dtype}, expected {tuple(target.size())} "
                                              f"{target.dtype}")
                    target.copy_(tensor)
                    planner.commit_tensor(item, target)
            finally:
                os.close(fd)
        future: Future = Future()
        future.set_result(None)
        return future


def load_tensors(tensors: dict[str, torch.Tensor], directory: Path, index: TensorIndex, process_group: Any) -> None:
    """Fill `tensors` (plain or DTensor; any sharding) in place from the checkpoint."""
    if process_group is None:
        _quiet_single_process()
    try:
        dcp.load(tensors, storage_reader=_SafeReader(directory, index), planner=DefaultLoadPlanner(),
                 process_group=process_group, no_dist=process_group is None)
    except BaseException as exc:
        cause = dcp_cause(exc)
        if cause is exc:
            raise
        raise cause if isinstance(cause, CheckpointError) else CheckpointError(
            f"{directory.name}: {type(cause).__name__}: {str(cause).splitlines()[0][:300]}") from None


def dcp_cause(exc: BaseException) -> BaseException:
    """The first rank's own error inside DCP's CheckpointException (which says only "ranks: [0]")."""
    for cause, _trace in getattr(exc, "failures", {}).values():
        if isinstance(cause, BaseException):
            return cause
    return exc
