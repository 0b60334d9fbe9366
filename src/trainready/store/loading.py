"""Load a committed hot-tier checkpoint into live state objects.

The saved JSON skeleton drives the structure; tensors are read by DCP into the caller's own
tensors (keeping device and sharding: this is what makes resharding work) and, for entries the
live state lacks, into CPU tensors allocated from the checkpoint's index."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from trainready.dist import DistContext
from trainready.io import parse_json, read_regular

from . import codec
from .dcp_io import load_tensors, read_index
from .errors import CheckpointError
from .snapshot import STATE_JSON, is_rank_local, rank_json, state_dicts

MAX_STATE_BYTES = 256 << 20


def _read_json(path: Path, listed: set[str] | None) -> Any:
    """A JSON file of the checkpoint, or None when absent (or, with `listed`, not vouched for by
    the manifest). Never follows a symlink, never blocks on a FIFO, never reads past a bound."""
    if listed is not None and path.name not in listed:
        return None
    try:
        data = read_regular(path, MAX_STATE_BYTES)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CheckpointError(f"{path.name} cannot be read: {exc.strerror or exc}") from None
    try:
        return parse_json(data)
    except (ValueError, RecursionError) as exc:
        raise CheckpointError(f"{path.name} is not valid JSON: {str(exc)[:200]}") from None


def load_into(state: dict[str, Any], directory: Path, ctx: DistContext, group: Any = None,
              listed: set[str] | None = None) -> list[str]:
    """Load every object in `state` from `directory` (collectives on `group`, default: the
    control group); returns notes (e.g. RNG kept for new ranks). `listed`: the files the manifest
    vouches for on this node; nothing else is read."""
    notes: list[str] = []
    saved = _read_json(directory / STATE_JSON, listed)
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
    index = read_index(directory, listed)
    shapes = index.shapes()
    targets = {}
    for key in wanted:
        if key in live_tensors:
            targets[key] = live_tensors[key]
        elif key in shapes:
            size, dtype = shapes[key]
            _check_stored(index, key, size.numel() * torch.empty(0, dtype=dtype).element_size())
            targets[key] = torch.empty(size, dtype=dtype)
        else:
            raise CheckpointError(f"tensor {key} is referenced by {STATE_JSON} but absent from the tensor index")
    load_tensors(targets, directory, index, ctx.control if group is None else group)
    for name, obj in shared.items():
        _apply(name, obj, codec.join(saved[name], targets))
    local = {n: o for n, o in state.items() if is_rank_local(o)}
    if local:
        mine = _read_json(directory / rank_json(ctx.rank), listed)
        if mine is None:
            notes.append(f"rank {ctx.rank} has no saved {', '.join(local)} (world size changed): kept its own")
        else:
            for name, obj in local.items():
                if name in mine:
                    _apply(name, obj, codec.join(mine[name], {}))
    return notes


def _check_stored(index: Any, key: str, nbytes: int) -> None:
    """An entry the live state lacks is allocated from the index: never more than the checkpoint
    stores for it (an index could declare a huge tensor backed by a few bytes)."""
    stored = sum(e.length for e in index.storage if e.fqn == key)
    if nbytes > stored:
        raise CheckpointError(f"the tensor index declares {nbytes} bytes for {key} but stores {stored}")


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
