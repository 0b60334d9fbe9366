"""Known failures in NCCL, torch, torchrun and training logs: the engine that runs every rule.

A rule sees the lines of every file in reading order (`feed`), hears when a file ends (`end_file`)
and reports at the end (`finish`); see log_rules_base.py. The rules live in log_rules_nccl.py and
log_rules_torch.py, one section per failure family with its regexes, details, explanation and fixes.
"""

from __future__ import annotations

from collections.abc import Iterable

from .log_rules_base import CHILD_FAILED, NOT_FATAL, Detail, Finding, Line, Rule  # noqa: F401 - Detail, Finding, Line: diagnose.py
from .log_rules_nccl import NcclSystemErrorRule, NetworkRule, WatchdogRule
from .log_rules_torch import CudaOomRule, NanLossRule, RendezvousRule, WorkerDeathRule, WorldSizeRule

RULES: tuple[type[Rule], ...] = (WatchdogRule, NetworkRule, NcclSystemErrorRule, CudaOomRule, WorkerDeathRule,
                                 RendezvousRule, WorldSizeRule, NanLossRule)


def run_rules(lines: Iterable[Line]) -> list[Finding]:
    """Every rule over every line; torchrun's generic summary is dropped when a specific error explains it."""
    rules = [rule() for rule in RULES]
    current: str | None = None
    for line in lines:
        if line.file != current:
            if current is not None:
                for rule in rules:
                    rule.end_file(current)
            current = line.file
        for rule in rules:
            if rule.wants(line.text):
                rule.feed(line)
    if current is not None:
        for rule in rules:
            rule.end_file(current)
    findings = [finding for rule in rules for finding in rule.finish()]
    if any(f.severity == "error" and f.id not in NOT_FATAL for f in findings):
        findings = [f for f in findings if f.id != CHILD_FAILED]
    return findings
