"""Tensors in and out through torch.distributed.checkpoint (DCP), safely.

- Writing: DCP's FileSystemWriter with fsync on, a stream wrapper that hashes every byte as it
  is written (no second read for checksums), and, on several nodes, a planner that writes each
  replicated tensor once per node so every node's hot tier can restore its own ranks.
- Reading: DCP's FileSystemReader, except that its pickled tensor index (`.metadata`) is read
  by an unpickler that only builds DCP's own metadata classes, and byte items (which DCP
  loads with `torch.load(weights_only=False)`) are refused: we never write them.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import io
import os
import pickle
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

from .errors import CheckpointError

TENSOR_INDEX = ".metadata"
# Files written in parallel per rank (measured best at 4 even on 2 cores: the threads mostly wait
# on the disk). Each thread hashes what it writes, so the checksum costs
# no extra pass and (hashlib releases the GIL) overlaps with the other thread's disk writes.
WRITE_THREADS = 4
# We pass no_dist deliberately for single-process use; DCP warns about it on every call.
warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)


class _HashingStream(io.RawIOBase):
    def __init__(self, raw: io.BufferedWriter):
        self.raw, self.digest, self.size = raw, hashlib.sha256(), 0

    def write(self, data: Any) -> int:  # type: ignore[override]
        view = memoryview(data).cast("B")
        self.digest.update(view)
        self.size += len(view)
        return self.raw.write(view)

    def tell(self) -> int:
        return self.raw.tell()

    def flush(self) -> None:
        self.raw.flush()

    def fileno(self) -> int:
        return self.raw.fileno()

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False


class _HashingFileSystem(FileSystem):
    """Records (sha256, size) of every file DCP writes, keyed by file name."""

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
        with Path(path).open(mode) as raw:
            stream = _HashingStream(raw)
            yield stream  # type: ignore[misc]
            raw.flush()
        with self._lock:
            self.digests[Path(path).name] = (stream.digest.hexdigest(), stream.size)


class _Writer(FileSystemWriter):
    def __init__(self, path: Path, node_of_rank: list[int] | None):
        super().__init__(path, single_file_per_rank=True, sync_files=True, thread_count=WRITE_THREADS)
        self.fs = _HashingFileSystem()
        self.node_of_rank = node_of_rank
        self.node_index: dict[int, bytes] = {}

    def finish(self, metadata: Any, results: list[list[Any]]) -> None:
        super().finish(metadata, results)
        if not self.node_of_rank or len(set(self.node_of_rank)) < 2:
            return
        # Each node's own tensor index: the global one, pointing at that node's copy of every
        # item it wrote (replicated tensors exist once per node).
        for node in sorted(set(self.node_of_rank)):
            storage = dict(metadata.storage_data)
            for rank, writes in enumerate(results):
                if self.node_of_rank[rank] == node:
                    storage.update({w.index: w.storage_data for w in writes})
            node_md = copy.copy(metadata)
            node_md.storage_data = storage
            self.node_index[node] = pickle.dumps(node_md)
        # Node 0's own index is also a valid global index (the archive keeps node 0's copy).
        tmp = Path(self.path) / f"{TENSOR_INDEX}.tmp"
        with open(tmp, "wb") as handle:
            handle.write(self.node_index[0])
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, Path(self.path) / TENSOR_INDEX)


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
    files: dict[str, tuple[str, int]]   # this rank's files: name -> (sha256, size)
    node_index: dict[int, bytes]         # coordinator only, several nodes: node -> tensor index


def save_tensors(tensors: dict[str, torch.Tensor], directory: Path, process_group: Any,
                 node_of_rank: list[int] | None) -> WrittenTensors:
    writer = _Writer(directory, node_of_rank)
    multi_node = node_of_rank is not None and len(set(node_of_rank)) > 1
    planner = _NodeLocalPlanner(node_of_rank) if multi_node else DefaultSavePlanner()
    dcp.save(tensors, storage_writer=writer, planner=planner, process_group=process_group,
             no_dist=process_group is None)
    data_files = {k: v for k, v in writer.fs.digests.items() if k.endswith(".distcp")}  # .metadata is hashed apart
    return WrittenTensors(data_files, writer.node_index)


# ---- reading --------------------------------------------------------------------------------

_META_MODULES = {"torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem"}
_ALLOWED = {("torch", "Size"), ("torch.serialization", "_get_layout"), ("pathlib", "PosixPath"),
            ("pathlib", "PurePosixPath"), ("collections", "OrderedDict")}


class _TensorIndexUnpickler(pickle.Unpickler):
    """Builds DCP's metadata dataclasses, torch dtypes and nothing else."""

    def find_class(self, module: str, name: str) -> Any:
        if module in _META_MODULES and not name.startswith("__"):
            found = super().find_class(module, name)
            if isinstance(found, type):
                return found
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), (torch.dtype, torch.memory_format, torch.layout)):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"tensor index refers to {module}.{name}, which a checkpoint index never holds")


def read_tensor_index(path: Path) -> Any:
    with open(path, "rb") as handle:
        try:
            return _TensorIndexUnpickler(handle).load()
        except CheckpointError:
            raise
        except Exception as exc:
            raise CheckpointError(f"{path.name} is not a valid tensor index: {exc}") from exc


class _SafeReader(FileSystemReader):
    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        from torch.distributed.checkpoint.metadata import StorageMeta

        metadata = read_tensor_index(Path(self.path) / TENSOR_INDEX)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def set_up_storage_reader(self, metadata: Any, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        super().set_up_storage_reader(metadata, is_coordinator, *args, **kwargs)
        # DCP plans reads from the coordinator's index; on several nodes each node holds its own
        # copy of replicated tensors, so every rank resolves locations from its node's index.
        self.storage_data = read_tensor_index(Path(self.path) / TENSOR_INDEX).storage_data

    def read_data(self, plan: Any, planner: Any) -> Any:
        from torch.distributed.checkpoint.planner import LoadItemType

        if any(item.type == LoadItemType.BYTE_IO for item in plan.items):
            raise CheckpointError("checkpoint holds pickled byte items; trainready never writes them and will not load them")
        return super().read_data(plan, planner)


def tensor_shapes(directory: Path) -> dict[str, tuple[torch.Size, torch.dtype]]:
    """Key -> (shape, dtype) of every tensor in a checkpoint's index."""
    metadata = read_tensor_index(directory / TENSOR_INDEX)
    shapes = {}
    for key, item in metadata.state_dict_metadata.items():
        if hasattr(item, "size"):
            shapes[key] = (item.size, item.properties.dtype)
    return shapes


def load_tensors(tensors: dict[str, torch.Tensor], directory: Path, process_group: Any) -> None:
    """Fill `tensors` (plain or DTensor; any sharding) in place from the checkpoint."""
    dcp.load(tensors, storage_reader=_SafeReader(directory), planner=DefaultLoadPlanner(),
             process_group=process_group, no_dist=process_group is None)
