"""Parsers for the acceptance quick checks: fabric manager, PCIe ACS, processes, kernel modules, CPU
frequency and clock source, NVMe controllers, kernel log events (link flaps, I/O errors, hung tasks),
`nvidia-smi -q` settings (persistence, clocks, VBIOS, MIG, GSP, fabric, processes) and `dcgmi diag -j`.

Same contract as system.py: text (str, bytes or None) in, a model out, never an exception; lines not
understood are quoted in `problems`, facts worth saying in `notes`."""

from __future__ import annotations

import re
from typing import Any

from trainready.io import parse_json

from .system import Text, _command_missing, _float, _Frozen, _guard, _int, _lines, _Parsed, _Problems, _text, quote

_MAX_EVENTS = 200  # a log that floods one error is summarized, not copied whole

# ---------------------------------------------------------------- nvidia-smi -q: settings per GPU


class GpuSettings(_Frozen):
    """What `nvidia-smi -q` says of one GPU's configuration (None: not printed, or N/A)."""

    index: int
    bus_id: str | None
    persistence: str | None = None  # Enabled / Disabled
    mig_current: str | None = None
    mig_pending: str | None = None
    vbios: str | None = None
    gsp_firmware: str | None = None  # a version when GSP runs the GPU, N/A when it does not
    app_graphics_mhz: int | None = None
    app_memory_mhz: int | None = None
    default_app_graphics_mhz: int | None = None
    default_app_memory_mhz: int | None = None
    max_graphics_mhz: int | None = None
    fabric_state: str | None = None  # Hopper and later with NVSwitch: Completed / In Progress / Not Started
    fabric_status: str | None = None
    # power limits, W: the one in force, the one nvidia-smi -pl asked for, the board's default. Drivers from
    # ~525 print "GPU Power Readings" with Current/Requested/Default; older ones "Power Readings" with
    # Enforced (in force)/Power Limit (asked)/Default
    power_limit_w: float | None = None
    power_requested_w: float | None = None
    power_default_w: float | None = None


_NA = {"n/a", "not supported", "unknown error", "insufficient permissions", "requested functionality has been deprecated", ""}


def _value(fields: dict[str, str], *keys: str) -> str | None:
    lowered = {k.lower(): v for k, v in fields.items()}
    for key in keys:
        value = lowered.get(key.lower())
        if value is not None:
            return None if value.strip().lower() in _NA else value.strip()
    return None


def _mhz(value: str | None) -> int | None:
    if value is None:
        return None
    match = re.match(r"([0-9]{1,6})\s*MHz", value)
    return int(match.group(1)) if match else None


def _watts(value: str | None) -> float | None:
    if value is None:
        return None
    match = re.fullmatch(r"([0-9]{1,7}(?:\.[0-9]{1,3})?)\s*W", value)
    watts = float(match.group(1)) if match else None
    return watts if watts is not None and 0 < watts <= 10_000 else None  # 0 or beyond any board: not a reading


def gpu_settings(smi_q: Any) -> list[GpuSettings]:
    """Per-GPU settings from a parsed `nvidia-smi -q` (parsers.nvsmi.SmiQ); [] for anything else."""
    out = []
    for gpu in getattr(smi_q, "gpus", None) or []:
        f = gpu.fields
        out.append(GpuSettings(
            index=gpu.index, bus_id=gpu.bus_id, persistence=_value(f, "Persistence Mode"),
            mig_current=_value(f, "MIG Mode/Current"), mig_pending=_value(f, "MIG Mode/Pending"),
            vbios=_value(f, "VBIOS Version"), gsp_firmware=f.get("GSP Firmware Version", "").strip() or None,
            app_graphics_mhz=_mhz(_value(f, "Applications Clocks/Graphics")),
            app_memory_mhz=_mhz(_value(f, "Applications Clocks/Memory")),
            default_app_graphics_mhz=_mhz(_value(f, "Default Applications Clocks/Graphics")),
            default_app_memory_mhz=_mhz(_value(f, "Default Applications Clocks/Memory")),
            max_graphics_mhz=_mhz(_value(f, "Max Clocks/Graphics")),
            fabric_state=_value(f, "Fabric/State"), fabric_status=_value(f, "Fabric/Status"),
            power_limit_w=_watts(_value(f, "GPU Power Readings/Current Power Limit",
                                        "Power Readings/Enforced Power Limit")),
            power_requested_w=_watts(_value(f, "GPU Power Readings/Requested Power Limit",
                                            "Power Readings/Power Limit")),
            power_default_w=_watts(_value(f, "GPU Power Readings/Default Power Limit",
                                          "Power Readings/Default Power Limit"))))
    return out


# ---------------------------------------------------------------- GPU processes


class GpuProcess(_Frozen):
    pid: int
    name: str | None = None
    gpu: str | None = None  # bus id, or the GPU's position in nvidia-smi -q
    used_mib: int | None = None


class GpuProcesses(_Parsed):
    processes: list[GpuProcess] = []


_Q_GPU_LINE = re.compile(r"GPU [0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{1,2}:[0-9A-Fa-f]{1,2}\.[0-9A-Fa-f]")
_KV = re.compile(r"\s{0,40}([A-Za-z][A-Za-z ]{0,40}?)\s{0,60}:\s?(.{0,300})")


def _parse_q_processes(text: str) -> GpuProcesses:
    processes: list[dict[str, Any]] = []
    gpu = None
    for line in _lines(text):
        stripped = line.strip()
        if _Q_GPU_LINE.fullmatch(stripped):
            gpu = stripped[4:]
            continue
        match = _KV.fullmatch(line[:400])
        if match is None:
            continue
        key, value = match.group(1).strip().lower(), match.group(2).strip()
        if key == "process id":
            pid = _int(value)
            if pid is not None and len(processes) < _MAX_EVENTS:
                processes.append({"pid": pid, "gpu": gpu})
        elif processes and key == "name" and "name" not in processes[-1]:
            processes[-1]["name"] = value[:120]
        elif processes and key == "used gpu memory":
            processes[-1]["used_mib"] = _int(value.split()[0]) if value.split() else None
    return GpuProcesses(processes=[GpuProcess(**p) for p in processes])


def parse_smi_q_processes(text: Text) -> GpuProcesses:
    """The Processes blocks of `nvidia-smi -q` (PID, name, memory per GPU)."""
    return _guard(_parse_q_processes, text, lambda p: GpuProcesses(problems=[p]))


def _parse_compute_apps(text: str) -> GpuProcesses:
    problems = _Problems()
    header: list[str] | None = None
    processes = []
    for line in _lines(text):
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        if header is None:
            header = [(c[:c.index("[")] if c.endswith("]") and "[" in c else c).strip().lower() for c in cells]
            if "pid" not in header:
                problems.add("not a --query-compute-apps CSV header", line)
                header = None
            continue
        row = dict(zip(header, cells, strict=False))
        pid = _int(row.get("pid"))
        if pid is None:
            problems.add("no PID in this row", line)
            continue
        used = row.get("used_memory") or row.get("used_gpu_memory") or ""
        if len(processes) < _MAX_EVENTS:
            processes.append(GpuProcess(pid=pid, name=(row.get("process_name") or row.get("name") or None),
                                        gpu=row.get("gpu_bus_id") or row.get("gpu_uuid") or None,
                                        used_mib=_int(used.split()[0]) if used.split() else None))
    return GpuProcesses(processes=processes, problems=problems.done())


def parse_compute_apps(text: Text) -> GpuProcesses:
    """`nvidia-smi --query-compute-apps=gpu_bus_id,pid,process_name,used_memory --format=csv`."""
    return _guard(_parse_compute_apps, text, lambda p: GpuProcesses(problems=[p]))


class PsEntry(_Frozen):
    pid: int
    ppid: int | None = None
    user: str | None = None
    stat: str = ""
    elapsed_s: int | None = None
    command: str = ""


class Ps(_Parsed):
    entries: list[PsEntry] = []

    def by_pid(self) -> dict[int, PsEntry]:
        return {e.pid: e for e in self.entries}

    def d_state(self) -> list[PsEntry]:
        return [e for e in self.entries if e.stat.startswith("D")]


def _parse_ps(text: str) -> Ps:
    problems = _Problems()
    entries = []
    for line in _lines(text):
        cells = line.split(None, 5)
        if not cells or cells[0] == "PID":
            continue
        if len(cells) < 6 or _int(cells[0]) is None:
            problems.add("not a `ps -eo pid,ppid,user,stat,etimes,comm` line", line)
            continue
        entries.append(PsEntry(pid=_int(cells[0]), ppid=_int(cells[1]), user=cells[2][:64], stat=cells[3][:8],
                               elapsed_s=_int(cells[4]), command=cells[5].strip()[:120]))
    return Ps(entries=entries, problems=problems.done())


def parse_ps(text: Text) -> Ps:
    """`ps -eo pid,ppid,user,stat,etimes,comm`."""
    return _guard(_parse_ps, text, lambda p: Ps(problems=[p]))


# ---------------------------------------------------------------- fabric manager


class FabricManager(_Parsed):
    installed: bool | None = None  # False: systemd knows no such unit
    active: str | None = None  # the Active: line's state word: active, inactive, failed, activating
    detail: str | None = None  # the rest of the Active: line, e.g. "(running) since ..."
    errors: list[str] = []  # journal lines that say why it failed
    nothing_to_do: bool = False  # NV_WARN_NOTHING_TO_DO: the fabric manager found no NVSwitch to manage
    from_journal: bool = False  # `active` read from journal lines (a paste of journalctl), not an Active: line


_FM_ERROR = re.compile(r"NV_WARN_NOTHING_TO_DO|NV_ERR_|failed|error|Failed|don't match|cannot be started", re.I)
# journal lines (journalctl -u, a failed `systemctl restart`) that say the service failed or started
_FM_FAILED = re.compile(r"Job for nvidia-fabricmanager\S* failed|Failed to start .{0,40}fabric ?manager|"
                        r"fabricmanager\S*: (?:Failed with result|Control process exited, code=exited, status=[1-9])|"
                        r"fabric manager cannot be started|don't match with driver version", re.I)
_FM_STARTED = re.compile(r"Started (?:nvidia-fabricmanager|NVIDIA fabric manager)", re.I)
_JOURNAL_PREFIX = re.compile(r"^.{0,80}?\]: ")


def _parse_fm_status(text: str) -> FabricManager:
    installed = active = detail = journal = None
    errors: list[str] = []
    notes = []
    lines = _lines(text)
    for line in lines:
        stripped = line.strip()
        if not stripped:
            continue
        if "could not be found" in stripped and "Unit" in stripped:
            installed = False
            notes.append(quote(stripped))
            continue
        key, sep, value = stripped.partition(":")
        if sep and key in ("Active", "Loaded"):
            if key == "Loaded":
                installed = not value.strip().startswith("not-found")
            else:
                word, _, rest = value.strip().partition(" ")
                active, detail = word or None, rest.strip()[:160] or None
            continue
        if _FM_FAILED.search(stripped[:400]):
            journal = "failed"
        elif _FM_STARTED.search(stripped[:400]) and journal != "failed":
            journal = "active"
        if _FM_ERROR.search(stripped[:400]) and len(errors) < 12 and ("fabricmanager" in stripped or "nv-fabric" in stripped
                                                                     or "systemd" in stripped or "fabric manager" in stripped):
            message = _JOURNAL_PREFIX.sub("", stripped[:400], count=1)  # "Sep 18 03:19:01 host unit[pid]: "
            errors.append(message[:200] + ("..." if len(message) > 200 else ""))
    errors.sort(key=lambda e: "NV_" not in e)  # the driver's own error code first: it says why
    from_journal = active is None and journal is not None
    if from_journal:
        active = journal
    if active is not None and installed is None:
        installed = True
    if _command_missing(lines, "systemctl"):
        notes.append("systemctl not available (no systemd, e.g. in a container)")
    return FabricManager(installed=installed, active=active, detail=detail, errors=errors, notes=notes,
                         nothing_to_do="NV_WARN_NOTHING_TO_DO" in text, from_journal=from_journal)


def parse_fabricmanager_status(text: Text) -> FabricManager:
    """`systemctl status nvidia-fabricmanager` (stdout and stderr)."""
    return _guard(_parse_fm_status, text, lambda p: FabricManager(problems=[p]))


class NvswitchError(_Frozen):
    code: int | None = None
    fatal: bool | None = None
    switch: str | None = None  # NVSwitch PCI bus id
    line: str = ""


class FabricManagerLog(_Parsed):
    errors: list[NvswitchError] = []  # NVSwitch errors the fabric manager logged
    other_errors: list[str] = []
    running: bool = False  # it logged configuring the NVSwitches or serving NVLink multicast (it ran)


_FM_NVSWITCH = re.compile(r"detected NVSwitch (non-fatal|fatal) error (\d{1,6})", re.I)
_FM_BUS = re.compile(r"pci bus id ([0-9A-Fa-f:.]{7,20})", re.I)


_FM_RUNNING = re.compile(r"Successfully configured all the available NVSwitches|successfully setup multicast team", re.I)


def _parse_fm_log(text: str) -> FabricManagerLog:
    errors, others = [], []
    running = False
    for line in _lines(text):
        head = line[:600]
        if _FM_RUNNING.search(head):
            running = True
        if "[ERROR]" not in head and "[WARNING]" not in head and "NVSwitch" not in head:
            continue
        match = _FM_NVSWITCH.search(head)
        if match and len(errors) < _MAX_EVENTS:
            bus = _FM_BUS.search(head)
            errors.append(NvswitchError(code=_int(match.group(2)), fatal=match.group(1).lower() == "fatal",
                                        switch=bus.group(1) if bus else None, line=quote(line)))
        elif "[ERROR]" in head and len(others) < 12:
            others.append(quote(line))
    return FabricManagerLog(errors=errors, other_errors=others, running=running)


def parse_fabricmanager_log(text: Text) -> FabricManagerLog:
    """/var/log/fabricmanager.log (the [ERROR] / [WARNING] lines are enough)."""
    return _guard(_parse_fm_log, text, lambda p: FabricManagerLog(problems=[p]))


# ---------------------------------------------------------------- lspci -vvv: PCIe ACS


class PciDevice(_Frozen):
    address: str  # [domain:]bus:device.function as lspci prints it
    description: str = ""
    secondary: int | None = None  # bridges: the bus range below them
    subordinate: int | None = None
    acs_ctl: dict[str, bool] | None = None  # ACSCtl flags: SrcValid, ReqRedir, CmpltRedir, ...
    caps_denied: bool = False  # "Capabilities: <access denied>": lspci ran without root

    @property
    def bus(self) -> int | None:
        parts = self.address.split(":")
        return _hex(parts[-2]) if len(parts) >= 2 else None

    @property
    def domain(self) -> str:
        parts = self.address.split(":")
        return parts[0].lower() if len(parts) == 3 else "0000"

    @property
    def is_gpu(self) -> bool:
        d = self.description
        return "NVIDIA" in d and ("3D controller" in d or "VGA compatible controller" in d)

    @property
    def is_nic(self) -> bool:
        d = self.description
        return "Elastic Fabric Adapter" in d or ("Mellanox" in d and ("Infiniband" in d or "Ethernet" in d))


class Lspci(_Parsed):
    devices: list[PciDevice] = []

    def path_bridges(self) -> list[tuple[PciDevice, list[PciDevice]]]:
        """Each bridge with an ACS control register, and the GPUs / RDMA NICs below it."""
        endpoints = [d for d in self.devices if d.is_gpu or d.is_nic]
        out = []
        for bridge in self.devices:
            if bridge.acs_ctl is None or bridge.secondary is None or bridge.subordinate is None:
                continue
            below = [e for e in endpoints if e.domain == bridge.domain and e.bus is not None
                     and bridge.secondary <= e.bus <= bridge.subordinate]
            out.append((bridge, below))
        return out


_PCI_HEAD = re.compile(r"((?:[0-9a-fA-F]{4}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]) (.{1,300})")
_BUS_RANGE = re.compile(r"primary=([0-9a-fA-F]{2}),\s*secondary=([0-9a-fA-F]{2}),\s*subordinate=([0-9a-fA-F]{2})")
_ACS_FLAG = re.compile(r"([A-Za-z]{2,20})([+-])")


def _hex(value: str) -> int | None:
    try:
        return int(value, 16)
    except ValueError:
        return None


def _parse_lspci(text: str) -> Lspci:
    devices: list[dict[str, Any]] = []
    notes = []
    for line in _lines(text):
        if not line.strip():
            continue
        if not line[:1].isspace():
            head = _PCI_HEAD.fullmatch(line.strip()[:320])
            if head:
                devices.append({"address": head.group(1).lower(), "description": head.group(2)[:200]})
            continue
        if not devices:
            continue
        stripped = line.strip()[:400]
        if stripped.startswith("Bus:"):
            match = _BUS_RANGE.search(stripped)
            if match:
                devices[-1]["secondary"] = _hex(match.group(2))
                devices[-1]["subordinate"] = _hex(match.group(3))
        elif stripped.startswith("ACSCtl:"):
            devices[-1]["acs_ctl"] = {flag: sign == "+" for flag, sign in _ACS_FLAG.findall(stripped[7:])}
        elif stripped.startswith("Capabilities: <access denied>"):
            devices[-1]["caps_denied"] = True
    built = [PciDevice(**d) for d in devices]
    if built and all(d.caps_denied for d in built if d.description.startswith(("PCI bridge", "Host bridge"))) \
            and any(d.caps_denied for d in built):
        notes.append("lspci ran without root: capabilities (ACS) not shown")
    return Lspci(devices=built, notes=notes)


def parse_lspci(text: Text) -> Lspci:
    """`lspci -vvv`: devices, bridges' bus ranges and ACS control flags."""
    return _guard(_parse_lspci, text, lambda p: Lspci(problems=[p]))


# ---------------------------------------------------------------- small /proc and /sys files


class Modules(_Parsed):
    names: list[str] = []


def _parse_modules(text: str) -> Modules:
    names = []
    for line in _lines(text):
        cells = line.split()
        if cells and re.fullmatch(r"[A-Za-z0-9_-]{1,64}", cells[0]):
            names.append(cells[0])
    return Modules(names=names)


def parse_modules(text: Text) -> Modules:
    """/proc/modules (or `lsmod`): loaded kernel module names."""
    return _guard(_parse_modules, text, lambda p: Modules(problems=[p]))


class CpuFreq(_Parsed):
    governors: dict[str, int] = {}  # governor -> how many CPUs use it
    exposed: bool | None = None  # False: no cpufreq (the hypervisor controls frequency)


def _parse_cpufreq(text: str) -> CpuFreq:
    problems = _Problems()
    counts: dict[str, int] = {}
    exposed = None
    for line in _lines(text):
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("absent"):
            exposed = False
            continue
        cpu, sep, governor = stripped.partition(" ")
        if re.fullmatch(r"cpu[0-9]{1,5}", cpu) and sep and re.fullmatch(r"[a-z_]{1,32}", governor.strip()):
            counts[governor.strip()] = counts.get(governor.strip(), 0) + 1
            exposed = True
        else:
            problems.add("not a `cpuN governor` line", line)
    return CpuFreq(governors=counts, exposed=exposed, problems=problems.done())


def parse_cpufreq(text: Text) -> CpuFreq:
    """cpufreq.txt: `cpuN GOVERNOR` per CPU, or `absent: why`."""
    return _guard(_parse_cpufreq, text, lambda p: CpuFreq(problems=[p]))


class ClockSource(_Parsed):
    current: str | None = None
    available: list[str] = []


def _parse_clocksource(text: str) -> ClockSource:
    current, available = None, []
    problems = _Problems()
    for line in _lines(text):
        key, sep, value = line.strip().partition(":")
        if not line.strip():
            continue
        if sep and key == "current" and re.fullmatch(r"[A-Za-z0-9_.-]{1,40}", value.strip()):
            current = value.strip()
        elif sep and key == "available":
            available = [v for v in value.split() if re.fullmatch(r"[A-Za-z0-9_.-]{1,40}", v)][:20]
        else:
            problems.add("not a `current:`/`available:` line", line)
    return ClockSource(current=current, available=available, problems=problems.done())


def parse_clocksource(text: Text) -> ClockSource:
    """clocksource.txt: `current: tsc` and `available: tsc hpet acpi_pm`."""
    return _guard(_parse_clocksource, text, lambda p: ClockSource(problems=[p]))


class NvmeDevices(_Parsed):
    controllers: dict[str, str] = {}  # nvme0 -> model

    @property
    def instance_store(self) -> list[str]:
        return sorted(n for n, m in self.controllers.items() if "Instance Storage" in m)

    @property
    def ebs(self) -> list[str]:
        return sorted(n for n, m in self.controllers.items() if "Elastic Block Store" in m)


def _parse_nvme(text: str) -> NvmeDevices:
    problems = _Problems()
    controllers: dict[str, str] = {}
    for line in _lines(text):
        name, _, model = line.strip().partition(" ")
        if not line.strip():
            continue
        if re.fullmatch(r"nvme[0-9]{1,4}", name):
            controllers[name] = model.strip()[:80]
        else:
            problems.add("not an `nvmeN MODEL` line", line)
    return NvmeDevices(controllers=controllers, problems=problems.done())


def parse_nvme_devices(text: Text) -> NvmeDevices:
    """nvme-devices.txt: `nvmeN MODEL` per NVMe controller (/sys/class/nvme/*/model)."""
    return _guard(_parse_nvme, text, lambda p: NvmeDevices(problems=[p]))


def kernel_release(text: Text) -> tuple[int, int] | None:
    """(major, minor) of `uname -r` output; None when unreadable."""
    try:
        match = re.match(r"\s*([0-9]{1,3})\.([0-9]{1,3})", _text(text))
        return (int(match.group(1)), int(match.group(2))) if match else None
    except Exception:
        return None


# ---------------------------------------------------------------- kernel log events


class KernelEvents(_Parsed):
    readable: bool = True
    link_down: dict[str, int] = {}  # device -> how many times its link went down / lost carrier
    nic_errors: dict[str, list[str]] = {}  # EFA / mlx5 driver error lines by device
    io_errors: dict[str, int] = {}  # block device -> I/O error lines
    io_timeouts: dict[str, int] = {}  # NVMe controller -> command timeouts
    hung_tasks: list[str] = []
    peermem_errors: int = 0
    evidence: list[str] = []  # a few lines, quoted


_UNREADABLE = re.compile(r"^(unreadable:|dmesg: read kernel buffer failed)|Operation not permitted", re.I)
_LOST_CARRIER = re.compile(r"\b([A-Za-z0-9_.-]{1,32}): (?:lost carrier|Link is Down|link down|link becomes not ready)", re.I)
_MLX_LINK = re.compile(r"mlx5_core ([0-9a-fA-F:.]{7,20})(?: ([A-Za-z0-9_.-]{1,32}))?: .{0,80}?Link (?:down|is down)", re.I)
_NIC_DRIVER = re.compile(r"\b(efa|mlx5_core|mlx5_ib) ([0-9a-fA-F:.]{7,20})(?: ([A-Za-z0-9_.-]{1,32}))?: (.{0,200})")
_NIC_BAD = re.compile(r"fail|error|timeout|timed out|unresponsive|reset|fatal", re.I)
_IO_ERROR = re.compile(r"(?:I/O error, dev|Buffer I/O error on dev(?:ice)?) ([A-Za-z0-9_.-]{1,32})")
_FS_ERROR = re.compile(r"(?:EXT4-fs error \(device |XFS \()([A-Za-z0-9_.-]{1,32})\)")
_NVME_TIMEOUT = re.compile(r"nvme (nvme[0-9]{1,4}): I/O .{0,40}?timeout")
_HUNG = re.compile(r"task (\S{1,40}) blocked for more than [0-9]{1,7} seconds|blocked for more than [0-9]{1,7} seconds")


def _parse_kernel_events(text: str) -> KernelEvents:
    link: dict[str, int] = {}
    nic: dict[str, list[str]] = {}
    io: dict[str, int] = {}
    timeouts: dict[str, int] = {}
    hung: list[str] = []
    evidence: list[str] = []
    peermem = 0
    readable = True
    notes = []

    def keep(line: str) -> None:
        if len(evidence) < 12:
            evidence.append(quote(line))

    for raw in _lines(text):
        line = raw[:600]
        if not line.strip():
            continue
        if _UNREADABLE.search(line.strip()) and "kernel:" not in line and not line.lstrip().startswith("["):
            readable = False
            notes.append(f"kernel log not readable: {quote(line)}")
            continue
        if m := _LOST_CARRIER.search(line):
            link[m.group(1)] = link.get(m.group(1), 0) + 1
            keep(line)
        elif m := _MLX_LINK.search(line):
            device = m.group(2) or m.group(1)
            link[device] = link.get(device, 0) + 1
            keep(line)
        elif (m := _NIC_DRIVER.search(line)) and _NIC_BAD.search(m.group(4)):
            device = m.group(3) or m.group(2)
            if len(nic.get(device, [])) < 5:
                nic.setdefault(device, []).append(quote(line))
            keep(line)
        if m := _IO_ERROR.search(line) or _FS_ERROR.search(line):
            io[m.group(1)] = io.get(m.group(1), 0) + 1
            keep(line)
        elif m := _NVME_TIMEOUT.search(line):
            timeouts[m.group(1)] = timeouts.get(m.group(1), 0) + 1
            keep(line)
        if m := _HUNG.search(line):
            if len(hung) < 12:
                hung.append(m.group(1) or quote(line))
            keep(line)
        if "nvidia-peermem" in line and "ERROR" in line:
            peermem += 1
    return KernelEvents(readable=readable, link_down=link, nic_errors=nic, io_errors=io, io_timeouts=timeouts,
                        hung_tasks=hung, peermem_errors=peermem, evidence=evidence, notes=notes)


def parse_kernel_events(text: Text) -> KernelEvents:
    """kernel-log.txt (`dmesg` lines about NICs, block devices, hung tasks), or `unreadable: why`."""
    return _guard(_parse_kernel_events, text, lambda p: KernelEvents(problems=[p]))


# ---------------------------------------------------------------- dcgmi diag -j


class DcgmResult(_Frozen):
    category: str | None = None
    test: str
    status: str  # Pass, Fail, Warn, Skip, ... as DCGM wrote it
    gpus: list[str] = []
    messages: list[str] = []


class DcgmDiag(_Parsed):
    version: str | None = None
    results: list[DcgmResult] = []
    overall: str | None = None
    runtime_error: str | None = None


def _strings(value: Any, limit: int = 6) -> list[str]:
    """Messages of a warnings/info field: a string, a list of strings, or dicts with a `warning`/`message`."""
    out: list[str] = []
    items = value if isinstance(value, list) else [value]
    for item in items[:limit]:
        if isinstance(item, dict):
            item = item.get("warning") or item.get("message") or item.get("info") or ""
        if isinstance(item, str) and item.strip():
            out.append(quote(item))
    return out


def _gpu_ids(result: dict[str, Any]) -> list[str]:
    for key in ("gpu_ids", "gpu_id", "entity_id"):
        value = result.get(key)
        if isinstance(value, (str, int)) and not isinstance(value, bool):
            return [v.strip() for v in str(value).split(",") if v.strip()][:64]
    return []


def _dcgm_tests(node: Any, category: str | None, out: list[DcgmResult], depth: int = 0) -> None:
    if depth > 12 or len(out) >= _MAX_EVENTS:
        return
    if isinstance(node, list):
        for item in node[:_MAX_EVENTS]:
            _dcgm_tests(item, category, out, depth + 1)
        return
    if not isinstance(node, dict):
        return
    if isinstance(node.get("category"), str):
        category = node["category"]
    name, results = node.get("name"), node.get("results")
    if isinstance(name, str) and isinstance(results, list):
        for result in results[:64]:
            if not isinstance(result, dict) or not isinstance(result.get("status"), str):
                continue
            messages = _strings(result.get("warnings", [])) + _strings(result.get("info", []))
            out.append(DcgmResult(category=category, test=name[:80], status=result["status"][:20],
                                  gpus=_gpu_ids(result), messages=messages[:6]))
        return
    for key, value in node.items():
        if key in ("tests", "test_categories") or isinstance(value, (dict, list)):
            _dcgm_tests(value, category, out, depth + 1)


def _parse_dcgm(text: str) -> DcgmDiag:
    problems = _Problems()
    try:
        data = parse_json(text)
    except (ValueError, RecursionError):
        first = next((line for line in _lines(text) if line.strip()), "")
        problems.add("not JSON (dcgmi diag -j)", first)
        return DcgmDiag(problems=problems.done())
    if not isinstance(data, dict):
        return DcgmDiag(problems=["dcgmi diag output is not a JSON object"])
    results: list[DcgmResult] = []
    _dcgm_tests(data, None, results)
    version = data.get("version") or data.get("DCGM Version")
    overall = data.get("Overall Result")
    diag = data.get("DCGM GPU Diagnostic")
    if overall is None and isinstance(diag, dict):
        overall = diag.get("Overall Result")
    runtime = data.get("runtime_error")
    for key in ("DCGM Diagnostic", "DCGM GPU Diagnostic"):  # DCGM 4 keeps it inside the diagnostic object
        if runtime is None and isinstance(data.get(key), dict):
            runtime = data[key].get("runtime_error")
    if version is None and isinstance(data.get("metadata"), dict):
        version = data["metadata"].get("version") or data["metadata"].get("DCGM Version")
    return DcgmDiag(version=str(version)[:40] if isinstance(version, (str, int, float)) else None,
                    results=results, overall=str(overall)[:40] if isinstance(overall, str) else None,
                    runtime_error=quote(runtime) if isinstance(runtime, str) else None, problems=problems.done())


def parse_dcgm_diag(text: Text) -> DcgmDiag:
    """`dcgmi diag -r N -j` output, DCGM 3 (test_categories) or DCGM 4 (tests with entity results)."""
    return _guard(_parse_dcgm, text, lambda p: DcgmDiag(problems=[p]))


def gbps(value: Any) -> float | None:
    """A bandwidth from deep.json: a finite, non-negative number, else None."""
    number = _float(value) if not isinstance(value, bool) else None
    return number if number is not None and number == number and 0 <= number < 1e7 else None


# ---------------------------------------------------------------- dcgmi diag (text table)

_DCGM_SECTION = re.compile(r"[|+]-{2,}\s+([A-Za-z][A-Za-z ]{0,30}?)\s+-{2,}")
_DCGM_STATUS = re.compile(r"(Pass|Fail|Skip|Warn|Not Run|Error)\b\s*(?:-\s*(.*))?", re.I)
_DCGM_GPU_STATUS = re.compile(r"GPU\s*(\d{1,3}):\s*(Pass|Fail|Skip|Warn|Not Run)\b", re.I)
_DCGM_META = {"dcgm version": "version", "driver version detected": "driver", "gpu device ids detected": "devices"}


def _dcgm_gpus(detail: str | None) -> list[str]:
    """"All", "GPU: 0", "GPUs: 1, 2, 3" -> GPU ids ([] for All)."""
    if not detail or detail.strip().lower().startswith("all"):
        return []
    return re.findall(r"\d{1,3}", detail)[:64]


def _parse_dcgm_text(text: str) -> DcgmDiag:
    """The box table `dcgmi diag -r N` prints (DCGM 3: "Pass - All", "Fail - GPU: 0"; DCGM 4: a summary
    word and "GPU0: Pass" rows). Wrapped Warning/Info/Error rows are joined into the test above them;
    a row that names no test (a fragment's first line) is kept under "(unnamed)"."""
    results: list[dict[str, Any]] = []
    category: str | None = None
    meta: dict[str, str] = {}
    current: dict[str, Any] | None = None
    message: list[str] | None = None
    for line in _lines(text):
        stripped = line.strip()
        if m := _DCGM_SECTION.match(stripped):
            category, current, message = m.group(1).strip(), None, None
            continue
        cells = stripped[:2000].split("|") if stripped.startswith("|") else []
        if len(cells) < 3:
            if message is not None and stripped and not stripped.startswith("+"):
                message.append(stripped[:300])  # a wrapped line that lost its box (a paste cut mid-row)
            continue
        name, value = cells[1].strip()[:80], cells[2].strip()[:300]
        if name.lower() in ("diagnostic",) and value.lower() == "result":
            continue
        if name.lower() in _DCGM_META:
            meta[_DCGM_META[name.lower()]] = value
            current = message = None
            continue
        if name.lower() in ("warning", "info", "error"):
            if current is None:  # a fragment that starts with the message: its test is not shown
                current = {"category": category, "test": "(unnamed)", "status": "fail" if name.lower() == "error" else "warn",
                           "gpus": [], "messages": []}
                results.append(current)
            message = [f"{name}: {value}"]
            current["messages"].append(message)
            continue
        if not name:
            gpu = _DCGM_GPU_STATUS.fullmatch(value)
            status = _DCGM_STATUS.fullmatch(value)
            if current is not None and (gpu or (status and message is None)):
                if gpu:
                    current.setdefault("per_gpu", []).append((gpu.group(1), gpu.group(2)))
                elif status:
                    current.setdefault("extra", []).append((status.group(1), _dcgm_gpus(status.group(2))))
                message = None
            elif message is not None:
                message.append(value)
            continue
        status = _DCGM_STATUS.match(value)
        current = {"category": category, "test": name[:80], "status": status.group(1) if status else value[:20],
                   "gpus": _dcgm_gpus(status.group(2)) if status else [], "messages": []}
        results.append(current)
        message = None
    out = []
    for r in results[:_MAX_EVENTS]:
        messages = [quote(" ".join(m).replace("  ", " ")) for m in r["messages"]][:6]
        base = DcgmResult(category=r["category"], test=r["test"], status=r["status"], gpus=r["gpus"], messages=messages)
        extra = r.get("extra", []) + [(s, [g]) for g, s in r.get("per_gpu", [])]
        out.append(base)
        for status, gpus in extra:  # "Fail - GPU: 0" under "Pass - GPUs: 1, 2": one result per status
            if status.lower() != base.status.lower() or gpus != base.gpus:
                out.append(DcgmResult(category=r["category"], test=r["test"], status=status, gpus=gpus,
                                      messages=messages if status.lower() != "pass" else []))
    notes = [f"DCGM {meta['version']}"] if "version" in meta else []
    problems = [] if out else ["no test rows in dcgmi diag output"]
    return DcgmDiag(version=meta.get("version"), results=out, problems=problems, notes=notes)


def parse_dcgm_diag_text(text: Text) -> DcgmDiag:
    """`dcgmi diag -r N` as printed (the box table people paste)."""
    return _guard(_parse_dcgm_text, text, lambda p: DcgmDiag(problems=[p]))
