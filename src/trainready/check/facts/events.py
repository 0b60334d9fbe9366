"""Facts from logs and error text: Xid events, lost GPUs, NVSwitch SXids, PCIe links the kernel saw
limited, and the GPU inventory every nvidia-smi output and torch can count."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from trainready.io import parse_json

from ..parsers import kernel, nvsmi
from .base import Fact, Seen, bus_key
from .gpu import NVLINK, NVSMI_FILES, QUERY, SMI_Q, TABLE, TOPO, csv_rows, q_sections, query, smi_q

if TYPE_CHECKING:
    from . import Facts

KERNEL_FILES = ("kernel-xid.txt", "kernel-log.txt")
CUDA_LOG = "cuda-log.txt"


def kernel_events(f: Facts) -> list[tuple[str, kernel.KernelGpuEvents]]:
    """(file, events) for each kernel log in the bundle; both files may hold the same line (an SXid
    matches both filters at collection), so checks key events by their line."""
    out = []
    for name in KERNEL_FILES:
        events = f.parsed(name, kernel.parse_kernel_gpu_events)
        if events is not None:
            out.append((name, events))
    return out


def kernel_readable(f: Facts, xids: bool = True) -> tuple[list[str], list[str]]:
    """(kernel log files that can show Xids, files present that said the log could not be read).
    kernel-xid.txt is the collector's Xid/NVRM filter of dmesg; kernel-log.txt is its filter of NIC and
    disk lines, which never holds an Xid, unless a user put a whole log there: it counts when it holds
    the driver's own lines (NVRM). For SXids (`xids=False`) both count: the collector keeps SXid lines
    in kernel-log.txt too."""
    read, unreadable = [], []
    for name, events in kernel_events(f):
        if not events.readable:
            unreadable.append(name)
        elif not xids or name == "kernel-xid.txt" or "NVRM" in (f.paste(name).text if f.paste(name) else ""):
            read.append(name)
    return read, unreadable


def xids(f: Facts) -> Fact[kernel.XidEvent]:
    fact: Fact[kernel.XidEvent] = Fact()
    seen: set[str] = set()
    for name, events in kernel_events(f):
        for event in events.xids:
            if event.line in seen:
                continue
            seen.add(event.line)
            bus = bus_key(event.bus)
            fact.add(f.table.key(bus=bus, unnamed="GPU (address elided in the log)"), event, name, event.line)
    return fact


def sxids(f: Facts) -> list[tuple[str, kernel.SxidEvent]]:
    out, seen = [], set()
    for name, events in kernel_events(f):
        for event in events.sxids:
            key = (event.switch, event.bus, event.code, event.message)
            if key not in seen:
                seen.add(key)
                out.append((name, event))
    return out


@dataclass(frozen=True, slots=True)
class Limited:
    event: kernel.PcieLimited
    source: str


def pcie_limited(f: Facts, gpu_buses: set[str]) -> dict[str, list[Limited]]:
    """GPU key -> the kernel's "limited by ... PCIe" lines about a GPU (a bus nvidia-smi lists, one the
    PCI core enumerated as an NVIDIA display/3D controller, or a line the nvidia driver printed)."""
    out: dict[str, list[Limited]] = {}
    for name, events in kernel_events(f):
        nvidia = {bus_key(b) for b in events.nvidia_devices} | gpu_buses
        for event in events.pcie_limited:
            bus = bus_key(event.bus)
            if bus in nvidia or event.line.lstrip("'\"").find("nvidia ") >= 0:
                out.setdefault(f.table.key(bus=bus), []).append(Limited(event, name))
    return out


@dataclass
class Inventory:
    """How many GPUs the bundle shows, by source; which ones are lost, and the words that say so."""

    reachable: list[Seen[int]] = field(default_factory=list)
    """GPUs listed by a complete output (query CSV rows, -q sections, the table, topo, nvlink -s)."""
    at_least: list[Seen[int]] = field(default_factory=list)
    """Lower bounds: an output cut short or elided lists only some."""
    attached: Seen[int] | None = None
    """`Attached GPUs` of nvidia-smi -q: every GPU the driver knows, lost ones included."""
    torch: Seen[int] | None = None
    lost: dict[str, list[Seen[str]]] = field(default_factory=dict)
    """GPU key -> what shows it lost (fallen off the bus, no device handle, RmInitAdapter failed, ERR!)."""
    lost_bus: dict[str, str] = field(default_factory=dict)
    no_gpu: Seen[str] | None = None
    """A source's own words that there is no GPU (No devices were found, NVIDIA-SMI has failed ...)."""
    unreadable: list[str] = field(default_factory=list)
    listed_buses: set[str] = field(default_factory=set)
    """Buses of GPUs nvidia-smi lists as reachable (to tell a lost GPU that is listed again: disagreement)."""


def inventory(f: Facts) -> Inventory:
    inv = Inventory()
    _count_nvidia_smi(f, inv)
    _count_torch(f, inv)
    _lost(f, inv)
    return inv


def _count_nvidia_smi(f: Facts, inv: Inventory) -> None:
    rows = csv_rows(f)
    if rows:
        inv.reachable.append(Seen(len(rows), QUERY))
    report = smi_q(f)
    if report is not None and report.gpus:
        n = len(report.gpus)
        complete = (report.attached_gpus is None or report.attached_gpus == n) and not f.paste(SMI_Q).elided \
            and all(g.bus_id for g in report.gpus)
        (inv.reachable if complete else inv.at_least).append(Seen(n, SMI_Q))
    if report is not None and report.attached_gpus is not None:
        inv.attached = Seen(report.attached_gpus, SMI_Q)
    for _, gpu in q_sections(f):
        if (bus := bus_key(gpu.bus_id)) is not None:
            inv.listed_buses.add(bus)
    for _, row in rows:
        if (bus := bus_key(row.get("pci.bus_id"))) is not None:
            inv.listed_buses.add(bus)
    table = f.parsed(TABLE, nvsmi.parse_smi_messages)
    if table is not None and table.rows:
        (inv.at_least if f.paste(TABLE).elided else inv.reachable).append(Seen(len(table.rows), TABLE))
        inv.listed_buses |= {b for r in table.rows if not r.err and (b := bus_key(r.bus_id))}
    topo = f.parsed(TOPO, nvsmi.parse_topo)
    if topo is not None and topo.gpus:
        (inv.at_least if topo.truncated or f.paste(TOPO).elided else inv.reachable).append(Seen(len(topo.gpus), TOPO))
    links = f.parsed(NVLINK, nvsmi.parse_nvlink_status)
    if links is not None and links.gpus:
        (inv.at_least if f.paste(NVLINK).elided else inv.reachable).append(Seen(len(links.gpus), NVLINK))
    for name in NVSMI_FILES:
        words = f.parsed(name, nvsmi.parse_smi_messages)
        if words is not None and words.no_gpu and inv.no_gpu is None:
            inv.no_gpu = Seen(words.no_gpu, name)
    q = query(f)
    if q is not None and q.fields and not q.rows and inv.no_gpu is None:
        inv.no_gpu = Seen("the query CSV has a header and no GPU row", QUERY)
    for name in (QUERY, SMI_Q, TOPO, NVLINK, TABLE):
        text = f.paste(name)
        if text is not None and not any(s.source == name for s in [*inv.reachable, *inv.at_least]) and \
                not (inv.no_gpu and inv.no_gpu.source == name):
            inv.unreadable.append(name)


def _count_torch(f: Facts, inv: Inventory) -> None:
    cuda = f.cuda
    count = cuda.get("device_count")
    if cuda.get("cuda_available") and isinstance(count, int) and not isinstance(count, bool) and count >= 0:
        inv.torch = Seen(count, "cuda.json")


def _lost(f: Facts, inv: Inventory) -> None:
    def add(bus_text: str | None, words: str, source: str) -> None:
        bus = bus_key(bus_text)
        key = f.table.key(bus=bus, unnamed="a GPU (address not shown)")
        if bus:
            inv.lost_bus[key] = bus
        if not any(s.value == words for s in inv.lost.get(key, [])):
            inv.lost.setdefault(key, []).append(Seen(words, source))

    for name, events in kernel_events(f):
        for event in events.lost:
            add(event.bus, f"{event.how} ({event.line})", name)
    for name in NVSMI_FILES:
        words = f.parsed(name, nvsmi.parse_smi_messages)
        for bus, line in words.lost if words else []:
            add(bus, f"nvidia-smi cannot reach it: {line}", name)
        for row in words.rows if words else []:
            if row.err and name == TABLE:
                add(row.bus_id, f"nvidia-smi shows ERR! for GPU {row.index}", name)


def cuda_json(f: Facts) -> dict:
    text = f.paste("cuda.json")
    if text is None:
        return {}
    try:
        data = parse_json(text.text)
    except (ValueError, RecursionError):  # a planted nesting must not crash the check
        return {"unparsable": text.text[:120]}
    return data if isinstance(data, dict) else {"unparsable": text.text[:120]}


_NOT_READY = re.compile(r"system not yet initialized|cudaErrorSystemNotReady|error 802\b|code=802\b", re.I)
# NCCL's NVLS (NVLink SHARP) setup refused by CUDA: "Failed to bind NVLink SHARP (NVLS) Multicast memory ...:
# CUDA error 401 'the operation cannot be performed in the present state'" (the fabric manager is not running)
_REFUSED = re.compile(r"error 401|cannot be performed in the present state", re.I)
_MULTICAST = re.compile(r"NVLS|multicast", re.I)


def cuda_fabric_words(f: Facts) -> list[Seen[str]]:
    """What CUDA said on this node that means the NVLink fabric is not ready: error 802 ("system not yet
    initialized", NVIDIA's CUDA runtime API: the fabric manager has not registered the GPUs), or NVLS
    multicast refused. From cuda.json's warnings and any cuda-log.txt the user added."""
    out: list[Seen[str]] = []
    data = f.cuda
    texts = [str(w) for w in data.get("warnings", []) if isinstance(w, str)] if isinstance(data.get("warnings"), list) else []
    if isinstance(data.get("reason"), str):
        texts.append(data["reason"])
    for text in texts:
        if m := _NOT_READY.search(text):
            out.append(Seen(_around(text, m), "cuda.json"))
    log = f.paste(CUDA_LOG)
    text = log.text[:4 << 20] if log else ""
    if m := _NOT_READY.search(text):
        out.append(Seen(_around(text, m).replace("\n", " "), CUDA_LOG))
    for m in _REFUSED.finditer(text):  # the error words, then NVLS named in the 300 characters before them
        if _MULTICAST.search(text, max(0, m.start() - 300), m.start()):
            out.append(Seen(_around(text, m).replace("\n", " "), CUDA_LOG))
            break
    return out


def _around(text: str, match: re.Match) -> str:
    start = max(0, match.start() - 60)
    return ("..." if start else "") + text[start:match.end() + 40].strip()
