"""The rule machinery of `trainready diagnose`: lines, findings, the Rule protocol, helpers.
The rules: log_rules_nccl.py (NCCL, EFA) and log_rules_torch.py (CUDA, torchrun, rendezvous,
world size, NaN loss); the engine that runs them: log_rules.py.

A rule sees the lines of every file in reading order (`feed`), hears when a file ends (`end_file`)
and reports at the end (`finish`). The engine feeds a rule only the lines that contain one of its
`keywords` (plain substrings: far cheaper than a regex on every line of a multi-GB log), plus the next
line while the rule sets `wants_next` (messages continued on the following line).
Rules never raise on odd input: numbers are parsed only from digits a regex matched.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

Detail = str | int | float | None
Details = dict[str, Detail]
CHILD_FAILED = "torchrun.child-failed"
NOT_FATAL = {"efa.ofi-init-failed"}  # errors that do not by themselves end a worker (NCCL falls back to sockets)


@dataclass(frozen=True)
class Line:
    file: str
    number: int
    text: str
    position: tuple[int, int]  # (file index in reading order, line number): orders evidence


@dataclass
class Finding:
    id: str
    title: str
    severity: str  # "error" | "warning"
    explanation: str
    fixes: list[str]
    lines: list[Line]
    count: int
    details: Details = field(default_factory=dict)


class Rule:
    keywords: tuple[str, ...]
    wants_next = False

    def wants(self, text: str) -> bool:
        if self.wants_next:
            return True
        for keyword in self.keywords:  # a plain loop: measurably faster than any() over a generator
            if keyword in text:
                return True
        return False

    def feed(self, line: Line) -> None:
        raise NotImplementedError

    def end_file(self, file: str) -> None:
        self.wants_next = False

    def finish(self) -> list[Finding]:
        raise NotImplementedError


def _int(digits: str) -> int:
    """A number a regex matched: capped at 18 digits, since int() refuses very long digit strings."""
    return int(digits[:18])


def _gib(number: str, unit: str) -> float:
    scale = {"bytes": 2**-30, "KiB": 2**-20, "MiB": 2**-10, "GiB": 1.0, "TiB": 1024.0}[unit]
    return round(float(number) * scale, 2)


def _rank_list(ranks: Iterable[int], most: int = 16) -> str:
    ordered = sorted(set(ranks))
    shown = ",".join(str(r) for r in ordered[:most])
    return shown + (f",... ({len(ordered)} ranks)" if len(ordered) > most else "")


def _after(text: str, *markers: str) -> str:
    """The message part of a log line: what follows the first marker found, up to a ' | ' column."""
    for marker in markers:
        if marker in text:
            text = text.rsplit(marker, 1)[1]
            break
    return text.split(" | ")[0].strip()[:240]


def _plural(ranks: str | None) -> str:
    return "Ranks" if ranks and "," in ranks else "Rank"


_RANK_TAG = re.compile(r"\[(?:PG [^\]]{0,80}?)?Rank (\d+)\]")
_RANK_PREFIX = re.compile(r"\[rank(\d+)\]")


def _rank_of(text: str) -> int | None:
    m = _RANK_TAG.search(text) or _RANK_PREFIX.search(text)
    return _int(m.group(1)) if m else None
