"""Load a committed hot-tier checkpoint into live state objects.

The saved JSON skeleton drives the structure; tensors are read by DCP into the caller's own
tensors (keeping device and sharding: this is what makes resharding work) and, for entries the
live state lacks, into CPU tensors allocated from the checkpoint's index."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from trainready.dist import DistContext

from . import codec
from .dcp_io import load_tensors, read_index
from .errors import CheckpointError
from .snapshot import STATE_JSON, is_rank_local, rank_json, state_dicts


def _read_json(path: Path) -> Any:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CheckpointError(f"{path.name} cannot be read: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as handle:
        try:
            return json.loads(handle.read())
        except ValueError as exc:
            raise CheckpointError(f"{path.name} is not valid JSON: {exc}") from None


def load_into(state: dict[str, Any], directory: Path, ctx: DistContext, group: Any = None) -> list[str]:
    """Load every object in `state` from `directory` (collectives on `group`, default: the
    control group); returns notes (e.g. RNG kept for new ranks)."""
    notes: list[str] = []
    saved = _read_json(directory / STATE_JSON)
    if not isinstance(saved, dict):
        raise CheckpointError(f"{STATE_JSON} missing or malformed")
    shared = {n: o for n, o in state.items() if not is_rank_local(o)}
    missing = sorted(set(shared) - set(saved))
    if missing:
        raise CheckpointError(f"checkpoint has no entry for {', '.join(missing)} (it holds {', '.join(sorted(saved))})")
    live_tensors: dict[str, torch.Tensor] = {}
    codec.split(state_dicts(shared), "", live_tensors)  # only to collect the live tensors
    live_tensors = {k[1:]: v for k, v in live_tensors.items()}
    wanted = [key for name in shared for key in codec.tensor_refs(saved[name])]
    index = read_index(directory)
    shapes = index.shapes()
    targets = {}
    for key in wanted:
        if key in live_tensors:
            targets[key] = live_tensors[key]
        elif key in shapes:
            size, dtype = shapes[key]
            targets[key] = torch.empty(size, dtype=dtype)
        else:
            raise CheckpointError(f"tensor {key} is referenced by {STATE_JSON} but absent from the tensor index")
    load_tensors(targets, directory, index, ctx.control if group is None else group)
    for name, obj in shared.items():
        _apply(name, obj, codec.join(saved[name], targets))
    local = {n: o for n, o in state.items() if is_rank_local(o)}
    if local:
        mine = _read_json(directory / rank_json(ctx.rank))
        if mine is None:
            notes.append(f"rank {ctx.rank} has no saved {', '.join(local)} (world size changed): kept its own")
        else:
            for name, obj in local.items():
                if name in mine:
                    _apply(name, obj, codec.join(mine[name], {}))
    return notes


def _apply(name: str, obj: Any, value: Any) -> None:
    try:
        if hasattr(obj, "load_state_dict"):
            obj.load_state_dict(value)
        else:
            obj.clear()
            obj.update(value)
    except CheckpointError:
        raise
    except Exception as exc:
        raise CheckpointError(f"state['{name}'].load_state_dict failed: {type(exc).__name__}: {exc}") from exc
