"""Shard packing and streaming: keep the GPUs fed from object storage.

    trainready data pack SRC --out s3://bucket/ds        # tar shards + index.json (format.py)
    from trainready.data import ShardedDataset, LoaderState, worker_context
    ds = ShardedDataset("s3://bucket/ds", seed=0)         # disjoint per rank and worker, cached
    loader = StatefulDataLoader(ds, batch_size=8, num_workers=2,
                                multiprocessing_context=worker_context())  # forkserver, torch preloaded
    state = training_state(model, opt, position=pos, data=LoaderState(loader))  # exact resume

The dataset needs torch (and torchdata for StatefulDataLoader): they load on first use, so
`pack` and the index work without them.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {"ShardedDataset": "dataset", "ShardCache": "cache", "ShardError": "errors", "CorruptShardError": "errors",
         "MissingShardError": "errors", "CacheFullError": "errors", "worker_context": "workers",
         "pack": "pack", "load_index": "index_io", "DataIndex": "format"}

__all__ = [*_LAZY, "LoaderState"]


class LoaderState:
    """A stateful loader's position as checkpoint state: per rank (each rank reads its own samples),
    so trainready.store saves it for every rank rather than once from rank 0."""

    trainready_rank_local = True

    def __init__(self, loader: Any):
        self.loader = loader

    def state_dict(self) -> dict[str, Any]:
        return self.loader.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loader.load_state_dict(state)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
