"""What one launch is and how it ended: LaunchSpec, LaunchResult and the exit codes. Its own module so that
the launcher, the failure explainer and the session share them without importing one another."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .settings import RunSettings
from .summary import RunSummary

EXIT_OK, EXIT_FAILED, EXIT_INTERNAL, EXIT_BUDGET = 0, 1, 3, 4  # 2 (usage) is UsageError's


@dataclass
class LaunchSpec:
    command: list[str]
    settings: RunSettings
    nproc_per_node: int | str = 1
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None
    rdzv_id: str | None = None
    max_restarts: int = 0
    show_ranks: str = "0"  # local ranks echoed to the console (all go to the logs)
    config: dict[str, Any] = field(default_factory=dict)  # what the user asked for, for run.json
    resume: bool = False  # --resume: continue the run in run_dir even with a changed command

    @property
    def run_dir(self) -> Path:
        assert self.settings.run_dir is not None
        return self.settings.run_dir


@dataclass
class LaunchResult:
    exit_code: int
    reason: str  # finished | failed | budget | signal | max_steps
    message: str
    failed_ranks: list[dict[str, Any]] = field(default_factory=list)
    log_tail: dict[str, list[str]] = field(default_factory=dict)
    log_files: list[str] = field(default_factory=list)
    summary: RunSummary | None = None  # what summary.json holds, set when the launch ends
