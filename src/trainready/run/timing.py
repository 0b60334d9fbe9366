"""Where a step's time goes: data wait, compute, optimizer, communication.

`with sess.step(tokens=n) as t:` starts the clock. `t.data(batch)` marks the batch as ready:
everything from the step's start (or the previous mark) to that call was spent waiting for
data, which is why `t.data(next(it))` measures the loader without wrapping it.
`with t.optimizer():` and `with t.comm():` time those regions; a DDP model passed to
`sess.watch(model)` reports its gradient all-reduce through a comm hook. Compute is the rest.
On CUDA the step ends with a synchronize, so the wall time is the GPU's.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

clock = time.perf_counter


@dataclass
class StepTimes:
    step_s: float = 0.0
    data_s: float = 0.0
    optimizer_s: float = 0.0
    comm_s: float = 0.0  # exposed: explicit comm regions + the all-reduce tail after backward
    tokens: float = 0.0

    @property
    def compute_s(self) -> float:
        return max(0.0, self.step_s - self.data_s - self.optimizer_s - self.comm_s)


class CommWatch:
    """Times DDP's gradient buckets through a comm hook wrapping the default all-reduce.

    Buckets overlap backward, so only the tail is exposed: from the last bucket's launch (backward
    is done by then) to the last completion. Host clocks: on NCCL that is enqueue-to-callback,
    an underestimate; on gloo it is the real wait."""

    def __init__(self) -> None:
        self.launches: list[float] = []
        self.done: list[float] = []

    def attach(self, ddp_model: Any) -> None:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        def hook(state, bucket):  # noqa: ANN001, ANN202 - DDP rejects string annotations
            self.launches.append(clock())
            fut = default_hooks.allreduce_hook(state, bucket)

            def finished(f: Any) -> Any:
                self.done.append(clock())
                return f.value()

            return fut.then(finished)

        ddp_model.register_comm_hook(None, hook)

    def take_exposed_s(self) -> float:
        exposed = max(self.done) - max(self.launches) if self.launches and self.done else 0.0
        self.launches.clear()
        self.done.clear()
        return max(0.0, exposed)


@dataclass
class StepTimer:
    """The object `sess.step()` yields; see the module docstring."""

    tokens: float = 0.0
    comm_watch: CommWatch | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    times: StepTimes = field(default_factory=StepTimes)
    _start: float = 0.0
    _mark: float = 0.0

    def begin(self) -> None:
        self._start = self._mark = clock()

    def data(self, batch: Any = None) -> Any:
        now = clock()
        self.times.data_s += now - self._mark
        self._mark = now
        return batch

    @contextmanager
    def optimizer(self) -> Iterator[None]:
        t0 = clock()
        try:
            yield
        finally:
            self.times.optimizer_s += clock() - t0
            self._mark = clock()

    @contextmanager
    def comm(self) -> Iterator[None]:
        t0 = clock()
        try:
            yield
        finally:
            self.times.comm_s += clock() - t0
            self._mark = clock()

    def log(self, **metrics: Any) -> None:
        """Metrics for this step (loss=..., lr=...): numbers land in telemetry.jsonl (rank 0's)."""
        for key, value in metrics.items():
            if hasattr(value, "item"):
                value = value.item()  # a tensor: one sync, at the caller's request
            self.metrics[key] = value

    def end(self) -> StepTimes:
        if self.comm_watch is not None:
            self.times.comm_s += self.comm_watch.take_exposed_s()
        self.times.step_s = clock() - self._start
        self.times.tokens = float(self.tokens or 0)
        return self.times
