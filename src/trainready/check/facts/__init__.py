"""Facts: everything a bundle shows, parsed once per analysis and handed to every check.

Each file is cleaned of what a paste adds (parsers/paste.py) and parsed once; each fact is built once,
from every file that shows it (FACT_SOURCES, also the table in docs/check.md). Checks read facts,
never files, so the absence of one file never hides what another proves."""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property
from typing import Any

from ..context import Context
from ..parsers.paste import Paste, clean
from . import events, gpu, links
from .base import Fact, GpuTable, Seen, bus_key, source_name

# fact -> the files that can show it, most direct first: what a check's `needs` names (docs/check.md has the
# table for every fact, the collectives and DCGM included, whose checks name their files themselves)
FACT_SOURCES: dict[str, tuple[str, ...]] = {
    "inventory": ("nvidia-smi-query-gpu.csv", "nvidia-smi-q.txt", "nvidia-smi.txt", "nvidia-smi-topo-m.txt",
                      "nvidia-smi-nvlink-s.txt", "cuda.json"),
    "lost": ("kernel-xid.txt", "kernel-log.txt", "nvidia-smi.txt", "nvidia-smi-q.txt", "nvidia-smi-query-gpu.csv",
                 "nvidia-smi-topo-m.txt", "nvidia-smi-nvlink-s.txt"),
    "model": ("nvidia-smi-q.txt", "nvidia-smi-query-gpu.csv", "nvidia-smi.txt", "nvidia-smi-nvlink-s.txt", "cuda.json"),
    "driver": ("nvidia-smi-q.txt", "nvidia-smi-query-gpu.csv"),
    "ecc": ("nvidia-smi-q.txt", "nvidia-smi-query-gpu.csv", "nvidia-smi.txt"),  # the table: its infoROM warning
    "retired-pages": ("nvidia-smi-q.txt", "nvidia-smi-query-gpu.csv"),
    "row-remap": ("nvidia-smi-q.txt",),
    "persistence": ("nvidia-smi-q.txt", "nvidia-smi-query-gpu.csv", "nvidia-smi.txt"),
    "mig": ("nvidia-smi-q.txt", "nvidia-smi-query-gpu.csv"),
    "throttle": ("nvidia-smi-q.txt", "nvidia-smi-query-gpu.csv"),
    "pcie": ("nvidia-smi-q.txt", "nvidia-smi-query-gpu.csv", "kernel-log.txt", "kernel-xid.txt"),
    "xid": ("kernel-xid.txt", "kernel-log.txt"),
    "fabric": ("nvidia-smi-q.txt", "fabricmanager-status.txt", "fabricmanager-log.txt", "cuda.json",
                        "cuda-log.txt", "dcgm-diag.txt", "dcgm-diag.json"),
    "sxid": ("kernel-xid.txt", "kernel-log.txt", "fabricmanager-log.txt"),
    "infiniband": ("ibstat.txt", "ibv_devinfo.txt"),
}


class Facts:
    """The parsed bundle. `parsed(name, parser)` reads a file once per parser; the properties below
    build each fact once."""

    def __init__(self, ctx: Context):
        self.ctx = ctx
        self.bundle = ctx.bundle
        self.table = GpuTable()
        self._parsed: dict[tuple[str, str], Any] = {}
        self._pastes: dict[str, Paste | None] = {}
        self._memo: dict[str, Any] = {}
        gpu.learn_table(self)

    # -- files ------------------------------------------------------------------------------------

    def paste(self, name: str) -> Paste | None:
        """The file's text with what a paste adds removed (fences, quotes, elision lines); None if absent."""
        if name not in self._pastes:
            text = self.bundle.text(name)
            self._pastes[name] = None if text is None else clean(text)
        return self._pastes[name]

    def parsed(self, name: str, parser: Callable[[str], Any]) -> Any:
        key = (name, f"{parser.__module__}.{parser.__qualname__}")
        if key not in self._parsed:
            text = self.paste(name)
            self._parsed[key] = None if text is None else parser(text.text)
        return self._parsed[key]

    def memo(self, key: str, build: Callable[[Facts], Any]) -> Any:
        """`build(self)`, once per analysis (what several facts derive from one file, e.g. its GPUs keyed)."""
        if key not in self._memo:
            self._memo[key] = build(self)
        return self._memo[key]

    def present(self, name: str) -> bool:
        return self.bundle.text(name) is not None

    def unreadable(self, name: str) -> str | None:
        """Why a structured output that is in the bundle shows nothing at all (not a table, cut before its
        first row): its parser's first problem. None when it was read, or is a log (any text is one)."""
        from ..parsers import node, nvsmi, system

        parsers = {gpu.SMI_Q: (nvsmi.parse_smi_q, lambda r: r.gpus or r.attached_gpus is not None),
                   gpu.QUERY: (nvsmi.parse_query_gpu, lambda r: r.fields),
                   gpu.TOPO: (nvsmi.parse_topo, lambda r: r.gpus),
                   gpu.NVLINK: (nvsmi.parse_nvlink_status, lambda r: r.gpus),
                   "dcgm-diag.json": (node.parse_dcgm_diag, lambda r: r.results or r.runtime_error),
                   "dcgm-diag.txt": (node.parse_dcgm_diag_text, lambda r: r.results),
                   "ibstat.txt": (system.parse_ibstat, lambda r: r.cas or r.command_missing or r.notes)}
        if name not in parsers or self.paste(name) is None or not self.paste(name).text.strip():
            return None
        for words in [self.parsed(name, nvsmi.parse_smi_messages)] if name in gpu.NVSMI_FILES else []:
            if words.no_gpu or words.lost or words.rows:
                return None  # nvidia-smi's own words: read, and evidence
        parser, read = parsers[name]
        result = self.parsed(name, parser)
        if read(result):
            return None
        problems = getattr(result, "problems", None) or []
        return str(problems[0])[:160] if problems else "nothing in it could be read"

    def why_missing(self, names: tuple[str, ...] | list[str]) -> str:
        """Why none of `names` shows anything: each file's own reason, in a few words."""
        reasons = [self.bundle.why_missing(n) for n in names]
        return "; ".join(reasons[:4]) + (f"; and {len(reasons) - 4} more" if len(reasons) > 4 else "")

    # -- facts ------------------------------------------------------------------------------------

    @cached_property
    def inventory(self) -> events.Inventory:
        return events.inventory(self)

    @cached_property
    def ecc(self) -> Fact[gpu.Ecc]:
        return gpu.ecc(self)

    @cached_property
    def remap(self):
        return gpu.remap(self)

    @cached_property
    def retired(self):
        return gpu.retired(self)

    @cached_property
    def persistence(self) -> Fact[str]:
        return gpu.setting(self, "persistence", "Persistence Mode", "persistence_mode")

    @cached_property
    def mig(self) -> Fact[str]:
        return gpu.setting(self, "mig", "MIG Mode/Current", "mig.mode.current")

    @cached_property
    def mig_pending(self) -> Fact[str]:
        return gpu.setting(self, "mig-pending", "MIG Mode/Pending", "mig.mode.pending")

    @cached_property
    def throttle(self) -> Fact[gpu.Throttle]:
        return gpu.throttle(self)

    @cached_property
    def pcie(self) -> Fact[gpu.Pcie]:
        return gpu.pcie(self)

    @cached_property
    def model(self):
        return gpu.model(self)

    @cached_property
    def fabric_state(self):
        return gpu.fabric_state(self)

    @cached_property
    def xids(self):
        return events.xids(self)

    @cached_property
    def sxids(self):
        return events.sxids(self)

    @cached_property
    def cuda(self) -> dict:
        return events.cuda_json(self)

    @cached_property
    def fabric_not_ready(self) -> list[Seen[str]]:
        return events.cuda_fabric_words(self) + links.dcgm_fabric_words(self)

    @cached_property
    def nvlink(self) -> links.NvlinkFacts:
        return links.nvlink(self)

    @cached_property
    def infiniband(self) -> links.IbFacts:
        return links.infiniband(self)

    @cached_property
    def dcgm(self):
        return links.dcgm(self)

    def nccl_tests(self, op: str):
        return links.nccl_tests(self, op)

    def pcie_limited(self) -> dict[str, list[events.Limited]]:
        return events.pcie_limited(self, set(self.inventory.listed_buses))

    # -- naming -----------------------------------------------------------------------------------

    def label(self, key: str) -> str:
        return self.table.label(key)

    def labels(self, keys, limit: int = 8) -> str:
        keys = list(keys)
        shown = ", ".join(self.label(k) for k in keys[:limit])
        return shown + (f" and {len(keys) - limit} more" if len(keys) > limit else "")


__all__ = ["FACT_SOURCES", "Fact", "Facts", "Seen", "bus_key", "source_name"]
