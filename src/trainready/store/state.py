"""Ready-made state objects, so a training script checkpoints everything with one line:

    state = training_state(model, optimizer, scheduler, position=Position())
    step = mgr.restore(state)

Model and optimizer go through torch.distributed.checkpoint.state_dict, which works for plain,
DDP and FSDP2 models, keys optimizer state by parameter name and creates it when empty (so a
fresh optimizer can be restored into). RNG states are per rank; everything else is shared.
"""

from __future__ import annotations

import random
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)


class ModelState:
    """A model's parameters and buffers (FSDP-sharded ones stay sharded)."""

    def __init__(self, model: torch.nn.Module):
        self.model = model

    def state_dict(self) -> dict[str, Any]:
        return get_model_state_dict(self.model)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        set_model_state_dict(self.model, state)


class OptimizerState:
    """An optimizer's state keyed by parameter name, so it survives a change of world size."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer):
        self.model, self.optimizer = model, optimizer

    def state_dict(self) -> dict[str, Any]:
        return get_optimizer_state_dict(self.model, self.optimizer)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        set_optimizer_state_dict(self.model, self.optimizer, state)


class Position:
    """Where the data loader is: epoch and samples consumed in it (plus anything you add to
    `extra`, JSON values only). Advance it as you train; after restore, skip to it."""

    def __init__(self, epoch: int = 0, index: int = 0, **extra: Any):
        self.epoch, self.index, self.extra = epoch, index, dict(extra)

    def advance(self, samples: int) -> None:
        self.index += samples

    def next_epoch(self) -> None:
        self.epoch, self.index = self.epoch + 1, 0

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "index": self.index, "extra": dict(self.extra)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.index, self.extra = int(state["epoch"]), int(state["index"]), dict(state.get("extra", {}))

    def __repr__(self) -> str:
        return f"Position(epoch={self.epoch}, index={self.index})"


class RNGState:
    """Python, NumPy (if installed), torch CPU and every CUDA device's generator, per rank.

    On restore with a different world size a rank without a saved state keeps its own."""

    trainready_rank_local = True

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"python": random.getstate(), "torch_cpu": torch.get_rng_state()}
        try:
            import numpy

            state["numpy"] = _numpy_state(numpy.random.get_state())
        except ImportError:
            pass
        if torch.cuda.is_available():
            state["torch_cuda"] = torch.cuda.get_rng_state_all()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        version, internal, gauss = state["python"]
        random.setstate((version, tuple(internal), gauss))
        torch.set_rng_state(state["torch_cpu"])
        if "numpy" in state:
            try:
                import numpy

                kind, keys, pos, has_gauss, cached = state["numpy"]
                numpy.random.set_state((kind, numpy.asarray(keys, dtype=numpy.uint32), pos, has_gauss, cached))
            except ImportError:
                pass
        if "torch_cuda" in state and torch.cuda.is_available():
            saved = list(state["torch_cuda"])[: torch.cuda.device_count()]
            for device, rng in enumerate(saved):
                torch.cuda.set_rng_state(rng, device)


def _numpy_state(state: tuple) -> tuple:
    kind, keys, pos, has_gauss, cached = state
    return (kind, [int(k) for k in keys], int(pos), int(has_gauss), float(cached))


def training_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None,
                   scheduler: Any = None, position: Position | None = None, rng: bool = True,
                   **extra: Any) -> dict[str, Any]:
    """The usual state dict for `CheckpointManager.save/restore`; `extra` adds your own objects."""
    state: dict[str, Any] = {"model": ModelState(model)}
    if optimizer is not None:
        state["optimizer"] = OptimizerState(model, optimizer)
    if scheduler is not None:
        state["scheduler"] = scheduler
    if position is not None:
        state["position"] = position
    if rng:
        state["rng"] = RNGState()
    state.update(extra)
    return state
