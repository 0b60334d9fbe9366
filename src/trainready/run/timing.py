"""Where a step's time goes: data wait, compute, optimizer, communication.

`with sess.step(tokens=n) as t:` starts the clock. `t.data(batch)` marks the batch as ready:
everything from the step's start (or the previous mark) to that call was spent waiting for
data, which is why `t.data(next(it))` measures the loader without wrapping it.
`with t.optimizer():` and `with t.comm():` time those regions; a DDP model passed to
`sess.watch(model)` reports its gradient all-reduce through a comm hook. Compute is the rest.

Two sources of time, named in every step record (`timing`):
* `host`: perf_counter around each mark (CPU, gloo). Work runs where the clock is read.
* `cuda-events`: a CUDA event recorded at each mark on the stream doing the work (the current,
  compute stream for data, regions and step ends; in the comm hook, the bucket's launch on the
  backward stream and its completion in the future's callback, which CUDA futures run on a
  stream made to wait for the NCCL stream), so the intervals are the GPU's. The events are read
  one step later (`SplitQueue`), after the next step was queued: the step is not serialised by
  a synchronize.
A part the script gives no way to measure (no `t.data()`, no `t.optimizer()`, more than one rank
and neither a watched DDP model nor `t.comm()`) is None, unknown; compute is then None too and
the time of compute plus the unknown parts is `unattributed_s`, never folded into compute.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Protocol

PARTS = ("data", "comm", "optimizer")


class Marks(Protocol):
    """Where a mark's time comes from: `record()` returns a handle, `elapsed_s(a, b)` the seconds
    between two handles once `wait(b)` returned. The seam the CUDA path is tested through."""

    source: str
    lagged: bool  # True: read a step later (asynchronous device work)

    def record(self) -> Any: ...
    def elapsed_s(self, a: Any, b: Any) -> float: ...
    def wait(self, handle: Any) -> None: ...
    def latest(self, handles: list[Any]) -> Any: ...


class HostMarks:
    source = "host"
    lagged = False

    def __init__(self, now: Callable[[], float] = time.perf_counter) -> None:
        self.now = now  # the session's clock, passed in

    def record(self) -> float:
        return self.now()

    def elapsed_s(self, a: float, b: float) -> float:
        return b - a

    def wait(self, handle: float) -> None:
        return None

    def latest(self, handles: list[float]) -> float:
        return max(handles)  # callbacks of a host backend may run on other threads, out of order


class CudaMarks:
    """torch.cuda.Event(enable_timing=True) recorded on the calling thread's current stream."""

    source = "cuda-events"
    lagged = True

    def __init__(self) -> None:
        import torch

        self._event = torch.cuda.Event

    def record(self) -> Any:
        event = self._event(enable_timing=True)
        event.record()
        return event

    def elapsed_s(self, a: Any, b: Any) -> float:
        return a.elapsed_time(b) / 1000.0  # milliseconds; works across streams of one device

    def wait(self, handle: Any) -> None:
        handle.synchronize()

    def latest(self, handles: list[Any]) -> Any:
        return handles[-1]  # recorded in stream order: NCCL runs one process group's collectives in order


@dataclass
class StepTimes:
    """A step's split. `step_s` is the time the split covers (host: inside `with sess.step()`;
    cuda-events: the compute stream from the step's start to its end). None = not measured."""

    step_s: float | None = None
    data_s: float | None = None
    optimizer_s: float | None = None
    comm_s: float | None = None  # exposed: explicit comm regions + the all-reduce tail after backward
    source: str = "host"

    def _known(self) -> list[float]:
        return [v for v in (self.data_s, self.optimizer_s, self.comm_s) if v is not None]

    @property
    def unmeasured(self) -> list[str]:
        return [p for p in PARTS if getattr(self, f"{p}_s") is None]

    @property
    def compute_s(self) -> float | None:
        if self.step_s is None or self.unmeasured:
            return None
        return max(0.0, self.step_s - sum(self._known()))

    @property
    def unattributed_s(self) -> float | None:
        """Compute plus the unmeasured parts, when some part is unmeasured (else None: all attributed)."""
        if self.step_s is None or not self.unmeasured:
            return None
        return max(0.0, self.step_s - sum(self._known()))


class CommWatch:
    """Times DDP's gradient buckets through a comm hook wrapping the default all-reduce.

    Buckets overlap backward, so only the tail is exposed: from the last bucket's launch (backward
    is done by then) to the last completion. With host marks on NCCL that would be
    enqueue-to-callback (near zero): the session uses CUDA events there."""

    def __init__(self, marks: Marks | None = None) -> None:
        self.marks: Marks = marks or HostMarks()
        self.launches: list[Any] = []
        self.done: list[Any] = []
        self.attached = False

    def attach(self, ddp_model: Any) -> bool:
        """Hook a DistributedDataParallel model; False (nothing hooked) for anything else: FSDP's
        register_comm_hook takes another hook signature, and its all-gathers are not hooked."""
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        from torch.nn.parallel import DistributedDataParallel

        if not isinstance(ddp_model, DistributedDataParallel):
            return False
        marks = self.marks

        def hook(state, bucket):  # noqa: ANN001, ANN202 - DDP rejects string annotations
            self.launches.append(marks.record())
            fut = default_hooks.allreduce_hook(state, bucket)

            def finished(f: Any) -> Any:
                self.done.append(marks.record())  # on CUDA: a stream that waits for the NCCL work
                return f.value()

            return fut.then(finished)

        ddp_model.register_comm_hook(None, hook)
        self.attached = True
        return True

    def take(self) -> tuple[Any, Any] | None:
        """(last launch, last completion) of this step's buckets, or None when none ran."""
        pair = (self.marks.latest(self.launches), self.marks.latest(self.done)) if self.launches and self.done else None
        self.launches.clear()
        self.done.clear()
        return pair


@dataclass
class PendingSplit:
    """A finished step's marks; `resolve()` turns them into StepTimes (waits for the device)."""

    marks: Marks
    begin: Any
    end: Any
    spans: list[tuple[str, Any, Any]]
    tail: tuple[Any, Any] | None
    measured: frozenset[str]

    def resolve(self) -> StepTimes:
        m = self.marks
        m.wait(self.end)
        if self.tail is not None:
            m.wait(self.tail[1])
        parts: dict[str, float | None] = {p: sum(m.elapsed_s(a, b) for kind, a, b in self.spans if kind == p)
                                          for p in PARTS}
        if self.tail is not None:
            parts["comm"] = (parts["comm"] or 0.0) + max(0.0, m.elapsed_s(*self.tail))
        for p in PARTS:
            if p not in self.measured:
                parts[p] = None
        return StepTimes(step_s=max(0.0, m.elapsed_s(self.begin, self.end)), data_s=parts["data"],
                         optimizer_s=parts["optimizer"], comm_s=parts["comm"], source=m.source)


@dataclass
class FinishedStep:
    host_s: float  # the host's time inside `with sess.step()`
    tokens: float
    pending: PendingSplit


@dataclass
class StepTimer:
    """The object `sess.step()` yields; see the module docstring. `measured` is the session's set
    of parts the script has shown a way to measure (a call to t.data(), t.optimizer(), t.comm(),
    a watched DDP model, or one rank: no communication); this timer adds to it."""

    tokens: float = 0.0
    comm_watch: CommWatch | None = None
    marks: Marks = field(default_factory=HostMarks)
    measured: set[str] = field(default_factory=set)
    metrics: dict[str, Any] = field(default_factory=dict)
    now: Callable[[], float] = time.perf_counter
    """The host clock of the step's own time (the session's)."""
    _spans: list[tuple[str, Any, Any]] = field(default_factory=list)
    _t0: float = 0.0
    _begin: Any = None
    _mark: Any = None

    def begin(self) -> None:
        self._t0 = self.now()
        self._begin = self._mark = self.marks.record()

    def data(self, batch: Any = None) -> Any:
        now = self.marks.record()
        self._spans.append(("data", self._mark, now))
        self._mark = now
        self.measured.add("data")
        return batch

    @contextmanager
    def optimizer(self) -> Iterator[None]:
        with self._region("optimizer"):
            yield

    @contextmanager
    def comm(self) -> Iterator[None]:
        with self._region("comm"):
            yield

    @contextmanager
    def _region(self, part: str) -> Iterator[None]:
        start = self.marks.record()
        try:
            yield
        finally:
            self._mark = self.marks.record()
            self._spans.append((part, start, self._mark))
            self.measured.add(part)

    def log(self, **metrics: Any) -> None:
        """Metrics for this step (loss=..., lr=...): numbers land in telemetry.jsonl (rank 0's)."""
        for key, value in metrics.items():
            if hasattr(value, "item"):
                value = value.item()  # a tensor: one sync, at the caller's request
            self.metrics[key] = value

    def end(self) -> FinishedStep:
        end = self.marks.record()
        tail = self.comm_watch.take() if self.comm_watch is not None else None
        pending = PendingSplit(self.marks, self._begin, end, list(self._spans), tail, frozenset(self.measured))
        return FinishedStep(host_s=self.now() - self._t0, tokens=float(self.tokens or 0), pending=pending)


@dataclass
class SplitQueue:
    """Resolves splits in step order: at once with host marks; one step later with lagged (device)
    marks, so reading step N's events waits only for step N, while step N+1 is already queued."""

    pending: tuple[int, PendingSplit] | None = None

    def push(self, step: int, split: PendingSplit) -> tuple[int, StepTimes] | None:
        """The (step, split) ready now: this step's (host) or the previous one's (lagged; None at first)."""
        if not split.marks.lagged:
            return step, split.resolve()
        ready, self.pending = self.pending, (step, split)
        return None if ready is None else (ready[0], ready[1].resolve())

    def drop(self) -> None:
        self.pending = None
