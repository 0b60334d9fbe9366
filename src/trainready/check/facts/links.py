"""Facts about links and acceptance runs: NVLink (nvlink -s, topo -m), InfiniBand ports (ibstat,
ibv_devinfo), DCGM's diagnostic (its JSON or the table it prints) and nccl-tests outputs."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..parsers import node, nvsmi, system
from .base import Seen
from .gpu import NVLINK, TOPO

if TYPE_CHECKING:
    from . import Facts

DCGM_JSON, DCGM_TEXT = "dcgm-diag.json", "dcgm-diag.txt"


@dataclass
class NvlinkFacts:
    status: nvsmi.NvlinkStatus | None = None
    """nvidia-smi nvlink -s, per GPU index."""
    elided: int = 0
    topo: nvsmi.Topology | None = None
    mig_refused: str | None = None
    """"NVLink queries are not supported for Devices in MIG mode": links unknown, not down."""


def nvlink(f: Facts) -> NvlinkFacts:
    out = NvlinkFacts(topo=f.parsed(TOPO, nvsmi.parse_topo))
    paste = f.paste(NVLINK)
    if paste is not None:
        out.status, out.elided = f.parsed(NVLINK, nvsmi.parse_nvlink_status), paste.elided
        if re.search(r"not supported for Devices in MIG mode", paste.text, re.I):
            out.mig_refused = "nvidia-smi: NVLink queries are not supported for devices in MIG mode"
    return out


@dataclass(frozen=True, slots=True)
class RdmaPort:
    """A port as one tool listed it: the parser's own record (ibstat's IbPort, which has the physical state, or
    ibv_devinfo's IbvPort), its device, and the file it came from. The records judge `active` themselves."""
    device: str
    record: system.IbPort | system.IbvPort
    source: str

    @property
    def port(self) -> int | None:
        return self.record.number

    @property
    def state(self) -> str | None:
        return self.record.state

    @property
    def physical(self) -> str | None:
        return getattr(self.record, "physical_state", None)  # ibv_devinfo does not show it

    @property
    def link_layer(self) -> str | None:
        return self.record.link_layer

    @property
    def active(self) -> bool:
        return self.record.active


@dataclass
class IbFacts:
    ports: list[RdmaPort] = field(default_factory=list)
    read: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def infiniband(f: Facts) -> IbFacts:
    """Every RDMA port either tool lists; ibstat wins for a port both list (it shows the physical state)."""
    out = IbFacts()
    ibstat = f.parsed("ibstat.txt", system.parse_ibstat)
    if ibstat is not None:
        out.read.append("ibstat.txt")
        out.notes += ibstat.notes
        for ca in ibstat.cas:
            for p in ca.ports:
                out.ports.append(RdmaPort(ca.name, p, "ibstat.txt"))
    devinfo = f.parsed("ibv_devinfo.txt", system.parse_ibv_devinfo)
    if devinfo is not None:
        out.read.append("ibv_devinfo.txt")
        known = {(p.device, p.port) for p in out.ports}
        for device in devinfo.devices:
            if device.is_efa:
                continue  # EFA is checked by net.efa
            for p in device.ports:
                if (device.hca_id, p.number) not in known:
                    out.ports.append(RdmaPort(device.hca_id, p, "ibv_devinfo.txt"))
    return out


def dcgm(f: Facts) -> list[tuple[node.DcgmDiag, str]]:
    """DCGM's diagnostics in the bundle: the JSON trainready's --dcgm keeps, and the table a user saved or
    pasted; both are judged (a passing one never hides a failing one)."""
    out = []
    for name, parser in ((DCGM_JSON, node.parse_dcgm_diag), (DCGM_TEXT, node.parse_dcgm_diag_text)):
        diag = f.parsed(name, parser)
        if diag is not None:
            out.append((diag, name))
    return out


_NOT_READY = re.compile(r"system not yet initialized", re.I)


def dcgm_fabric_words(f: Facts) -> list[Seen[str]]:
    for diag, name in dcgm(f):
        for result in diag.results:
            for message in result.messages:
                if _NOT_READY.search(message):
                    return [Seen(f"DCGM {result.test}: {message[:160]}", name)]
    return []


@dataclass
class NcclRun:
    """One nccl-tests output: its table and what its header says about the run."""

    source: str
    tests: system.NcclTests
    ranks: int | None
    hosts: list[str]
    gpus: list[str]
    elided: int = 0


_RANK_LINE = re.compile(r"#\s{0,8}Rank\s{1,8}(\d{1,7})\s{1,8}Group\s{1,8}\d{1,7}\s{1,8}Pid\s{1,8}\d{1,12}\s{1,8}on\s{1,8}"
                        r"(\S{1,255})\s{1,8}device\s{1,8}\d{1,7}\s{1,8}\[[^\]]{0,40}\]\s{1,8}")


def nccl_tests(f: Facts, op: str) -> NcclRun | None:
    name = f"nccl-tests-{op}.txt"
    paste = f.paste(name)
    if paste is None:
        return None
    tests = f.parsed(name, system.parse_nccl_tests)
    hosts: dict[str, None] = {}
    gpus: list[str] = []
    ranks: set[int] = set()
    for line in paste.text.splitlines():
        if "Rank" in line and (m := _RANK_LINE.search(line[:600])):
            ranks.add(int(m.group(1)))
            hosts.setdefault(m.group(2))
            gpus.append(line[m.end():m.end() + 120].strip())
    return NcclRun(f.bundle.origins.get(name, name), tests, len(ranks) or tests.nranks, list(hosts), gpus, paste.elided)
