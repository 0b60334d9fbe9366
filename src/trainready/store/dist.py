"""Who this process is in the job, and the few collectives checkpointing needs.

Checkpoint collectives run on their own gloo group, so a background save never interleaves
with the training job's NCCL traffic. Without a process group (one process) every collective
is the identity."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist


@dataclass
class DistContext:
    rank: int = 0
    world_size: int = 1
    node: int = 0
    local_rank: int = 0
    node_of_rank: list[int] = field(default_factory=lambda: [0])
    group: Any = None

    @classmethod
    def detect(cls, process_group: Any = None) -> DistContext:
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(process_group) == 1:
            return cls()
        rank, world = dist.get_rank(), dist.get_world_size()
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        node = int(os.environ.get("GROUP_RANK", rank // max(local_world, 1)))
        local_rank = int(os.environ.get("LOCAL_RANK", rank % max(local_world, 1)))
        group = dist.new_group(backend="gloo")
        nodes: list[Any] = [None] * world
        dist.all_gather_object(nodes, node, group=group)
        return cls(rank, world, node, local_rank, [int(n) for n in nodes], group)

    @property
    def node_leader(self) -> bool:
        return self.local_rank == 0

    @property
    def nodes(self) -> int:
        return len(set(self.node_of_rank))

    def release(self) -> None:
        if self.group is not None and dist.is_initialized():
            dist.destroy_process_group(self.group)
        self.group = None

    def barrier(self) -> None:
        if self.group is not None:
            dist.barrier(group=self.group)

    def all_gather(self, obj: Any) -> list[Any]:
        if self.group is None:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def broadcast(self, obj: Any) -> Any:
        if self.group is None:
            return obj
        box = [obj if self.rank == 0 else None]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    def all_true(self, flag: bool) -> bool:
        if self.group is None:
            return flag
        value = torch.tensor([1 if flag else 0], dtype=torch.int32)
        dist.all_reduce(value, op=dist.ReduceOp.MIN, group=self.group)
        return bool(value.item())

    def any_true(self, flag: bool) -> bool:
        return not self.all_true(not flag)
