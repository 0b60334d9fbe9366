"""Who this process is in the job, the groups ranks agree on, and the one signal path.

- `identity()`: rank, world size, local rank and node, from torch.distributed when it is
  initialized, else from torchrun's variables; needs no torch.
- `DistContext.acquire()` / `release()`: one context per process, shared by every user (the
  session, the checkpoint manager). `control` is the gloo group on which every decision all ranks
  must share (save now? skip? stop?) is agreed, from the training thread only. `worker_group(name)`
  gives a background worker (the checkpoint writer) a gloo group of its own, so its collectives
  never interleave with the training thread's: two threads on one group is how a job hangs.
  Without a process group (one process) every collective is the identity.
- `STOP`: SIGTERM, SIGINT and SIGHUP become one stop request (which signal, when). A repeated
  SIGTERM (torchrun and a process-group kill both send one) is absorbed; a second Ctrl-C stops
  at once. Everything in trainready that reacts to a stop reads it here.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from dataclasses import dataclass, field
from typing import Any

from trainready.clock import SYSTEM_CLOCK, Clock

log = logging.getLogger("trainready")


@dataclass(frozen=True)
class Identity:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    node: int = 0


def identity() -> Identity:
    """This process's place in the job (torch.distributed if initialized, else torchrun's variables)."""
    world, rank = int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("RANK", 0))
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            world, rank = dist.get_world_size(), dist.get_rank()
    except ImportError:
        pass
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    local_rank = int(os.environ.get("LOCAL_RANK", rank % max(local_world, 1)))
    node = int(os.environ.get("GROUP_RANK", rank // max(local_world, 1)))
    return Identity(rank, world, local_rank, local_world, node)


# ---- distributed context -----------------------------------------------------------------------

_lock = threading.Lock()
_current: DistContext | None = None


@dataclass
class DistContext:
    rank: int = 0
    world_size: int = 1
    node: int = 0
    local_rank: int = 0
    node_of_rank: list[int] = field(default_factory=lambda: [0])
    control: Any = None           # gloo group: decisions, training thread only
    _workers: dict[str, Any] = field(default_factory=dict)
    _world: Any = None            # the default group this context was built on
    _users: int = 0

    @classmethod
    def acquire(cls, process_group: Any = None) -> DistContext:
        """The process's context (built collectively on first use); pair with release()."""
        global _current
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(process_group) == 1:
            return cls(_users=1)
        with _lock:
            if _current is None or _current._world is not dist.group.WORLD or _current.control is None:
                _current = cls._build()
            _current._users += 1
            return _current

    @classmethod
    def _build(cls) -> DistContext:
        import torch.distributed as dist

        me = identity()
        control = dist.new_group(backend="gloo")
        nodes: list[Any] = [None] * me.world_size
        dist.all_gather_object(nodes, me.node, group=control)
        return cls(me.rank, me.world_size, me.node, me.local_rank, [int(n) for n in nodes], control,
                   _world=dist.group.WORLD)

    @property
    def node_leader(self) -> bool:
        return self.local_rank == 0

    @property
    def nodes(self) -> int:
        return len(set(self.node_of_rank))

    @property
    def distributed(self) -> bool:
        return self.control is not None

    def worker_group(self, name: str) -> Any:
        """A gloo group for one background worker. Creating it is collective: call it on the
        training thread, on every rank, in the same order."""
        if self.control is None:
            return None
        if name not in self._workers:
            import torch.distributed as dist

            self._workers[name] = dist.new_group(backend="gloo")
        return self._workers[name]

    def retain(self) -> DistContext:
        """One more user of a context someone passed in (a session hands its own to its checkpoint manager);
        pair with release(), as after acquire()."""
        with _lock:
            self._users += 1
        return self

    def release(self) -> None:
        """Drop one user; the last one destroys the groups (no gloo work may outlive the interpreter)."""
        global _current
        import torch.distributed as dist

        with _lock:
            self._users -= 1
            if self._users > 0 or self.control is None:
                return
            if dist.is_initialized() and self._world is dist.group.WORLD:
                for group in [*self._workers.values(), self.control]:
                    dist.destroy_process_group(group)
            self._workers.clear()
            self.control = None
            if _current is self:
                _current = None

    # ---- collectives (group=None: the control group) ------------------------------------------

    def _group(self, group: Any) -> Any:
        return self.control if group is None else group

    def barrier(self, group: Any = None) -> None:
        if self.control is not None:
            import torch.distributed as dist

            dist.barrier(group=self._group(group))

    def all_gather(self, obj: Any, group: Any = None) -> list[Any]:
        if self.control is None:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self._group(group))
        return out

    def broadcast(self, obj: Any, group: Any = None) -> Any:
        if self.control is None:
            return obj
        import torch.distributed as dist

        box = [obj if self.rank == 0 else None]
        dist.broadcast_object_list(box, src=0, group=self._group(group))
        return box[0]

    def any_true(self, *flags: bool, group: Any = None) -> tuple[bool, ...]:
        """For each flag, whether it is true on any rank (one all-reduce for all of them)."""
        if self.control is None:
            return tuple(bool(f) for f in flags)
        import torch
        import torch.distributed as dist

        values = torch.tensor([1 if f else 0 for f in flags], dtype=torch.int32)
        dist.all_reduce(values, op=dist.ReduceOp.MAX, group=self._group(group))
        return tuple(bool(v) for v in values.tolist())


# ---- the one signal path -----------------------------------------------------------------------

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class StopRequest:
    """A stop asked for by a signal: which one (`signum`) and when (`at`, monotonic)."""

    def __init__(self, clock: Clock = SYSTEM_CLOCK) -> None:
        self.signum: int | None = None
        self.at: float | None = None
        self.clock = clock  # `at` is read against the same clock by whoever owns the grace period
        self._installed: set[int] = set()

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def install(self, signals: tuple[int, ...] = STOP_SIGNALS) -> None:
        """Route these signals to the stop request (idempotent; main thread only, as Python requires)."""
        for sig in signals:
            if sig not in self._installed:
                signal.signal(sig, self._handle)
                self._installed.add(sig)

    def request(self, signum: int) -> None:
        """Record a stop as if `signum` had arrived (another rank was signalled: stop together)."""
        if self.signum is None:
            self.signum, self.at = int(signum), self.clock.monotonic()

    def reset(self) -> None:
        """Forget a stop request and restore default handlers (tests, or a new job in this process)."""
        for sig in self._installed:
            signal.signal(sig, signal.SIG_DFL)
        self._installed.clear()
        self.signum = self.at = None

    def _handle(self, signum: int, _frame: Any) -> None:
        if self.signum is not None:
            if signum == signal.SIGINT and self.signum == signal.SIGINT:
                signal.signal(signum, signal.SIG_DFL)  # a second Ctrl-C: stop now, without the checkpoint
                os.kill(os.getpid(), signum)
            return
        self.request(signum)
        log.warning("signal %s: saving a checkpoint after this step, then stopping", signal.Signals(signum).name)


STOP = StopRequest()
