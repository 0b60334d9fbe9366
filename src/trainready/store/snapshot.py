"""A save in two halves: `take_snapshot` (on the training thread: state dicts split into tensors
and JSON, tensors copied to host memory when saving in the background) and `write_hot`
(anywhere: DCP files, JSON files, manifest, atomic rename on every node's hot tier)."""

from __future__ import annotations

import hashlib
import json
import platform
import shutil
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from trainready.dist import DistContext
from trainready.io import dir_mode, fsync_dir, write_synced
from trainready.version import __version__

from . import codec
from .dcp_io import save_tensors
from .errors import BadStateError, CheckpointError, describe, raise_agreed
from .faults import fault_point
from .manifest import FileEntry, Manifest, checkpoint_name
from .tiers import HotTier, as_store_error

STATE_JSON = "state.json"


def rank_json(rank: int) -> str:
    return f"rank-{rank:05d}.json"


@dataclass
class Snapshot:
    step: int
    tensors: dict[str, torch.Tensor]
    skeleton: dict[str, Any]          # shared non-tensor state (identical on every rank)
    rank_skeleton: dict[str, Any]     # per-rank state (RNG), tensors inline
    metadata: dict[str, Any]
    started: float = field(default_factory=time.time)


def is_rank_local(obj: Any) -> bool:
    return bool(getattr(obj, "trainready_rank_local", False))


def state_dicts(state: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(state, dict) or not state:
        raise BadStateError("state must be a non-empty dict of name -> object with state_dict()/load_state_dict() "
                            "(or a plain dict); see trainready.store.training_state")
    out = {}
    for name, obj in state.items():
        if "/" in name:
            raise BadStateError(f"state name {name!r} contains '/'; use plain names such as 'model', 'optimizer'")
        if hasattr(obj, "state_dict"):
            out[name] = obj.state_dict()
        elif isinstance(obj, dict):
            out[name] = obj
        else:
            raise BadStateError(f"state['{name}'] is a {type(obj).__name__}: give an object with state_dict()/"
                                "load_state_dict() or a dict")
    return out


class Stager:
    """Host-memory copies of the tensors, reused across saves (at most one save is in flight)."""

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}

    def stage(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        staged, on_gpu = {}, False
        for key, tensor in tensors.items():
            local = tensor.to_local() if _is_dtensor(tensor) else tensor
            buf = self._buffers.get(key)
            if buf is None or buf.shape != local.shape or buf.dtype != local.dtype:
                buf = torch.empty(local.shape, dtype=local.dtype, pin_memory=local.is_cuda)
                self._buffers[key] = buf
            buf.copy_(local.detach(), non_blocking=local.is_cuda)
            on_gpu |= local.is_cuda
            staged[key] = _as_dtensor_like(tensor, buf) if _is_dtensor(tensor) else buf
        if on_gpu:
            torch.cuda.synchronize()
        return staged


def _is_dtensor(tensor: torch.Tensor) -> bool:
    return type(tensor).__name__ == "DTensor"


def _as_dtensor_like(template: Any, local: torch.Tensor) -> Any:
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(local, template.device_mesh, template.placements, run_check=False,
                              shape=template.shape, stride=template.stride())


def take_snapshot(step: int, state: dict[str, Any], metadata: dict[str, Any], stager: Stager | None) -> Snapshot:
    tensors: dict[str, torch.Tensor] = {}
    skeleton, rank_skeleton = {}, {}
    for name, sd in state_dicts(state).items():
        if is_rank_local(state[name]):
            rank_skeleton[name] = codec.split(sd, name, {}, inline=True)
        else:
            skeleton[name] = codec.split(sd, name, tensors)
    try:
        json.dumps(metadata)
    except (TypeError, ValueError) as exc:
        raise BadStateError(f"checkpoint metadata must be JSON: {exc}") from exc
    if stager is not None:
        tensors = stager.stage(tensors)
    fault_point("save.staged")
    return Snapshot(step, tensors, skeleton, rank_skeleton, dict(metadata))


def _versions() -> dict[str, str]:
    return {"trainready": __version__, "torch": torch.__version__, "python": platform.python_version(),
            "platform": sys.platform}


def write_hot(snap: Snapshot, hot: HotTier, ctx: DistContext, group: Any, run_id: str, generation: int,
              check_fence: Any) -> Manifest:
    """Write the snapshot on every node's hot tier and commit it everywhere; returns the manifest.
    Every collective runs on `group` (the writer's own, never the training thread's)."""
    name = checkpoint_name(snap.step, generation)
    tmp = hot.tmp_path(name)
    if ctx.node_leader:
        shutil.rmtree(tmp, ignore_errors=True)
    ctx.barrier(group)
    try:
        tmp.mkdir(parents=True, exist_ok=True, mode=dir_mode())
        # DCP: a failure on any rank is raised on every rank
        written = save_tensors(snap.tensors, tmp, group, ctx.node_of_rank if ctx.nodes > 1 else None)
    except BaseException as exc:
        raise store_error(exc, hot.root) from None
    mine = dict(written.files)
    shared = ctx.broadcast(json.dumps(snap.skeleton, allow_nan=False).encode(), group)
    node_index = ctx.broadcast(written.node_index, group)
    error: CheckpointError | None = None
    try:
        if ctx.node_leader:
            mine.update(_write_file(tmp, STATE_JSON, shared))
            for index_name, data in node_index[ctx.node].items():  # tensors.json and DCP's .metadata
                mine.update(_write_file(tmp, index_name, data))
        mine.update(_write_file(tmp, rank_json(ctx.rank), json.dumps(snap.rank_skeleton, allow_nan=False).encode()))
        fault_point("hot.data_written")
        if ctx.node_leader:
            fsync_dir(tmp)
    except OSError as exc:
        error = as_store_error(exc, hot.root)
    # every rank's files are durable past this point (or every rank learns which one failed)
    gathered = ctx.all_gather((ctx.node, mine, describe(error)), group)
    raise_agreed(error, [g[2] for g in gathered])
    manifest = ctx.broadcast(_manifest(snap, [(n, f) for n, f, _ in gathered], ctx, run_id, generation), group)
    if ctx.node_leader:
        try:
            check_fence()
            hot.commit(tmp, name, manifest)
        except CheckpointError as exc:
            error = exc
    raise_agreed(error, ctx.all_gather(describe(error), group))
    fault_point("hot.committed")
    return manifest


def store_error(exc: BaseException, where: Any) -> BaseException:
    """Our error for a failed DCP write: ENOSPC anywhere becomes StorageFullError."""
    if isinstance(exc, CheckpointError):
        return exc
    if isinstance(exc, OSError):
        return as_store_error(exc, where)
    for cause, _trace in getattr(exc, "failures", {}).values():  # DCP's CheckpointException: every rank's error
        if isinstance(cause, OSError):
            return as_store_error(cause, where)
    if not isinstance(exc, Exception) and type(exc).__name__ != "CheckpointException":
        return exc  # KeyboardInterrupt, SystemExit: not ours to rename
    return CheckpointError(f"writing tensors failed: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}")


def _write_file(directory: Any, name: str, data: bytes) -> dict[str, tuple[str, int]]:
    write_synced(directory / name, data)
    return {name: (hashlib.sha256(data).hexdigest(), len(data))}


def _manifest(snap: Snapshot, gathered: list[tuple[int, dict[str, tuple[str, int]]]], ctx: DistContext,
              run_id: str, generation: int) -> Manifest | None:
    if ctx.rank != 0:
        return None
    node_files: dict[int, dict[str, FileEntry]] = {}
    for node, files in gathered:
        for path, (digest, size) in files.items():
            node_files.setdefault(node, {})[path] = FileEntry(path=path, size=size, sha256=digest)
    files = dict(node_files[0])
    for node in sorted(node_files):
        for path, entry in node_files[node].items():
            files.setdefault(path, entry)
    return Manifest(
        step=snap.step, run_id=run_id, generation=generation, world_size=ctx.world_size, nodes=ctx.nodes,
        created_unix=time.time(), save_seconds=round(time.time() - snap.started, 3), versions=_versions(),
        metadata=snap.metadata, files=sorted(files.values(), key=lambda e: e.path),
        node_files={n: sorted(f.values(), key=lambda e: e.path) for n, f in sorted(node_files.items())})
