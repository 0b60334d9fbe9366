"""Tiered, atomic, verified checkpoints: `CheckpointManager` plus ready-made state objects.

The manager and the state objects need torch and load on first use, so the torch-free parts
(`tiers`, `manifest`, `retention`, `inspect`, behind `trainready ckpt`) import without it."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .errors import (ArchiveUnavailableError, BadStateError, CheckpointError, FencedError, PreemptedError,
                     StorageFullError)
from .options import CheckpointManagerOptions

if TYPE_CHECKING:
    from .manager import CheckpointManager, ManagerStatus, RestoreResult
    from .state import ModelState, OptimizerState, Position, RNGState, training_state

_LAZY = {
    "CheckpointManager": "manager", "ManagerStatus": "manager", "RestoreResult": "manager", "training_state": "state", "ModelState": "state",
    "OptimizerState": "state", "Position": "state", "RNGState": "state",
}

__all__ = [
    "CheckpointManager", "CheckpointManagerOptions", "ManagerStatus", "RestoreResult", "training_state", "ModelState",
    "OptimizerState", "Position", "RNGState",
    "CheckpointError", "StorageFullError", "FencedError", "ArchiveUnavailableError", "BadStateError", "PreemptedError",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
