"""GPU events in a kernel log (dmesg, dmesg -T, journalctl -k, /var/log/syslog, raw /dev/kmsg), as found.

What it reads, each from the real outputs in tests/fixtures/real/kernel/:
- `NVRM: Xid (PCI:0000:3b:00): 79, pid=..., name=..., <message>`: the code, the GPU, the message, and
  in it the words that decide severity: NVLink5's `Fatal` / `Nonfatal` (Xids 144-150), "caused by
  previous Xid N" (Xid 45 naming its root cause), Xid 154's new recovery action.
- a lost GPU with or without an Xid token: "GPU 0000:a1:00.0: GPU has fallen off the bus", the
  driver's three-line "The NVIDIA GPU 0000:b3:00.0 / (PCI ID: ...) installed in this system has /
  fallen off the bus", "RmInitAdapter failed" (the driver could not bring the GPU up).
- NVSwitch SXid lines, and the PCI core's "available PCIe bandwidth, limited by ..." lines.
Continuation lines (leading spaces, then `NVRM:`) are joined to the line they continue. Never raises."""

from __future__ import annotations

import re

from .system import Text, _Frozen, _guard, _lines, _Parsed, _Problems, quote

_PREFIX = re.compile(r"^.{0,120}?NVRM:\s?")
_XID = re.compile(r"NVRM: Xid \((?:PCI:)?([^)]{0,40})\):\s*(\d{1,6})\s*(?:,\s*(.*))?$")
_SXID = re.compile(r"(?:(nvidia-nvswitch\d{1,3}):\s*)?SXid \((?:PCI:)?([^)]{0,40})\):\s*(\d{1,6})\s*(?:,\s*(.*))?$")
_BUS_TEXT = r"((?:[0-9A-Fa-f]{4,8}:)?[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)"
_LOST = re.compile(rf"GPU\s+(?:at\s+PCI:)?{_BUS_TEXT}\b.{{0,200}}?(fallen off the bus|GPU is lost|RmInitAdapter failed)", re.I)
_HOW = {"fallen off the bus": "fallen off the bus", "gpu is lost": "GPU is lost", "rminitadapter failed": "RmInitAdapter failed"}
_WORD = re.compile(r"\b(Non-?fatal|Fatal)\b", re.I)
_PREVIOUS = re.compile(r"caused by previous Xid (\d{1,6})", re.I)
_RECOVERY = re.compile(r"recovery action changed from (0x[0-9a-f]+)\s*(?:\([^)]*\))?\s*to (0x[0-9a-f]+)\s*(?:\(([^)]*)\))?", re.I)
_LIMITED = re.compile(rf"(?:pci|nvidia)\s+{_BUS_TEXT}:\s*([\d.]+ [GMT]b/s) available PCIe bandwidth, limited by "
                      r"([\d.]+) GT/s PCIe x(\d+) link at ([0-9A-Fa-f:.]+) \(capable of ([\d.]+ [GMT]b/s) with "
                      r"([\d.]+) GT/s PCIe x(\d+) link\)", re.I)
_NVIDIA_DEVICE = re.compile(rf"pci\s+{_BUS_TEXT}:\s*\[10de:[0-9a-f]{{4}}\] type \d+ class 0x(03|0302)", re.I)
_UNREADABLE = re.compile(r"Operation not permitted|Permission denied|read kernel buffer failed|insufficient permissions"
                         r"|No journal files were (found|opened)|^unreadable:", re.I)
_MAX_EVENTS = 500  # a log flooded with one Xid is summarized by the first of them


class XidEvent(_Frozen):
    code: int
    bus: str | None  # as printed inside "(PCI:...)"; None when the author elided it
    message: str
    line: str
    word: str | None = None  # "fatal" / "nonfatal", where the message says it (NVLink5 Xids)
    previous: int | None = None  # "caused by previous Xid N"
    recovery: str | None = None  # Xid 154: the new recovery action, e.g. "0x2 (Node Reboot Required)"


class LostGpu(_Frozen):
    bus: str
    how: str  # "fallen off the bus", "GPU is lost", "RmInitAdapter failed"
    line: str


class SxidEvent(_Frozen):
    switch: str | None = None
    bus: str
    code: int
    message: str


class PcieLimited(_Frozen):
    bus: str
    limited_gts: float
    limited_width: int
    capable_gts: float
    capable_width: int
    at: str  # the upstream link that limits it
    line: str


class KernelGpuEvents(_Parsed):
    xids: list[XidEvent] = []
    lost: list[LostGpu] = []
    sxids: list[SxidEvent] = []
    pcie_limited: list[PcieLimited] = []
    nvidia_devices: list[str] = []  # buses the PCI core enumerated as NVIDIA display/3D controllers
    readable: bool = True
    logical_lines: int = 0


def _logical(lines: list[str]) -> list[str]:
    """Join the driver's continuation lines ("               NVRM: fallen off the bus ...") to the line
    they continue; the timestamp and host columns of the first are kept."""
    out: list[str] = []
    for line in lines:
        if out and line[:1] in (" ", "\t") and line.strip().startswith("NVRM:") and "NVRM" in out[-1] \
                and len(out[-1]) < 4096:
            out[-1] = out[-1].rstrip() + " " + _PREFIX.sub("", line.strip(), count=1)
        else:
            out.append(line)
    return out


_THE_GPU = re.compile(rf"(?:The NVIDIA GPU|GPU)\s+(?:at\s+PCI:)?{_BUS_TEXT}\b")


def _earlier_address(lines: list[str], k: int) -> str | None:
    """The GPU a message split over lines names on one of the two before ("NVRM: The NVIDIA GPU 0000:b3:00.0",
    then "NVRM: (PCI ID: ...) installed in this system has", then "NVRM: fallen off the bus ...")."""
    for line in reversed(lines[max(0, k - 2):k]):
        if "NVRM" in line and (m := _THE_GPU.search(line[:2000])):
            return m.group(1)
    return None


def _xid(match: re.Match, line: str) -> XidEvent:
    code = int(match.group(2))
    message = (match.group(3) or "").strip()[:600]
    for prefix in (r"pid=('[^']*'|[^,]*),\s*", r"name=([^,]*),\s*"):
        if m := re.match(prefix, message):
            message = message[m.end():]
    word = _WORD.search(message) if 144 <= code <= 150 else None
    previous = _PREVIOUS.search(message)
    recovery = _RECOVERY.search(message) if code == 154 else None
    return XidEvent(code=code, bus=match.group(1).strip() or None, message=message[:300], line=quote(line),
                    word=None if word is None else word.group(1).lower().replace("-", ""),
                    previous=int(previous.group(1)) if previous else None,
                    recovery=(f"{recovery.group(2)}" + (f" ({recovery.group(3)})" if recovery.group(3) else ""))
                    if recovery else None)


def _parse(text: str) -> KernelGpuEvents:
    problems, notes = _Problems(), []
    out: dict[str, list] = {"xids": [], "lost": [], "sxids": [], "pcie_limited": [], "nvidia_devices": []}
    readable = True
    lines = [line[:8192] for line in _logical(_lines(text))]  # no kernel message is longer
    for k, line in enumerate(lines):
        if not line.strip():
            continue
        if _UNREADABLE.search(line) and not (line.lstrip().startswith("[") or " kernel: " in line or "NVRM" in line):
            readable = False
            notes.append(f"kernel log not readable: {quote(line)}")
            continue
        if "Xid" in line:
            if m := _XID.search(line):
                if len(out["xids"]) < _MAX_EVENTS:
                    out["xids"].append(_xid(m, line))
                if m.group(2) == "79" and len(out["lost"]) < _MAX_EVENTS:  # Xid 79 is "fallen off the bus" by code
                    out["lost"].append(LostGpu(bus=m.group(1).strip(), how="fallen off the bus (Xid 79)", line=quote(line)))
                    continue
            elif m := _SXID.search(line):
                if len(out["sxids"]) < _MAX_EVENTS:
                    out["sxids"].append(SxidEvent(switch=m.group(1), bus=m.group(2).strip(), code=int(m.group(3)),
                                                  message=(m.group(4) or "").strip()[:300]))
            elif "NVRM: Xid" in line or "SXid (" in line:
                problems.add("unreadable Xid line", line)
        low = line.lower()
        if any(word in low for word in _HOW) and len(out["lost"]) < _MAX_EVENTS:
            if m := _LOST.search(line[:2000]):
                out["lost"].append(LostGpu(bus=m.group(1), how=_HOW[m.group(2).lower()], line=quote(line)))
            elif "fallen off the bus" in low:  # the driver's words, the address on an earlier line or none
                bus = _earlier_address(lines, k)
                out["lost"].append(LostGpu(bus=bus or "", how="fallen off the bus" + ("" if bus else " (address not shown)"),
                                           line=quote(line)))
        if "limited by" in line and (m := _LIMITED.search(line)):
            out["pcie_limited"].append(PcieLimited(
                bus=m.group(1), limited_gts=float(m.group(3)), limited_width=int(m.group(4)), at=m.group(5),
                capable_gts=float(m.group(7)), capable_width=int(m.group(8)), line=quote(line)))
        if "[10de:" in line and (m := _NVIDIA_DEVICE.search(line)):
            out["nvidia_devices"].append(m.group(1))
    if not text.strip():
        notes.append("empty kernel log")
    return KernelGpuEvents(**out, readable=readable, logical_lines=len(lines), problems=problems.done(), notes=notes)


def parse_kernel_gpu_events(text: Text) -> KernelGpuEvents:
    """Xid, lost-GPU, SXid and PCIe-bandwidth lines of a kernel log."""
    return _guard(_parse, text, lambda p: KernelGpuEvents(problems=[p]))
