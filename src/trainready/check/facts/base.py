"""A fact and its evidence: what each file of a bundle shows about one thing, per GPU or for the node.

A fact is judged from every source that shows it (issue 23): `nvidia-smi -q` and the query CSV both
show ECC counters, the kernel log and nvidia-smi's own errors both show a lost GPU. So a fact keeps
each observation with the file it came from; a check reads them all, and sources that disagree are
named. A fact no present file shows is unknown: the registry says which files would have shown it
and why each is not there."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

T = TypeVar("T")

# How a fact's sources are named in reasons and docs: the command, not the file name.
SOURCE_NAMES = {
    "nvidia-smi-q.txt": "nvidia-smi -q",
    "nvidia-smi.txt": "nvidia-smi",
    "nvidia-smi-compute-apps.csv": "nvidia-smi --query-compute-apps",
    "cuda-log.txt": "a CUDA program's output (cuda-log.txt)",
    "nvidia-smi-query-gpu.csv": "nvidia-smi --query-gpu",
    "nvidia-smi-nvlink-s.txt": "nvidia-smi nvlink -s",
    "nvidia-smi-topo-m.txt": "nvidia-smi topo -m",
    "kernel-xid.txt": "the kernel log (Xid lines)",
    "kernel-log.txt": "the kernel log",
    "cuda.json": "torch (cuda.json)",
    "dcgm-diag.json": "dcgmi diag (JSON)",
    "dcgm-diag.txt": "dcgmi diag",
    "fabricmanager-status.txt": "systemctl status nvidia-fabricmanager",
    "fabricmanager-log.txt": "the fabric manager log",
    "lspci-vvv.txt": "lspci -vvv",
    "ibstat.txt": "ibstat",
    "ibv_devinfo.txt": "ibv_devinfo",
    "deep.json": "--deep measurements",
}


def source_name(source: str) -> str:
    if source.startswith("nccl-tests-"):
        return f"nccl-tests ({source})"
    return SOURCE_NAMES.get(source, source)


_BUS = re.compile(r"(?:PCI:)?(?:([0-9A-Fa-f]{1,8}):)?([0-9A-Fa-f]{1,2}):([0-9A-Fa-f]{1,2})(?:\.[0-7])?")


def bus_key(text: str | None) -> str | None:
    """A GPU's PCI address as every tool prints it, in one form: 00000000:3B:00.0 (nvidia-smi -q),
    PCI:0000:3b:00 (the kernel's Xid lines), 0019:01:00.0 (a Grace system's domain), 3b:00.0
    (lspci without -D) all become `0000:3b:00` / `0019:01:00`. None when `text` is no address."""
    match = _BUS.fullmatch((text or "").strip())
    if not match:
        return None
    domain = int(match.group(1) or "0", 16)
    if domain > 0xFFFF:
        return None
    return f"{domain:04x}:{int(match.group(2), 16):02x}:{int(match.group(3), 16):02x}"


@dataclass(frozen=True, slots=True)
class Seen(Generic[T]):
    """One source's word on a fact: the value (None: the source says it is not reported, N/A)."""

    value: T
    source: str
    detail: str = ""
    """The words that show it, as printed (quoted where it is shown)."""


class GpuTable:
    """Which GPU is which across sources: the query CSV and a complete `nvidia-smi -q` give both the
    index and the bus id; the kernel gives only the bus id, `nvlink -s` and `topo -m` only the index."""

    def __init__(self) -> None:
        self.bus_of: dict[int, str] = {}
        self.index_of: dict[str, int] = {}

    def learn(self, index: int | None, bus: str | None) -> None:
        if index is None or bus is None or index in self.bus_of or bus in self.index_of:
            return
        self.bus_of[index], self.index_of[bus] = bus, index

    def key(self, index: int | None = None, bus: str | None = None, unnamed: str = "?") -> str:
        """The key a GPU is filed under: `3` when its index is known, else `0000:3b:00`, else `unnamed`."""
        if index is None and bus is not None:
            index = self.index_of.get(bus)
        if index is not None:
            return str(index)
        return bus or unnamed

    def label(self, key: str) -> str:
        """How findings name the GPU: GPU 3 (0000:3b:00), GPU 0000:3b:00, or the unnamed label."""
        if key.isdigit():
            bus = self.bus_of.get(int(key))
            return f"GPU {key}" + (f" ({bus})" if bus else "")
        if bus_key(key) == key:
            return f"GPU {key}"
        return key


def sort_key(key: str) -> tuple[int, int, str]:
    return (0, int(key), "") if key.isdigit() else (1, 0, key)


@dataclass
class Fact(Generic[T]):
    """Everything the bundle shows about one fact, per GPU, each observation with its file (added most
    direct source first)."""

    by_gpu: dict[str, list[Seen[T]]] = field(default_factory=dict)

    def add(self, key: str, value: T, source: str, detail: str = "") -> None:
        self.by_gpu.setdefault(key, []).append(Seen(value, source, detail))

    @property
    def known(self) -> bool:
        """Some source spoke to this fact (a value, or that it is not reported)."""
        return bool(self.by_gpu)

    def gpus(self) -> list[str]:
        return sorted(self.by_gpu, key=sort_key)

    def reported(self, key: str) -> list[Seen[T]]:
        return [s for s in self.by_gpu.get(key, []) if s.value is not None]

    def first(self, key: str) -> Seen[T] | None:
        """The most direct source's value for a GPU (sources are added most direct first)."""
        seen = self.reported(key)
        return seen[0] if seen else None

    def any(self, test: Callable[[T], bool]) -> dict[str, list[Seen[T]]]:
        """GPU -> the observations for which `test(value)` holds (at least one)."""
        out: dict[str, list[Seen[T]]] = {}
        for key in self.gpus():
            hits = [s for s in self.reported(key) if test(s.value)]
            if hits:
                out[key] = hits
        return out

    def disagreements(self, table: GpuTable, show: Callable[[Any], str] = str) -> list[str]:
        """Per GPU whose sources give different values: what each says."""
        out = []
        for key in self.gpus():
            seen = self.reported(key)
            values = {show(s.value) for s in seen}
            if len(values) > 1:
                said = ", ".join(f"{source_name(s.source)} says {show(s.value)}" for s in seen)
                out.append(f"{table.label(key)}: {said}")
        return out

