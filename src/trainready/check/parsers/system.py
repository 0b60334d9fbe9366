"""Parsers for the system commands `trainready check` reads on a GPU node.

Each parser takes what a command printed (stdout and stderr together is fine, `str`, `bytes` or
None) and never raises: it returns whatever it could read, and quotes each line it could not read
in `problems` (trimmed to 120 characters). A check run on a broken node must report the breakage,
not crash on it, so garbage, truncated, CRLF or foreign output is data, not an exception.

`problems` means "this line was not understood"; `notes` means "understood, and worth saying"
(the tool is not installed, the kernel log was not readable, no device matched).
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict

from trainready.io import parse_json

Text = str | bytes | bytearray | None
R = TypeVar("R")

QUOTE_LIMIT = 120
# Garbage input of megabytes must not become a report of megabytes.
MAX_PROBLEMS = 50


# ---------------------------------------------------------------- shared helpers


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True)


class _Parsed(_Frozen):
    problems: list[str] = []
    notes: list[str] = []


def quote(line: str) -> str:
    """A line as a problem quotes it: stripped, at most 120 characters."""
    s = line.strip()
    return s if len(s) <= QUOTE_LIMIT else s[: QUOTE_LIMIT - 3] + "..."


class _Problems:
    """Collects problem lines, capped so that a flood of garbage stays readable."""

    def __init__(self) -> None:
        self.items: list[str] = []
        self.dropped = 0

    def add(self, reason: str, line: str | None = None) -> None:
        if len(self.items) >= MAX_PROBLEMS:
            self.dropped += 1
            return
        self.items.append(f'{reason}: "{quote(line)}"' if line is not None else reason)

    def done(self) -> list[str]:
        return self.items + ([f"... and {self.dropped} more problem lines"] if self.dropped else [])


def _text(text: object) -> str:
    if text is None:
        return ""
    if isinstance(text, bytes | bytearray):
        return bytes(text).decode("utf-8", errors="replace")
    s = text if isinstance(text, str) else str(text)
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        # lone surrogates (files read with errors="surrogateescape") would make the result unserialisable as JSON
        s = s.encode("utf-8", errors="replace").decode("utf-8")
    return s


def _lines(text: str) -> list[str]:
    # Only CR/LF end a line: str.splitlines() would also split on \x0b, \x1c or \u2028 inside a value.
    return text.replace("\r\n", "\n").replace("\r", "\n").split("\n")


def _int(value: object) -> int | None:
    try:
        if isinstance(value, bool):
            return None
        if isinstance(value, int):
            return value
        if isinstance(value, float):
            return int(value) if value == value and abs(value) != float("inf") else None
        s = str(value).strip()
        return int(s, 0) if s.lower().startswith("0x") else int(s)
    except (ValueError, TypeError, OverflowError):  # includes int()'s 4300-digit limit
        return None


def _float(value: object) -> float | None:
    try:
        return float(str(value).strip())
    except (ValueError, TypeError, OverflowError):
        return None


def _split_kv(line: str) -> tuple[str, str] | None:
    """`key: value` at the first colon; None when there is no colon or no key."""
    key, sep, value = line.partition(":")
    key = key.strip()
    return (key, value.strip()) if sep and key else None


def _uniq(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(i for i in items if i))


_MISSING = re.compile(r"command not found|: not found\s*$|No such file or directory|is not recognized as", re.I)


def _command_missing(lines: list[str], command: str) -> bool:
    """The shell could not run `command` (bash, sh and exec all word this differently)."""
    return any(command in line and _MISSING.search(line) for line in lines[:20] if len(line) < 300)


def _guard(parse: Callable[[str], R], text: Text, fallback: Callable[[str], R]) -> R:
    # Belt and braces: the parsers are written not to raise, and the tests fuzz them to show it;
    # should one still hit a bug, the check reports the output as unread instead of crashing.
    try:
        return parse(_text(text))
    except Exception as exc:  # see above
        return fallback(f"internal parser error ({type(exc).__name__}); output not read")


# ---------------------------------------------------------------- fi_info -p efa


class FiInfoEntry(_Frozen):
    provider: str
    fabric: str | None = None
    domain: str | None = None
    version: str | None = None
    type: str | None = None
    protocol: str | None = None

    @property
    def device(self) -> str | None:
        """The NIC behind the domain: `rdmap16s27-rdm` and `rdmap16s27-dgrm` are one device."""
        return re.sub(r"-(rdm|dgrm|dgram|msg)$", "", self.domain) if self.domain else None


class FiInfo(_Parsed):
    entries: list[FiInfoEntry] = []
    providers: list[str] = []
    fabrics: list[str] = []
    domains: list[str] = []
    efa_devices: list[str] = []
    device_count: int = 0
    versions: list[str] = []
    libfabric_version: str | None = None
    command_missing: bool = False
    no_data: bool = False  # fi_getinfo -61: libfabric runs but no provider matched


_FI_ENTRY_KEYS = {"fabric", "domain", "version", "type", "protocol"}
_FI_GETINFO_ERR = re.compile(r"fi_getinfo:?\s*(-?\d+)\s*(?:\((.*)\))?")


def _parse_fi_info(text: str) -> FiInfo:
    lines = _lines(text)
    problems, notes = _Problems(), []
    entries: list[dict[str, str]] = []
    libfabric_version = None
    no_data = False
    missing = _command_missing(lines, "fi_info")
    for line in lines:
        if not line.strip() or line.strip() == "---":
            continue
        err = _FI_GETINFO_ERR.search(line)
        if err:
            code, msg = err.group(1), err.group(2) or ""
            if code == "-61":
                no_data = True
                notes.append(f"fi_getinfo -61 ({msg or 'No data available'}): "
                             "no libfabric provider matched; no EFA device or driver")
            else:
                notes.append(f"fi_getinfo failed: {quote(line)}")
            continue
        if missing and _MISSING.search(line):
            continue  # the command-missing line itself, counted above
        kv = _split_kv(line)
        if kv is None:
            problems.add("unrecognised fi_info line", line)
            continue
        key, value = kv[0].lower(), kv[1]
        if key == "provider":
            if not value:
                problems.add("provider without a name", line)
            entries.append({"provider": value})
        elif key in ("libfabric", "fi_info") and re.match(r"\d", value):
            libfabric_version = libfabric_version or value  # `fi_info --version`
        elif key in _FI_ENTRY_KEYS:
            if entries:
                entries[-1].setdefault(key, value)
            else:
                problems.add("field before any provider line", line)
        # any other `key: value` (fi_info -v prints dozens) is not ours to judge
    built = [FiInfoEntry(**{k: v for k, v in e.items() if k in _FI_ENTRY_KEYS or k == "provider"}) for e in entries]
    if missing:
        notes.append("fi_info is not installed (EFA software not installed, or not on PATH: /opt/amazon/efa/bin)")
    elif not built and not no_data and not text.strip():
        notes.append("empty output")
    # efa;ofi_rxd style layered names still sit on an EFA device
    efa_devices = _uniq(e.device or "" for e in built if "efa" in e.provider.lower())
    return FiInfo(
        entries=built, providers=_uniq(e.provider for e in built), fabrics=_uniq(e.fabric or "" for e in built),
        domains=_uniq(e.domain or "" for e in built), efa_devices=efa_devices, device_count=len(efa_devices),
        versions=_uniq(e.version or "" for e in built), libfabric_version=libfabric_version,
        command_missing=missing, no_data=no_data, problems=problems.done(), notes=notes)


def parse_fi_info(text: Text) -> FiInfo:
    """`fi_info -p efa [-t FI_EP_RDM]` (or `fi_info --version`)."""
    return _guard(_parse_fi_info, text, lambda p: FiInfo(problems=[p]))


# ---------------------------------------------------------------- ibstat


class IbPort(_Frozen):
    number: int | None = None
    state: str | None = None  # Active, Down, Initializing, Armed
    physical_state: str | None = None  # LinkUp, Polling, Disabled
    rate_gbps: float | None = None
    link_layer: str | None = None  # InfiniBand, Ethernet (RoCE)
    base_lid: int | None = None
    sm_lid: int | None = None
    port_guid: str | None = None

    @property
    def active(self) -> bool:
        # a port is Active only over a link, so a listing without its physical state still reads as up
        return (self.state or "").lower() == "active" and (self.physical_state or "linkup").lower() == "linkup"


class IbCa(_Frozen):
    name: str
    type: str | None = None
    firmware: str | None = None
    hardware_version: str | None = None
    node_guid: str | None = None
    num_ports: int | None = None
    ports: list[IbPort] = []


class IbStat(_Parsed):
    cas: list[IbCa] = []
    command_missing: bool = False


_IBSTAT_CA_KEYS = {"ca type": "type", "firmware version": "firmware", "hardware version": "hardware_version",
                   "node guid": "node_guid", "number of ports": "num_ports"}
_IBSTAT_PORT_KEYS = {"state": "state", "physical state": "physical_state", "rate": "rate_gbps",
                     "link layer": "link_layer", "base lid": "base_lid", "sm lid": "sm_lid", "port guid": "port_guid"}
_NUMERIC = {"num_ports": _int, "base_lid": _int, "sm_lid": _int, "rate_gbps": _float}


def _convert(field: str, value: str, line: str, problems: _Problems) -> Any:
    conv = _NUMERIC.get(field)
    if conv is None:
        return value or None
    number = conv(value)
    if number is None and value:
        problems.add(f"{field} is not a number", line)
    return number


def _parse_ibstat(text: str) -> IbStat:
    lines = _lines(text)
    problems, notes = _Problems(), []
    cas: list[dict[str, Any]] = []
    port: dict[str, Any] | None = None
    missing = _command_missing(lines, "ibstat")
    for line in lines:
        stripped = line.strip()
        if not stripped or (missing and _MISSING.search(line)):
            continue
        if m := re.match(r"CA '(.*)'\s*$", stripped):
            cas.append({"name": m.group(1), "ports": []})
            port = None
            continue
        if m := re.match(r"Port (\d+):\s*$", stripped):
            if not cas:
                problems.add("port before any CA line", line)
                continue
            port = {"number": _int(m.group(1))}
            cas[-1]["ports"].append(port)
            continue
        if re.match(r"(ibpanic|ibwarn|ibstat|ibstat:)\b", stripped):
            notes.append(f"ibstat said: {quote(stripped)}")  # e.g. no IB devices, umad not loaded
            continue
        kv = _split_kv(stripped)
        if kv is None or not cas:
            problems.add("unrecognised ibstat line", line)
            continue
        key, value = kv[0].lower(), kv[1]
        if port is not None and key in _IBSTAT_PORT_KEYS:
            field = _IBSTAT_PORT_KEYS[key]
            port.setdefault(field, _convert(field, value, line, problems))
        elif key in _IBSTAT_CA_KEYS:
            field = _IBSTAT_CA_KEYS[key]
            cas[-1].setdefault(field, _convert(field, value, line, problems))
        # other keys (capability mask, LMC, system image GUID) are not checked
    built = [IbCa(**{**ca, "ports": [IbPort(**p) for p in ca["ports"]]}) for ca in cas]
    if missing:
        notes.append("ibstat is not installed (infiniband-diags)")
    elif not built:
        notes.append("no InfiniBand CA listed")
    return IbStat(cas=built, command_missing=missing, problems=problems.done(), notes=notes)


def parse_ibstat(text: Text) -> IbStat:
    """`ibstat` (infiniband-diags)."""
    return _guard(_parse_ibstat, text, lambda p: IbStat(problems=[p]))


# ---------------------------------------------------------------- ibv_devinfo


class IbvPort(_Frozen):
    number: int | None = None
    state: str | None = None  # PORT_ACTIVE, PORT_DOWN, PORT_INIT, PORT_ARMED
    link_layer: str | None = None  # InfiniBand, Ethernet, Unspecified (EFA on current rdma-core)
    active_mtu: int | None = None
    max_mtu: int | None = None

    @property
    def active(self) -> bool:
        return self.state == "PORT_ACTIVE"


class IbvDevice(_Frozen):
    hca_id: str
    transport: str | None = None  # InfiniBand, iWARP, unspecified (EFA)
    transport_code: int | None = None
    fw_ver: str | None = None
    vendor_id: str | None = None
    vendor_part_id: str | None = None
    phys_port_cnt: int | None = None
    ports: list[IbvPort] = []

    @property
    def is_efa(self) -> bool:
        # Amazon's PCI vendor id; names kept as fallback for output trimmed of vendor_id
        return (self.vendor_id or "").lower() == "0x1d0f" or self.hca_id.startswith(("rdmap", "efa_"))


class IbvDevinfo(_Parsed):
    devices: list[IbvDevice] = []
    command_missing: bool = False


_NAME_CODE = re.compile(r"^(.*?)\s*\((-?\d+)\)\s*$")  # "PORT_ACTIVE (4)", "InfiniBand (0)", "4096 (5)"


def _name_code(value: str) -> tuple[str, int | None]:
    m = _NAME_CODE.match(value)
    return (m.group(1), _int(m.group(2))) if m else (value, None)


def _parse_ibv_devinfo(text: str) -> IbvDevinfo:
    lines = _lines(text)
    problems, notes = _Problems(), []
    devices: list[dict[str, Any]] = []
    port: dict[str, Any] | None = None
    missing = _command_missing(lines, "ibv_devinfo")
    for line in lines:
        stripped = line.strip()
        if not stripped or (missing and _MISSING.search(line)):
            continue
        if re.match(r"No (IB|RDMA) devices found", stripped, re.I) or stripped.startswith("Failed to get IB devices list"):
            notes.append(f"ibv_devinfo: {quote(stripped)}")
            continue
        kv = _split_kv(stripped)
        if kv is None:
            # `ibv_devinfo -v` lists capability flags one per indented line: not ours to judge
            if not devices or not line[:1].isspace():
                problems.add("unrecognised ibv_devinfo line", line)
            continue
        key, value = kv[0].lower(), kv[1]
        if key == "hca_id":
            devices.append({"hca_id": value, "ports": []})
            port = None
        elif not devices:
            problems.add("field before any hca_id line", line)
        elif key == "port":
            port = {"number": _int(value)}
            devices[-1]["ports"].append(port)
        elif port is not None and key in ("state", "link_layer", "active_mtu", "max_mtu"):
            name, _code = _name_code(value)
            port.setdefault(key, _int(name) if key.endswith("mtu") else name)
        elif key == "transport":
            name, code = _name_code(value)
            devices[-1].setdefault("transport", name)
            devices[-1].setdefault("transport_code", code)
        elif key in ("fw_ver", "vendor_id", "vendor_part_id"):
            devices[-1].setdefault(key, value)
        elif key == "phys_port_cnt":
            devices[-1].setdefault(key, _int(value))
    built = [IbvDevice(**{**d, "ports": [IbvPort(**p) for p in d["ports"]]}) for d in devices]
    if missing:
        notes.append("ibv_devinfo is not installed (rdma-core / ibverbs-utils)")
    return IbvDevinfo(devices=built, command_missing=missing, problems=problems.done(), notes=notes)


def parse_ibv_devinfo(text: Text) -> IbvDevinfo:
    """`ibv_devinfo` (rdma-core); `-v` output parses too."""
    return _guard(_parse_ibv_devinfo, text, lambda p: IbvDevinfo(problems=[p]))


# ---------------------------------------------------------------- lscpu


class Lscpu(_Parsed):
    cpus: int | None = None
    threads_per_core: int | None = None
    cores_per_socket: int | None = None
    sockets: int | None = None
    numa_nodes: int | None = None
    model_name: str | None = None
    architecture: str | None = None
    numa_node_cpus: dict[str, str] = {}  # "0" -> "0-23,48-71"
    fields: dict[str, str] = {}  # every `key: value` as printed


_LSCPU_INTS = {"cpu(s)": "cpus", "thread(s) per core": "threads_per_core", "core(s) per socket": "cores_per_socket",
               "socket(s)": "sockets", "numa node(s)": "numa_nodes"}


def _lscpu_json_pairs(text: str) -> list[tuple[str, str]] | None:
    """`lscpu -J`: {"lscpu": [{"field": "CPU(s):", "data": "96", "children": [...]}, ...]}."""
    try:
        doc = parse_json(text)
    except Exception:  # any failure means "not JSON", parse as text
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("lscpu"), list):
        return None
    pairs: list[tuple[str, str]] = []

    def walk(items: object, depth: int) -> None:
        if not isinstance(items, list) or depth > 8:
            return
        for item in items:
            if isinstance(item, dict):
                pairs.append((str(item.get("field", "")).rstrip(":").strip(), str(item.get("data") or "").strip()))
                walk(item.get("children"), depth + 1)

    walk(doc["lscpu"], 0)
    return pairs


def _parse_lscpu(text: str) -> Lscpu:
    problems, notes = _Problems(), []
    pairs = _lscpu_json_pairs(text) if text.lstrip().startswith("{") else None
    if pairs is None:
        pairs = []
        for line in _lines(text):
            if not line.strip():
                continue
            kv = _split_kv(line)
            if kv is None:
                problems.add("unrecognised lscpu line", line)
            else:
                pairs.append(kv)
    values: dict[str, Any] = {}
    fields: dict[str, str] = {}
    numa: dict[str, str] = {}
    for key, value in pairs:
        if not key:
            continue
        fields.setdefault(key, value)
        low = key.lower()
        if low in _LSCPU_INTS:
            number = _int(value)
            # "Socket(s): -" on some ARM hosts: unknown, not a problem
            if number is None and value not in ("", "-"):
                problems.add(f"{key} is not a number", f"{key}: {value}")
            values.setdefault(_LSCPU_INTS[low], number)
        elif low == "model name":
            values.setdefault("model_name", value or None)
        elif low == "architecture":
            values.setdefault("architecture", value or None)
        elif m := re.fullmatch(r"numa node(\d+) cpu\(s\)", low):
            numa.setdefault(m.group(1), value)
    if not fields:
        notes.append("no lscpu fields found")
    return Lscpu(**values, numa_node_cpus=numa, fields=fields, problems=problems.done(), notes=notes)


def parse_lscpu(text: Text) -> Lscpu:
    """`lscpu` (plain, sectioned util-linux >= 2.38, or `-J`)."""
    return _guard(_parse_lscpu, text, lambda p: Lscpu(problems=[p]))


# ---------------------------------------------------------------- /proc/meminfo


class MemInfo(_Parsed):
    total_bytes: int | None = None
    available_bytes: int | None = None
    free_bytes: int | None = None
    hugepages_total: int | None = None
    hugepages_free: int | None = None
    hugepage_size_bytes: int | None = None
    values: dict[str, int] = {}  # every field; kB fields converted to bytes


_MEMINFO_LINE = re.compile(r"^([A-Za-z0-9_()]+):\s*(\d+)\s*(kB)?\s*$")


def _parse_meminfo(text: str) -> MemInfo:
    problems, notes = _Problems(), []
    values: dict[str, int] = {}
    for line in _lines(text):
        if not line.strip():
            continue
        m = _MEMINFO_LINE.match(line.strip())
        number = _int(m.group(2)) if m else None
        if m is None or number is None:
            problems.add("unrecognised meminfo line", line)
            continue
        values.setdefault(m.group(1), number * 1024 if m.group(3) else number)
    if not values:
        notes.append("no meminfo fields found")
    return MemInfo(
        total_bytes=values.get("MemTotal"), available_bytes=values.get("MemAvailable"), free_bytes=values.get("MemFree"),
        hugepages_total=values.get("HugePages_Total"), hugepages_free=values.get("HugePages_Free"),
        hugepage_size_bytes=values.get("Hugepagesize"), values=values, problems=problems.done(), notes=notes)


def parse_meminfo(text: Text) -> MemInfo:
    """`/proc/meminfo`."""
    return _guard(_parse_meminfo, text, lambda p: MemInfo(problems=[p]))


# ---------------------------------------------------------------- lsblk -J -b


class BlockDevice(_Frozen):
    name: str
    type: str | None = None  # disk, part, raid0, md, lvm, loop, rom
    size_bytes: int | None = None
    model: str | None = None
    mountpoints: list[str] = []
    fstype: str | None = None
    children: list[BlockDevice] = []

    @property
    def is_nvme(self) -> bool:
        return self.name.startswith("nvme")

    @property
    def is_instance_store(self) -> bool:
        # EBS volumes are NVMe too on Nitro ("Amazon Elastic Block Store"): the model tells them apart
        return "Amazon EC2 NVMe Instance Storage" in (self.model or "")

    def walk(self) -> Iterator[BlockDevice]:
        yield self
        for child in self.children:
            yield from child.walk()


class Lsblk(_Parsed):
    devices: list[BlockDevice] = []

    def walk(self) -> Iterator[BlockDevice]:
        """Every device, children included, depth first."""
        for device in self.devices:
            yield from device.walk()


_LSBLK_DEPTH = 16  # disk > part > md > lvm > crypt is 5; deeper is garbage


def _lsblk_mountpoints(entry: dict[str, Any]) -> list[str]:
    # util-linux >= 2.37 with MOUNTPOINTS prints a list ([null] when unmounted); MOUNTPOINT a string or null
    raw = entry.get("mountpoints", entry.get("mountpoint"))
    items = raw if isinstance(raw, list) else [raw]
    return [str(m) for m in items if isinstance(m, str | int | float) and not isinstance(m, bool) and str(m)]


def _opt_str(value: object) -> str | None:
    if value is None or isinstance(value, dict | list):
        return None
    s = str(value).strip()
    return s or None


def _lsblk_device(entry: object, depth: int, problems: _Problems) -> BlockDevice | None:
    if not isinstance(entry, dict):
        problems.add("block device entry is not an object", json.dumps(entry, default=str)[:200])
        return None
    name = _opt_str(entry.get("name")) or _opt_str(entry.get("kname"))
    if name is None:
        problems.add("block device without a name", json.dumps(entry, default=str)[:200])
        return None
    size_raw = entry.get("size")
    size = _int(size_raw) if size_raw is not None else None
    if size is None and size_raw is not None:
        problems.add(f"{name}: size is not a byte count (run lsblk with -b)", f"size: {size_raw}")
    kids_raw = entry.get("children")
    kids: list[BlockDevice] = []
    if isinstance(kids_raw, list):
        if depth >= _LSBLK_DEPTH:
            problems.add(f"{name}: children nested deeper than {_LSBLK_DEPTH}, not read")
        else:
            kids = [d for d in (_lsblk_device(k, depth + 1, problems) for k in kids_raw) if d is not None]
    return BlockDevice(name=name, type=_opt_str(entry.get("type")), size_bytes=size, model=_opt_str(entry.get("model")),
                       mountpoints=_lsblk_mountpoints(entry), fstype=_opt_str(entry.get("fstype")), children=kids)


def _parse_lsblk(text: str) -> Lsblk:
    problems, notes = _Problems(), []
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end < start:
        if text.strip():
            problems.add("no JSON object in lsblk output", text.strip().split("\n")[0])
        else:
            notes.append("empty output")
        return Lsblk(problems=problems.done(), notes=notes)
    # lsblk may print warnings ("lsblk: dm-0: failed to get device path") around the JSON
    for line in _lines(text[:start] + "\n" + text[end + 1:]):
        if line.strip():
            notes.append(f"lsblk said: {quote(line)}")
    try:
        doc = parse_json(text[start:end + 1])
    except Exception as exc:  # truncated or mangled JSON: nothing to read
        problems.add(f"lsblk JSON does not parse ({type(exc).__name__})", text[start:end + 1].split("\n")[0])
        return Lsblk(problems=problems.done(), notes=notes)
    raw = doc.get("blockdevices") if isinstance(doc, dict) else None
    if not isinstance(raw, list):
        problems.add("lsblk JSON has no blockdevices list", json.dumps(doc, default=str)[:200])
        return Lsblk(problems=problems.done(), notes=notes)
    devices = [d for d in (_lsblk_device(e, 0, problems) for e in raw) if d is not None]
    return Lsblk(devices=devices, problems=problems.done(), notes=notes)


def parse_lsblk_json(text: Text) -> Lsblk:
    """`lsblk -J -b -o NAME,TYPE,SIZE,MODEL,MOUNTPOINT,FSTYPE` (MOUNTPOINTS and string sizes read too)."""
    return _guard(_parse_lsblk, text, lambda p: Lsblk(problems=[p]))


# ---------------------------------------------------------------- /proc/mounts


MountKind = Literal["lustre", "efs", "nfs", "s3", "fuse", "local", "other"]


def _is_efs(device: str, fstype: str, options: list[str]) -> bool:
    if not fstype.startswith("nfs"):
        return False
    host = device.split(":", 1)[0]
    if ".efs." in host and host.endswith("amazonaws.com"):
        return True
    # amazon-efs-utils with TLS mounts through a local stunnel on ports 20049..21049
    ports = [_int(o.partition("=")[2]) for o in options if o.startswith("port=")]
    return host == "127.0.0.1" and any(p is not None and 20049 <= p <= 21049 for p in ports)


class MountEntry(_Frozen):
    device: str
    mountpoint: str
    fstype: str
    options: list[str] = []

    @property
    def is_efs(self) -> bool:
        return _is_efs(self.device, self.fstype, self.options)

    @property
    def is_mountpoint_s3(self) -> bool:
        # mountpoint-s3 shows as fstype "fuse" with device "mountpoint-s3"
        return self.device == "mountpoint-s3" or self.fstype == "fuse.mountpoint-s3"

    @property
    def kind(self) -> MountKind:
        if self.fstype == "lustre":
            return "lustre"
        if self.is_efs:
            return "efs"
        if self.fstype.startswith("nfs"):
            return "nfs"
        if self.is_mountpoint_s3 or self.fstype in ("fuse.s3fs", "fuse.goofys", "fuse.rclone"):
            return "s3"
        if self.fstype.startswith("fuse"):
            return "fuse"
        if self.fstype in ("ext4", "ext3", "xfs", "btrfs", "zfs", "f2fs") and self.device.startswith("/dev/"):
            return "local"
        return "other"

    def matches(self, prefix: str) -> bool:
        """fstype starts with `prefix`; `efs`, `mountpoint-s3` and `s3` name what fstype alone cannot."""
        if prefix == "efs":
            return self.is_efs
        if prefix == "mountpoint-s3":
            return self.is_mountpoint_s3
        if prefix == "s3":
            return self.kind == "s3"
        return bool(prefix) and self.fstype.startswith(prefix)


class Mounts(_Parsed):
    entries: list[MountEntry] = []

    def find(self, path: str) -> MountEntry | None:
        """The mount holding `path`: longest mountpoint prefix; of equal ones the last (it hides the others)."""
        try:
            target = posixpath.normpath("/" + str(path).lstrip("/"))
        except Exception:  # a path that cannot be normalised is in no mount
            return None
        best: MountEntry | None = None
        for entry in self.entries:
            mp = entry.mountpoint.rstrip("/") or "/"
            if target == mp or mp == "/" or target.startswith(mp + "/"):
                if best is None or len(mp) >= len(best.mountpoint.rstrip("/") or "/"):
                    best = entry
        return best

    def of_type(self, prefixes: str | Iterable[str]) -> list[MountEntry]:
        """Mounts whose fstype starts with one of `prefixes` (plus the names `efs`, `mountpoint-s3`, `s3`)."""
        wanted = [prefixes] if isinstance(prefixes, str) else [str(p) for p in prefixes]
        return [e for e in self.entries if any(e.matches(p) for p in wanted)]


def unescape_mount(field: str) -> str:
    """/proc/mounts writes space, tab, newline and backslash as \\040, \\011, \\012, \\134."""
    return re.sub(r"\\([0-3][0-7]{2})", lambda m: chr(int(m.group(1), 8)), field)


def _parse_mounts(text: str) -> Mounts:
    problems, notes = _Problems(), []
    entries: list[MountEntry] = []
    for line in _lines(text):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) < 4:
            problems.add("mount line with fewer than 4 fields", line)
            continue
        device, mountpoint, fstype, options = parts[:4]
        entries.append(MountEntry(device=unescape_mount(device), mountpoint=unescape_mount(mountpoint),
                                  fstype=fstype, options=[o for o in options.split(",") if o]))
    if not entries:
        notes.append("no mounts found")
    return Mounts(entries=entries, problems=problems.done(), notes=notes)


def parse_mounts(text: Text) -> Mounts:
    """`/proc/mounts` (or `/etc/mtab`)."""
    return _guard(_parse_mounts, text, lambda p: Mounts(problems=[p]))


# ---------------------------------------------------------------- env


class Env(_Parsed):
    vars: dict[str, str] = {}


_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _parse_env_full(text: str) -> Env:
    problems = _Problems()
    env: dict[str, str] = {}
    # `env -0` separates with NUL, which also lets values hold newlines
    records = text.split("\0") if "\0" in text else _lines(text)
    in_function = False
    for record in records:
        key, sep, value = record.partition("=")
        if in_function:
            # bash exports functions as BASH_FUNC_name%%=() {  body ... } over several lines (common on
            # module-based HPC nodes); body lines are indented, so an unindented KEY= line means the
            # closing brace was lost and the function is over
            if record == "}":
                in_function = False
                continue
            if not (sep and _ENV_KEY.fullmatch(key)):
                continue
            in_function = False
        if not record.strip():
            continue
        if key.startswith("BASH_FUNC_") and sep:
            in_function = value.startswith("()") and not value.rstrip().endswith("}")
            continue
        if not sep or not _ENV_KEY.fullmatch(key):
            problems.add("not a KEY=VALUE line", record)
            continue
        env[key] = value  # the last assignment wins, as in a shell
    return Env(vars=env, problems=problems.done())


def parse_env_full(text: Text) -> Env:
    """`env` / `env -0` output: the variables plus the lines that were not KEY=VALUE."""
    return _guard(_parse_env_full, text, lambda p: Env(problems=[p]))


def parse_env(text: Text) -> dict[str, str]:
    """`env` output as a dict; values may contain '='; junk lines are dropped (see parse_env_full)."""
    return dict(parse_env_full(text).vars)


# ---------------------------------------------------------------- NCCL_DEBUG=INFO log

NcclTransport = Literal["ofi", "ib", "socket", "unknown"]


class NcclDebug(_Parsed):
    nccl_version: str | None = None
    cuda_version: str | None = None
    transport: NcclTransport = "unknown"
    network: str | None = None  # as NCCL names it: "AWS Libfabric", "IB", "Socket"
    plugin_missing: bool = False
    plugin_name: str | None = None
    ofi_plugin_version: str | None = None  # aws-ofi-nccl
    ofi_provider: str | None = None  # efa expected on AWS
    ofi_nics: int | None = None
    libfabric_version: str | None = None
    ib_devices: list[str] = []
    socket_interfaces: list[str] = []
    gdrdma: bool = False
    channels: int | None = None
    ring: bool = False
    tree: bool = False
    nranks: int | None = None
    nnodes: int | None = None
    init_complete: bool = False
    warnings: list[str] = []  # NCCL WARN lines
    evidence: list[str] = []  # the lines the transport verdict rests on


_MAX_EVIDENCE = 12


def _network_transport(name: str) -> NcclTransport:
    low = name.lower()
    if "libfabric" in low or "ofi" in low:
        return "ofi"
    if low.startswith("ib"):  # IB, IBext (SHARP plugin), IBext_v8
        return "ib"
    if low.startswith("socket"):
        return "socket"
    return "unknown"


def _plugin_missing_line(line: str) -> bool:
    low = line.lower()
    if "libnccl-net" not in low and "net/plugin" not in low:
        return False
    return any(s in low for s in ("not found", "could not find", "no plugin found", "cannot open shared object",
                                  "failed to open", "returned 2"))


def _parse_nccl_debug(text: str) -> NcclDebug:
    problems, notes = _Problems(), []
    out: dict[str, Any] = {}
    evidence: list[str] = []
    warnings: list[str] = []
    ib_devices: list[str] = []
    socket_ifs: list[str] = []
    networks: list[str] = []  # from "Using network X"
    via: list[str] = []  # from "Channel ... via NET/X/..."
    loaded = missing = ring = tree = gdr = init_complete = False
    coll_channels: int | None = None
    listed_channels: int | None = None
    nccl_lines = 0

    def cite(line: str) -> None:
        if len(evidence) < _MAX_EVIDENCE and quote(line) not in evidence:
            evidence.append(quote(line))

    for line in _lines(text):
        if "NCCL" not in line and "NET/" not in line:
            continue
        nccl_lines += 1
        if m := re.search(r"NCCL version (\d+\.\d+\.\d+)(?:\+cuda([\d.]+))?", line):
            out.setdefault("nccl_version", m.group(1))
            out.setdefault("cuda_version", m.group(2))
        if "NCCL WARN" in line:
            if len(warnings) < _MAX_EVIDENCE:
                warnings.append(quote(line[line.find("NCCL WARN"):]))
            if _plugin_missing_line(line):
                missing = True
                cite(line)
            continue
        if m := re.search(r"Using network (.+?)\s*$", line):
            networks.append(m.group(1))
            cite(line)
        elif _plugin_missing_line(line):
            missing = True
            cite(line)
        elif m := re.search(r"NET/Plugin\s*:?\s*Loaded (?:net )?plugin (.+?)(?:\s*\(v\d+\))?\s*$", line):
            loaded = True
            out.setdefault("plugin_name", m.group(1))
            cite(line)
        elif "NET/OFI" in line:
            loaded = True
            if m := re.search(r"aws-ofi-nccl[ _v]*(\d[\w.\-]*)", line):
                out.setdefault("ofi_plugin_version", m.group(1))
            if m := re.search(r"Libfabric version (\S+)", line, re.I):
                out.setdefault("libfabric_version", m.group(1))
            if m := re.search(r"Selected [Pp]rovider is ([^,\s]+)", line):
                out.setdefault("ofi_provider", m.group(1))
                cite(line)
            if m := re.search(r"found (\d+) nics?", line):
                out.setdefault("ofi_nics", _int(m.group(1)))
        elif m := re.search(r"NET/IB\s*:\s*Using\s+(.*?)(?:;|$)", line):
            ib_devices += re.findall(r"\[\d+\](\S+)", m.group(1))
            cite(line)
        elif m := re.search(r"NET/Socket\s*:\s*Using\s+(.*)$", line):
            socket_ifs += re.findall(r"\[\d+\](\S+)", m.group(1))
            cite(line)
        if m := re.search(r"via NET/([^/]+)/", line):
            if m.group(1) not in via:
                cite(line)
            via.append(m.group(1))
            gdr = gdr or "GDRDMA" in line
        if m := re.search(r"\b(\d+) coll channels", line):
            coll_channels = coll_channels or _int(m.group(1))
        if m := re.search(r"Channel (\d+)/(\d+) :((?:\s+\d+)+)\s*$", line):
            n = _int(m.group(2))
            listed_channels = max(listed_channels or 0, n or 0) or None
            ring = True
        if "Connected all rings" in line:
            ring = True
        if "Connected all trees" in line or re.search(r"\bTrees\b.*->", line):
            tree = True
        # sub-communicators (tensor-parallel groups) are smaller than the world: keep the largest
        if (m := re.search(r"\bnranks (\d+)", line, re.I)) and (n := _int(m.group(1))) is not None:
            out["nranks"] = max(out.get("nranks") or 0, n)
        if (m := re.search(r"\bnNodes (\d+)", line)) and (n := _int(m.group(1))) is not None:
            out["nnodes"] = max(out.get("nnodes") or 0, n)
        if "Init COMPLETE" in line:
            init_complete = True

    # "Using network X" is NCCL's own verdict; the channel lines are the next best; last, which
    # transports initialised (NET/Socket initialises only when nothing better did).
    if networks:
        transport, network = _network_transport(networks[-1]), networks[-1]
    elif via:
        transport, network = _network_transport(via[-1]), via[-1]
    elif out.get("ofi_provider"):
        transport, network = "ofi", None
    elif ib_devices:
        transport, network = "ib", None
    elif socket_ifs:
        transport, network = "socket", None
    else:
        transport, network = "unknown", None
    if len({_network_transport(n) for n in networks}) > 1:
        notes.append(f"ranks used different networks: {', '.join(_uniq(networks))}")
    if nccl_lines == 0:
        notes.append("no NCCL lines found (was NCCL_DEBUG=INFO set?)")
    return NcclDebug(
        **out, transport=transport, network=network, plugin_missing=missing and not loaded, ib_devices=_uniq(ib_devices),
        socket_interfaces=_uniq(socket_ifs), gdrdma=gdr, channels=coll_channels or listed_channels, ring=ring, tree=tree,
        init_complete=init_complete, warnings=warnings, evidence=evidence, problems=problems.done(), notes=notes)


def parse_nccl_debug(text: Text) -> NcclDebug:
    """A log written with NCCL_DEBUG=INFO (other program output mixed in is ignored)."""
    return _guard(_parse_nccl_debug, text, lambda p: NcclDebug(problems=[p]))


# ---------------------------------------------------------------- nccl-tests


class NcclTestsRow(_Frozen):
    size_bytes: int
    count: int
    dtype: str
    redop: str | None = None
    root: int | None = None
    oop_time_us: float | None = None
    oop_algbw_gbps: float | None = None
    oop_busbw_gbps: float | None = None
    oop_wrong: float | None = None
    ip_time_us: float | None = None
    ip_algbw_gbps: float | None = None
    ip_busbw_gbps: float | None = None
    ip_wrong: float | None = None

    @property
    def busbw_gbps(self) -> float | None:
        """The better of out-of-place and in-place bus bandwidth."""
        values = [v for v in (self.oop_busbw_gbps, self.ip_busbw_gbps) if v is not None]
        return max(values) if values else None

    @property
    def has_wrong(self) -> bool:
        # current nccl-tests count wrong elements (#wrong); old ones printed the max error (1e-07 is fine)
        return any(w is not None and w >= 1 for w in (self.oop_wrong, self.ip_wrong))


class NcclTests(_Parsed):
    rows: list[NcclTestsRow] = []
    avg_busbw: float | None = None  # "# Avg bus bandwidth", GB/s
    nranks: int | None = None
    out_of_bounds: int | None = None
    collective: str | None = None
    version: str | None = None
    failures: list[str] = []  # "Test NCCL failure ..." and the like

    @property
    def max_busbw(self) -> float | None:
        values = [b for b in (r.busbw_gbps for r in self.rows) if b is not None]
        return max(values) if values else None

    def busbw_at(self, size_bytes: int) -> float | None:
        """Bus bandwidth of the row at exactly `size_bytes` (last one when a run printed several)."""
        rows = [r for r in self.rows if r.size_bytes == size_bytes]
        return rows[-1].busbw_gbps if rows else None


_RANK_PREFIX = re.compile(r"^\s*(?:\d+:\s|\[\d+,\d+\]<std(?:out|err)>:\s?)")  # srun -l; mpirun --tag-output


def _is_number(token: str) -> bool:
    return _float(token) is not None


def _nccl_tests_row(tokens: list[str]) -> NcclTestsRow | None:
    if len(tokens) < 11:
        return None
    size, count = _int(tokens[0]), _int(tokens[1])
    if size is None or count is None or _is_number(tokens[2]):
        return None
    rest = tokens[3:]
    redop = rest.pop(0) if not _is_number(rest[0]) else None  # all_gather/alltoall in old nccl-tests have none
    root = _int(rest.pop(0)) if len(rest) == 9 else None
    if len(rest) != 8 or not all(_is_number(t) or t == "N/A" for t in rest):
        return None
    v = [_float(t) for t in rest]
    return NcclTestsRow(size_bytes=size, count=count, dtype=tokens[2], redop=redop, root=root,
                        oop_time_us=v[0], oop_algbw_gbps=v[1], oop_busbw_gbps=v[2], oop_wrong=v[3],
                        ip_time_us=v[4], ip_algbw_gbps=v[5], ip_busbw_gbps=v[6], ip_wrong=v[7])


def _parse_nccl_tests(text: str) -> NcclTests:
    problems, notes = _Problems(), []
    rows: list[NcclTestsRow] = []
    failures: list[str] = []
    ranks: set[int] = set()
    out: dict[str, Any] = {}
    for raw in _lines(text):
        line = _RANK_PREFIX.sub("", raw, count=1).strip()
        if not line:
            continue
        if line.startswith("#"):
            body = line.lstrip("#").strip()
            if m := re.match(r"Avg bus bandwidth\s*:\s*(\S+)", body):
                out["avg_busbw"] = _float(m.group(1))
                if out["avg_busbw"] is None:
                    problems.add("Avg bus bandwidth is not a number", raw)
            elif m := re.match(r"Out of bounds values\s*:\s*(\d+)", body):
                out["out_of_bounds"] = _int(m.group(1))
            elif m := re.match(r"Rank\s+(\d+)\s+Group", body):
                if (rank := _int(m.group(1))) is not None:
                    ranks.add(rank)
            elif m := re.match(r"Collective test starting:\s*(\S+)", body):
                out.setdefault("collective", m.group(1))
            elif m := re.match(r"nccl-tests version\s+(\S+)", body):
                out.setdefault("version", m.group(1))
            continue
        if re.search(r"\bfailure\b|NCCL WARN|\bFAILED\b", line, re.I):
            if len(failures) < _MAX_EVIDENCE:
                failures.append(quote(line))
            continue
        if line[:1].isdigit():
            row = _nccl_tests_row(line.split())
            if row is None:
                problems.add("unreadable nccl-tests row", raw)
            else:
                rows.append(row)
        # anything else (NCCL INFO lines, launcher chatter) is not part of the table
    if not rows:
        notes.append("no nccl-tests result rows found")
    return NcclTests(rows=rows, nranks=len(ranks) or None, failures=failures, problems=problems.done(), notes=notes, **out)


def parse_nccl_tests(text: Text) -> NcclTests:
    """nccl-tests output (all_reduce_perf and friends), with or without `srun -l` rank prefixes."""
    return _guard(_parse_nccl_tests, text, lambda p: NcclTests(problems=[p]))


class DfEntry(_Frozen):
    source: str
    fstype: str
    size_bytes: int
    avail_bytes: int
    target: str


class Df(_Parsed):
    entries: list[DfEntry] = []

    def find(self, path: str) -> DfEntry | None:
        """The file system holding `path` (longest mount-point prefix)."""
        best = None
        for entry in self.entries:
            prefix = entry.target.rstrip("/") + "/"
            if (path + "/").startswith(prefix) or entry.target == "/":
                if best is None or len(entry.target) > len(best.target):
                    best = entry
        return best


def _parse_df(text: str) -> Df:
    entries, problems = [], _Problems()
    for line in _lines(text):
        cells = line.split()
        if not cells or cells[0] in ("Filesystem", "Source"):
            continue
        if len(cells) < 5 or _int(cells[2]) is None or _int(cells[3]) is None:
            problems.add("not a df line", line)
            continue
        entries.append(DfEntry(source=cells[0], fstype=cells[1], size_bytes=_int(cells[2]), avail_bytes=_int(cells[3]),
                               target=" ".join(cells[4:])))
    return Df(entries=entries, problems=problems.done())


def parse_df(text: Text) -> Df:
    """`df -B1 --output=source,fstype,size,avail,target`."""
    return _guard(_parse_df, text, lambda problem: Df(problems=[problem]))
