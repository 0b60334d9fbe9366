"""Parsers for nvidia-smi output: `topo -m`, `nvlink -s`, `--query-gpu=... --format=csv` and `-q`.

`trainready check` feeds these whatever a node printed: a driver we never saw, a capture cut short, an
error message instead of a table. So no parser raises. Each returns what it could read plus `problems`,
one string per thing it could not, quoting the offending line (trimmed to 120 characters).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import TypeVar

QUOTE_CHARS = 120
MAX_PROBLEMS = 50  # a page of garbage yields one problem per line; past this, more of them help nobody
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")  # old drivers printed the topo header in bold/underline
_INT = re.compile(r"[0-9]{1,9}")  # bounded: int() refuses >4300 digits, and no real counter is that long


def quote(line: str) -> str:
    """The line as a problem quotes it: stripped, cut to 120 characters, repr so tabs and junk show."""
    return repr(line.strip()[:QUOTE_CHARS])


def _problem(reason: str, line: str) -> str:
    return f"{reason}: {quote(line)}"


def _internal(exc: Exception) -> str:
    # A parser bug must not take the whole health check down; tests assert this never appears.
    return f"internal parser error ({type(exc).__name__}): {quote(str(exc))}"


_Result = TypeVar("_Result")


def _capped(result: _Result) -> _Result:
    problems: list[str] = getattr(result, "problems", [])
    if len(problems) <= MAX_PROBLEMS:
        return result
    more = len(problems) - MAX_PROBLEMS + 1
    return replace(result, problems=[*problems[:MAX_PROBLEMS - 1], f"... and {more} more problems"])


def _lines(text: object) -> list[str]:
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    if not isinstance(text, str):
        text = "" if text is None else str(text)
    return [_ANSI.sub("", line) for line in text.splitlines()]  # splitlines: CRLF and lone CR too


def _int(value: str | None) -> int | None:
    value = (value or "").strip()
    return int(value) if _INT.fullmatch(value) else None


def _listing(names: list[str], limit: int = 12) -> str:
    shown = ", ".join(names[:limit])
    return shown if len(names) <= limit else f"{shown} and {len(names) - limit} more"


def _first_line(lines: Iterable[str]) -> str | None:
    return next((line for line in lines if line.strip()), None)


# --------------------------------------------------------------------------------------------------
# nvidia-smi topo -m

_GPU_COLUMN = re.compile(r"GPU([0-9]{1,4})")
_LINK_TOKEN = re.compile(r"X|NV[0-9]{1,3}|SYS|NODE|PHB|PXB|PIX|SOC|PSB")  # SOC: old name of SYS
_NV = re.compile(r"NV([0-9]{1,3})")
_AFFINITY_COLUMNS = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
# Column names with spaces, so a capture whose tabs became spaces still splits into the right cells.
_CELL = re.compile(r"CPU Affinity|NUMA Affinity|GPU NUMA ID|\S+")
_LEGEND_ITEM = re.compile(r"\s*\S+\s*=.*")
_NIC_LEGEND_ITEM = re.compile(r"\s*(\S+)\s*:\s*(\S+)\s*")


def nvlink_count(token: str | None) -> int:
    """Bonded NVLinks in a topo cell: NV12 -> 12, NV1 -> 1; anything else (SYS, PIX, X, junk) -> 0."""
    match = _NV.fullmatch((token or "").strip())
    return int(match.group(1)) if match else 0


def _gpu_index(name: str) -> int | None:
    match = _GPU_COLUMN.fullmatch(name)
    return int(match.group(1)) if match else None


@dataclass(frozen=True, slots=True)
class Topology:
    """`nvidia-smi topo -m`: the GPU x GPU link matrix, GPU x NIC cells, and each GPU's CPU/NUMA affinity."""

    gpus: list[str] = field(default_factory=list)
    """GPU column names in header order: GPU0, GPU1, ..."""
    matrix: dict[tuple[int, int], str] = field(default_factory=dict)
    """(GPU i, GPU j) -> link token as printed: X, NV12, SYS, NODE, PHB, PXB, PIX."""
    nics: list[str] = field(default_factory=list)
    """NIC column names as printed: NIC0.. on current drivers, mlx5_0 / rocep.. on old ones."""
    nic_names: dict[str, str] = field(default_factory=dict)
    """From the NIC Legend: NIC0 -> mlx5_0."""
    nic_matrix: dict[tuple[int, str], str] = field(default_factory=dict)
    """(GPU i, NIC column) -> link token: PIX/PXB means the NIC sits under the GPU's own PCIe switch."""
    cpu_affinity: dict[int, str] = field(default_factory=dict)
    numa_affinity: dict[int, str] = field(default_factory=dict)
    truncated: bool = False
    """Rows missing versus the header's columns, or a row with fewer cells than columns."""
    problems: list[str] = field(default_factory=list)

    def gpu_indices(self) -> list[int]:
        return [i for i in map(_gpu_index, self.gpus) if i is not None]

    def nvlink_pairs(self) -> dict[tuple[int, int], int]:
        """Every GPU pair i<j whose cell was printed -> its NVLink count (0: no NVLink, e.g. SYS or PIX)."""
        pairs: dict[tuple[int, int], int] = {}
        indices = sorted(set(self.gpu_indices()))
        for a, i in enumerate(indices):
            for j in indices[a + 1:]:
                token = self.matrix.get((i, j)) or self.matrix.get((j, i))
                if token is not None:
                    pairs[(i, j)] = nvlink_count(token)
        return pairs

    def nic_device(self, column: str) -> str:
        """The NIC's device name (mlx5_0) for a column (NIC0); old drivers already print the device."""
        return self.nic_names.get(column, column)


def _cells(line: str) -> list[str]:
    # Tab-separated cells, blanks kept (they carry position); a cell holding spaces (a capture whose
    # tabs became spaces) is split further, so space-aligned copies parse too.
    cells: list[str] = []
    for part in line.split("\t"):
        cells.extend(_CELL.findall(part) or [""])
    return cells


def _is_header(cells: list[str]) -> bool:
    # "GPU0 GPU1 ... CPU Affinity": starts with a GPU name that is not followed by a link token
    # (a row "GPU0 X NV12 ..." is followed by one).
    filled = [c for c in cells if c]
    return bool(filled) and _GPU_COLUMN.fullmatch(filled[0]) is not None and (
        len(filled) == 1 or _LINK_TOKEN.fullmatch(filled[1]) is None)


@dataclass
class _TopoBuilder:
    """Mutable state while reading one topo output; `finish` freezes it into a Topology."""

    columns: list[str] = field(default_factory=list)
    tail: list[str] = field(default_factory=list)
    header_line: str | None = None
    section: str = "matrix"
    rows: dict[str, str] = field(default_factory=dict)
    matrix: dict[tuple[int, int], str] = field(default_factory=dict)
    nic_matrix: dict[tuple[int, str], str] = field(default_factory=dict)
    nic_names: dict[str, str] = field(default_factory=dict)
    cpu: dict[int, str] = field(default_factory=dict)
    numa: dict[int, str] = field(default_factory=dict)
    truncated: bool = False
    problems: list[str] = field(default_factory=list)

    def header(self, cells: list[str], line: str) -> None:
        names = [c for c in cells if c]
        first_tail = next((k for k, c in enumerate(names) if c in _AFFINITY_COLUMNS), len(names))
        self.columns, self.tail, self.header_line = names[:first_tail], names[first_tail:], line
        if len(set(self.columns)) != len(self.columns):
            self.problems.append(_problem("header names a column twice", line))

    def row(self, label: str, values: list[str], line: str) -> None:
        if label in self.rows:
            self.problems.append(_problem(f"second row for {label}", line))
            return
        self.rows[label] = line
        device_cells = values[:len(self.columns)]
        if len(device_cells) < len(self.columns) or "" in device_cells:
            self.truncated = True
            self.problems.append(_problem(f"row {label} has {len([c for c in device_cells if c])} of "
                                          f"{len(self.columns)} cells", line))
        i = _gpu_index(label)
        for column, token in zip(self.columns, device_cells, strict=False):
            if token and _LINK_TOKEN.fullmatch(token) is None:
                self.problems.append(_problem(f"unknown link token {token[:20]!r} in row {label}", line))
            if token and i is not None:
                j = _gpu_index(column)
                if j is not None:
                    self.matrix[(i, j)] = token
                else:
                    self.nic_matrix[(i, column)] = token
        if i is not None:
            self._affinity(i, values[len(self.columns):])

    def _affinity(self, i: int, tail: list[str]) -> None:
        # nvidia-smi pads a blank cell before "GPU NUMA ID", and prints a blank CPU Affinity on some
        # hosts, so CPU/NUMA affinity are read by position and never from the cells after them.
        for position, name in enumerate(self.tail):
            value = tail[position] if position < len(tail) else ""
            if value and name == "CPU Affinity":
                self.cpu[i] = value
            elif value and name == "NUMA Affinity":
                self.numa[i] = value

    def finish(self) -> Topology:
        gpus = [c for c in self.columns if _gpu_index(c) is not None]
        nics = [c for c in self.columns if _gpu_index(c) is None]
        if self.header_line is not None:
            self._check_complete(nics)
        self._check_symmetric()
        return Topology(gpus=gpus, matrix=self.matrix, nics=nics, nic_names=self.nic_names, nic_matrix=self.nic_matrix,
                        cpu_affinity=self.cpu, numa_affinity=self.numa, truncated=self.truncated, problems=self.problems)

    def _check_complete(self, nics: list[str]) -> None:
        header = self.header_line or ""
        missing = [c for c in self.columns if c not in self.rows]
        if missing:
            self.truncated = True
            self.problems.append(_problem(f"no row for {_listing(missing)} (output cut short?); header", header))
        unnamed = [n for n in nics if re.fullmatch(r"NIC[0-9]+", n) and n not in self.nic_names]
        if unnamed:
            self.problems.append(_problem(f"NIC Legend does not name {_listing(unnamed)}; header", header))

    def _check_symmetric(self) -> None:
        for (i, j), token in sorted(self.matrix.items()):
            other = self.matrix.get((j, i))
            if i < j and other is not None and other != token:
                self.problems.append(_problem(f"GPU{i}->GPU{j} is {token[:20]} but GPU{j}->GPU{i} is {other[:20]}",
                                              self.rows.get(f"GPU{j}", "")))


def _topo_line(b: _TopoBuilder, line: str) -> None:
    stripped = line.strip()
    if stripped in ("Legend:", "NIC Legend:"):
        b.section = "legend" if stripped == "Legend:" else "nic_legend"
        return
    if b.section == "legend":
        if _LEGEND_ITEM.fullmatch(line) is None:
            b.problems.append(_problem("unexpected line in the legend", line))
        return
    if b.section == "nic_legend":
        match = _NIC_LEGEND_ITEM.fullmatch(line)
        if match:
            b.nic_names[match.group(1)] = match.group(2)
        else:
            b.problems.append(_problem("unexpected line in the NIC legend", line))
        return
    cells = _cells(line)
    filled = [c for c in cells if c]
    if b.header_line is None and _is_header(cells):
        b.header(cells, line)
    elif b.header_line is not None and filled and filled[0] in b.columns:
        values = cells[cells.index(filled[0]) + 1:]
        b.row(filled[0], values, line)
    elif b.header_line is not None and _is_header(cells):
        b.problems.append(_problem("second header line ignored", line))
    else:
        b.problems.append(_problem("not a topo matrix line" if b.header_line else "line before the topo header", line))


def parse_topo(text: str) -> Topology:
    """Parse `nvidia-smi topo -m`. Never raises; what could not be read is in `problems`."""
    try:
        lines = _lines(text)
        builder = _TopoBuilder()
        for line in lines:
            if line.strip():
                _topo_line(builder, line)
        if builder.header_line is None:
            first = _first_line(lines)
            builder.problems.insert(0, "empty output" if first is None else
                                    _problem("no topo header (a line of GPU0 GPU1 ... CPU Affinity)", first))
        return _capped(builder.finish())
    except Exception as exc:
        return Topology(problems=[_internal(exc)])


# --------------------------------------------------------------------------------------------------
# nvidia-smi nvlink -s / --status

# Anchored prefixes only; the rest of the line is split with str methods (no backtracking on long junk).
_NVLINK_GPU = re.compile(r"\s*GPU\s+([0-9]{1,4})\s*:(.*)")
_NVLINK_LINK = re.compile(r"\s*Link\s+([0-9]{1,4})\s*:(.*)")
_SPEED = re.compile(r"([0-9]{1,9}(?:\.[0-9]{1,9})?)\s*GB/s", re.IGNORECASE)
_INACTIVE = re.compile(r"<?\s*inactive\s*>?", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Link:
    """One NVLink of a GPU as `nvidia-smi nvlink -s` shows it."""

    id: int
    speed_gbps: float | None
    """Per direction, GB/s (V100 25.781, A100 25, H100 26.562); None when inactive or unreadable."""
    active: bool


@dataclass(frozen=True, slots=True)
class GpuLinks:
    name: str | None = None
    """Product name from the "GPU 0: NVIDIA A100-SXM4-80GB (UUID: ...)" line."""
    uuid: str | None = None
    links: list[Link] = field(default_factory=list)

    @property
    def active_links(self) -> int:
        return sum(link.active for link in self.links)


@dataclass(frozen=True, slots=True)
class NvlinkStatus:
    """`nvidia-smi nvlink -s`: per GPU index, its name and links."""

    gpus: dict[int, GpuLinks] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def _name_uuid(rest: str) -> tuple[str | None, str | None]:
    # "NVIDIA A100-SXM4-80GB (UUID: GPU-e049...)" -> name, uuid
    name, marker, uuid = rest.partition("(UUID:")
    return name.strip() or None, (uuid.strip().rstrip(")").strip() or None) if marker else None


def _link(link_id: int, value: str, line: str, problems: list[str]) -> Link:
    value = value.strip()
    speed = _SPEED.fullmatch(value)
    if speed:
        return Link(id=link_id, speed_gbps=float(speed.group(1)), active=True)
    if not _INACTIVE.fullmatch(value):
        # Unknown state: count it as down, so a check errs towards "look at this link".
        problems.append(_problem(f"link {link_id}: state not understood, counted inactive", line))
    return Link(id=link_id, speed_gbps=None, active=False)


def _nvlink_parse(lines: list[str]) -> NvlinkStatus:
    gpus: dict[int, tuple[str | None, str | None, list[Link]]] = {}
    problems: list[str] = []
    current: int | None = None
    for line in lines:
        if not line.strip():
            continue
        gpu, link = _NVLINK_GPU.fullmatch(line), _NVLINK_LINK.fullmatch(line)
        if gpu:
            current = int(gpu.group(1))
            if current in gpus:
                problems.append(_problem(f"GPU {current} listed twice; links merged", line))
            else:
                gpus[current] = (*_name_uuid(gpu.group(2)), [])
        elif link and current is not None:
            links = gpus[current][2]
            link_id = int(link.group(1))
            if any(existing.id == link_id for existing in links):
                problems.append(_problem(f"GPU {current} link {link_id} listed twice; first kept", line))
            else:
                links.append(_link(link_id, link.group(2), line, problems))
        elif link:
            problems.append(_problem("link line before any GPU line", line))
        else:
            problems.append(_problem("not an nvlink status line", line))
    if not gpus:
        first = _first_line(lines)
        problems.insert(0, "empty output" if first is None else _problem("no 'GPU n: name (UUID: ...)' line", first))
    return NvlinkStatus(gpus={i: GpuLinks(name=n, uuid=u, links=links) for i, (n, u, links) in gpus.items()},
                        problems=problems)


def parse_nvlink_status(text: str) -> NvlinkStatus:
    """Parse `nvidia-smi nvlink -s` (or `--status`). Never raises; see `problems`."""
    try:
        return _capped(_nvlink_parse(_lines(text)))
    except Exception as exc:
        return NvlinkStatus(problems=[_internal(exc)])


# --------------------------------------------------------------------------------------------------
# nvidia-smi --query-gpu=... --format=csv[,nounits]

_FIELD = re.compile(r"([A-Za-z_][A-Za-z0-9_.]*)\s*(?:\[([^\]]*)\])?")
_MIB = re.compile(r"([0-9]{1,12}(?:\.[0-9]{1,9})?)\s*(KiB|MiB|GiB)?", re.IGNORECASE)
_MIB_PER = {"kib": 1 / 1024, "mib": 1.0, "gib": 1024.0}
# Drivers >= 535 print the clocks_throttle_reasons.* fields under their new name clocks_event_reasons.*.
_RENAMED = (("clocks_throttle_reasons.", "clocks_event_reasons."),)


def _not_a_value(value: str) -> bool:
    # nvidia-smi writes "[N/A]", "[Not Supported]", "[Unknown Error]", "[Insufficient Permissions]"...
    return value == "" or value.upper() == "N/A" or (value.startswith("[") and value.endswith("]"))


def _field_key(name: str) -> str:
    return re.sub(r"\s*\[[^\]]*\]\s*$", "", name.strip()).strip().lower()


@dataclass(frozen=True, slots=True)
class GpuRow:
    """One GPU's line of `--query-gpu` CSV."""

    values: dict[str, str | None] = field(default_factory=dict)
    """Field (as the header names it, units dropped, lower case) -> value; None for [N/A], [Not Supported]..."""
    raw: dict[str, str] = field(default_factory=dict)
    """Field -> the cell exactly as printed (minus surrounding spaces), "[Not Supported]" included."""

    def get(self, name: str) -> str | None:
        """A field's value; "memory.total [MiB]" and "memory.total" both work, old and new throttle names too."""
        key = _field_key(name)
        if key in self.values:
            return self.values[key]
        for old, new in _RENAMED:
            alias = key.replace(old, new) if key.startswith(old) else key.replace(new, old)
            if alias in self.values:
                return self.values[alias]
        return None

    @property
    def index(self) -> int | None:
        return _int(self.get("index"))

    @property
    def name(self) -> str | None:
        return self.get("name") or self.get("gpu_name")

    @property
    def driver_version(self) -> str | None:
        return self.get("driver_version")

    @property
    def memory_total_mib(self) -> int | None:
        """memory.total in MiB, from "81920 MiB" (default) or "81920" (nounits)."""
        match = _MIB.fullmatch(self.get("memory.total") or "")
        if not match:
            return None
        return int(float(match.group(1)) * _MIB_PER[(match.group(2) or "MiB").lower()])


@dataclass(frozen=True, slots=True)
class QueryGpu:
    """`nvidia-smi --query-gpu=... --format=csv`: the header's fields and one row per GPU."""

    fields: list[str] = field(default_factory=list)
    """Field names in header order, units dropped, lower case: index, name, memory.total, ..."""
    units: dict[str, str] = field(default_factory=dict)
    """Field -> unit from the header ("memory.total [MiB]" -> MiB); kept even under nounits."""
    rows: list[GpuRow] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def _csv_header(line: str) -> tuple[list[str], dict[str, str]] | None:
    cells = [c.strip() for c in line.split(",")]
    matches = [_FIELD.fullmatch(c) for c in cells]
    if not cells or not all(matches):
        return None
    names = [m.group(1).lower() for m in matches if m]
    units = {m.group(1).lower(): m.group(2).strip() for m in matches if m and m.group(2)}
    return names, units


def _csv_row(fields: list[str], line: str, problems: list[str]) -> GpuRow:
    cells = [c.strip() for c in line.split(",")]
    if len(cells) != len(fields):
        problems.append(_problem(f"{len(cells)} cells for {len(fields)} header fields", line))
    raw = dict(zip(fields, cells, strict=False))
    return GpuRow(values={k: None if _not_a_value(v) else v for k, v in raw.items()}, raw=raw)


def _query_parse(lines: list[str]) -> QueryGpu:
    problems: list[str] = []
    header: tuple[list[str], dict[str, str]] | None = None
    header_line = ""
    rows: list[GpuRow] = []
    for line in lines:
        if not line.strip():
            continue
        if header is None:
            header = _csv_header(line)
            header_line = line
            if header is None:  # e.g. "No devices were found", or a driver error before the table
                problems.append(_problem("not a --query-gpu CSV header", line))
        elif line.strip() == header_line.strip():
            problems.append(_problem("header repeated", line))
        else:
            rows.append(_csv_row(header[0], line, problems))
    if not lines or _first_line(lines) is None:
        problems.append("empty output")
    fields, units = header or ([], {})
    return QueryGpu(fields=fields, units=units, rows=rows, problems=problems)


def parse_query_gpu(text: str) -> QueryGpu:
    """Parse `nvidia-smi --query-gpu=... --format=csv` (with or without nounits). Never raises."""
    try:
        return _capped(_query_parse(_lines(text)))
    except Exception as exc:
        return QueryGpu(problems=[_internal(exc)])


# --------------------------------------------------------------------------------------------------
# nvidia-smi -q

_Q_GPU = re.compile(r"GPU\s+([0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{1,2}:[0-9A-Fa-f]{1,2}\.[0-9A-Fa-f])")
_CLOCK_SECTIONS = ("clocks throttle reasons", "clocks event reasons")  # renamed in driver 535
BENIGN_CLOCK_REASONS = ("Idle", "Applications Clocks Setting")
# Values nvidia-smi prints where a number would be; not a parse problem, just "unknown".
_UNKNOWN = {"n/a", "unknown error", "not supported", "not available", "insufficient permissions", "unknown",
            "not found", "none"}


@dataclass(frozen=True, slots=True)
class EccCounts:
    """ECC error counts, summed over what the driver lists (SRAM+DRAM, or the old Double/Single Bit Totals).

    None: not reported (ECC off or unsupported, N/A everywhere)."""

    volatile_correctable: int | None = None
    volatile_uncorrectable: int | None = None
    """Since the last driver load / reset."""
    aggregate_correctable: int | None = None
    aggregate_uncorrectable: int | None = None
    """Over the GPU's lifetime."""


@dataclass(frozen=True, slots=True)
class RetiredPages:
    """Dynamic page retirement (pre-Ampere; N/A on A100/H100, which remap rows instead)."""

    single_bit: int | None = None
    double_bit: int | None = None
    pending: bool | None = None
    """ "Pending Page Blacklist" (or "Pending" on old drivers): a retirement waits for a reset."""


@dataclass(frozen=True, slots=True)
class RemappedRows:
    """Row remapping (Ampere and newer HBM GPUs). All None where the driver prints "Remapped Rows : N/A"."""

    correctable: int | None = None
    uncorrectable: int | None = None
    pending: bool | None = None
    """A remap waits for a GPU reset."""
    failure_occurred: bool | None = None
    """No spare row was left: an RMA condition."""


@dataclass(frozen=True, slots=True)
class PcieLink:
    gen_max: int | None = None
    gen_current: int | None = None
    """Drops at idle to save power, so only a narrower *width* means a bad link."""
    gen_host_max: int | None = None
    """What the slot supports: explains a GPU stuck below its own max."""
    width_max: int | None = None
    width_current: int | None = None


@dataclass(frozen=True, slots=True)
class SmiGpu:
    """One "GPU 00000000:07:00.0" section of `nvidia-smi -q`."""

    index: int
    """Position in the report: nvidia-smi's GPU index when it ran without -i (it lists GPUs in index order)."""
    bus_id: str | None
    """None in a pasted fragment that lacks the "GPU 00000000:07:00.0" line."""
    product_name: str | None = None
    uuid: str | None = None
    ecc_mode: str | None = None
    """ECC Mode / Current: "Enabled" or "Disabled"."""
    ecc: EccCounts = field(default_factory=EccCounts)
    retired_pages: RetiredPages = field(default_factory=RetiredPages)
    remapped_rows: RemappedRows = field(default_factory=RemappedRows)
    clock_reasons: dict[str, bool] = field(default_factory=dict)
    """Every item of "Clocks Throttle Reasons" / "Clocks Event Reasons" -> active?"""
    active_clock_reasons: list[str] = field(default_factory=list)
    """The active ones, minus Idle and Applications Clocks Setting (those slow nobody down)."""
    pcie: PcieLink = field(default_factory=PcieLink)
    fields: dict[str, str] = field(default_factory=dict)
    """Every "Key : Value" of the section by its path, e.g. "Fabric/State" -> "Completed"."""


@dataclass(frozen=True, slots=True)
class SmiQ:
    """`nvidia-smi -q`: the report header and one entry per GPU section."""

    driver_version: str | None = None
    cuda_version: str | None = None
    attached_gpus: int | None = None
    gpus: list[SmiGpu] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


@dataclass
class _Section:
    """Key lines of one GPU section: lower-cased path -> (value, original path, line)."""

    bus_id: str | None
    entries: dict[tuple[str, ...], tuple[str, tuple[str, ...], str]] = field(default_factory=dict)

    def add(self, path: tuple[str, ...], value: str, line: str) -> None:
        self.entries.setdefault(tuple(p.lower() for p in path), (value, path, line))

    def get(self, *path: str) -> tuple[str, str] | None:
        hit = self.entries.get(tuple(p.lower() for p in path))
        return (hit[0], hit[2]) if hit else None


# Keys that open a GPU's part of the report. A pasted fragment (`nvidia-smi -q -d ECC` cut after its
# header, or one GPU's block copied alone) starts with one of them and no "GPU 0000:..:00.0" line.
_GPU_KEYS = frozenset(k.lower() for k in (
    "Product Name", "Product Brand", "Product Architecture", "Display Mode", "Persistence Mode", "MIG Mode",
    "Accounting Mode", "Driver Model", "Serial Number", "GPU UUID", "Minor Number", "VBIOS Version", "PCI",
    "Fan Speed", "Performance State", "Clocks Throttle Reasons", "Clocks Event Reasons", "FB Memory Usage",
    "Compute Mode", "Utilization", "ECC Mode", "ECC Errors", "Retired Pages", "Remapped Rows", "Temperature",
    "Power Readings", "GPU Power Readings", "Clocks", "Applications Clocks", "Max Clocks", "Fabric",
    "GPU Reset Status", "Processes", "GSP Firmware Version", "Bus Id"))


def _q_tree(lines: list[str], problems: list[str]) -> tuple[dict[str, tuple[str, str]], list[_Section]]:
    """Split the report into its header keys and GPU sections, each key under its indentation path.
    A fragment without a GPU line gets an implicit section (bus id unknown); a top-level key seen
    again in such a section starts the next GPU."""
    header: dict[str, tuple[str, str]] = {}
    sections: list[_Section] = []
    stack: list[tuple[int, str]] = []
    base = 0
    implicit_top: int | None = None  # indentation of an implicit section's top-level keys
    for line in lines:
        expanded = line.expandtabs(4)
        stripped = expanded.strip()
        if not stripped or stripped.startswith("="):
            continue
        indent = len(expanded) - len(expanded.lstrip())
        gpu = _Q_GPU.fullmatch(stripped)
        if gpu:
            sections.append(_Section(bus_id=gpu.group(1)))
            stack, base, implicit_top = [], indent, None
            continue
        key, colon, value = stripped.partition(":")
        top_key = key.strip().lower() in _GPU_KEYS
        if implicit_top is not None and top_key and indent <= implicit_top and \
                any(path[0] == key.strip().lower() for path in sections[-1].entries):
            sections.append(_Section(bus_id=None))  # the same block again: the next GPU of the paste
            stack = []
        elif (not sections or (indent <= base and implicit_top is None)) and top_key:
            sections.append(_Section(bus_id=None))
            stack, base, implicit_top = [], indent - 1, indent
        current = sections[-1] if sections and indent > base else None
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if not colon:
            if current is not None:
                stack.append((indent, stripped))
            else:
                problems.append(_problem("not part of an nvidia-smi -q report", line))
        elif current is not None:
            current.add((*(name for _, name in stack), key.strip()), value.strip(), line)
        else:
            header.setdefault(key.strip().lower(), (value.strip(), line))
    return header, sections


def _count(hit: tuple[str, str] | None, problems: list[str]) -> int | None:
    if hit is None:
        return None
    value, line = hit
    number = _int(value.split()[0] if value.split() else "")
    if number is None and value.strip().lower() not in _UNKNOWN:
        problems.append(_problem("expected a count", line))
    return number


def _yes_no(hit: tuple[str, str] | None, problems: list[str]) -> bool | None:
    if hit is None:
        return None
    value, line = hit
    if value.lower() in ("yes", "no"):
        return value.lower() == "yes"
    if value.strip().lower() not in _UNKNOWN:
        problems.append(_problem("expected Yes or No", line))
    return None


def _sum(values: list[int | None]) -> int | None:
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def _ecc(s: _Section, problems: list[str]) -> EccCounts:
    # Layouts: SRAM/DRAM Correctable/Uncorrectable (Ampere+, 550 splits SRAM Uncorrectable into Parity and
    # SEC-DED) directly under Volatile/Aggregate, or the older Single Bit / Double Bit blocks with a Total.
    sums: dict[tuple[str, str], list[int | None]] = {}
    old: dict[tuple[str, str], dict[str, int | None]] = {}
    for path, (value, _, line) in s.entries.items():
        if len(path) < 3 or path[0] != "ecc errors" or path[1] not in ("volatile", "aggregate"):
            continue
        if len(path) == 3 and "correctable" in path[2]:
            kind = "uncorrectable" if "uncorrectable" in path[2] else "correctable"
            sums.setdefault((path[1], kind), []).append(_count((value, line), problems))
        elif len(path) == 4 and path[2] in ("single bit", "double bit"):
            kind = "uncorrectable" if path[2] == "double bit" else "correctable"
            old.setdefault((path[1], kind), {})[path[3]] = _count((value, line), problems)
    for key, locations in old.items():
        total = locations["total"] if "total" in locations else _sum(list(locations.values()))
        sums.setdefault(key, []).append(total)
    return EccCounts(volatile_correctable=_sum(sums.get(("volatile", "correctable"), [])),
                     volatile_uncorrectable=_sum(sums.get(("volatile", "uncorrectable"), [])),
                     aggregate_correctable=_sum(sums.get(("aggregate", "correctable"), [])),
                     aggregate_uncorrectable=_sum(sums.get(("aggregate", "uncorrectable"), [])))


def _clock_reasons(s: _Section) -> dict[str, bool]:
    reasons: dict[str, bool] = {}
    for path, (value, original, _) in s.entries.items():
        if len(path) >= 2 and path[0] in _CLOCK_SECTIONS and value.lower() in ("active", "not active"):
            reasons[original[-1]] = value.lower() == "active"
    return reasons


def _pcie(s: _Section, problems: list[str]) -> PcieLink:
    link = ("PCI", "GPU Link Info")

    def width(name: str) -> int | None:
        hit = s.get(*link, "Link Width", name)
        return _count((hit[0].rstrip("xX"), hit[1]), problems) if hit else None

    return PcieLink(gen_max=_count(s.get(*link, "PCIe Generation", "Max"), problems),
                    gen_current=_count(s.get(*link, "PCIe Generation", "Current"), problems),
                    gen_host_max=_count(s.get(*link, "PCIe Generation", "Host Max"), problems),
                    width_max=width("Max"), width_current=width("Current"))


def _text(hit: tuple[str, str] | None) -> str | None:
    return hit[0] if hit and hit[0] else None


def _q_gpu(index: int, s: _Section, problems: list[str]) -> SmiGpu:
    reasons = _clock_reasons(s)
    retired_pending = s.get("Retired Pages", "Pending Page Blacklist") or s.get("Retired Pages", "Pending")
    return SmiGpu(
        index=index, bus_id=s.bus_id, product_name=_text(s.get("Product Name")), uuid=_text(s.get("GPU UUID")),
        ecc_mode=_text(s.get("ECC Mode", "Current")), ecc=_ecc(s, problems),
        retired_pages=RetiredPages(single_bit=_count(s.get("Retired Pages", "Single Bit ECC"), problems),
                                   double_bit=_count(s.get("Retired Pages", "Double Bit ECC"), problems),
                                   pending=_yes_no(retired_pending, problems)),
        remapped_rows=RemappedRows(correctable=_count(s.get("Remapped Rows", "Correctable Error"), problems),
                                   uncorrectable=_count(s.get("Remapped Rows", "Uncorrectable Error"), problems),
                                   pending=_yes_no(s.get("Remapped Rows", "Pending"), problems),
                                   failure_occurred=_yes_no(s.get("Remapped Rows", "Remapping Failure Occurred"), problems)),
        clock_reasons=reasons,
        active_clock_reasons=[name for name, on in reasons.items() if on and name not in BENIGN_CLOCK_REASONS],
        pcie=_pcie(s, problems),
        fields={"/".join(original): value for value, original, _ in s.entries.values()})


def _q_parse(lines: list[str]) -> SmiQ:
    problems: list[str] = []
    header, sections = _q_tree(lines, problems)
    gpus = [_q_gpu(i, s, problems) for i, s in enumerate(sections)]
    attached = header.get("attached gpus")
    attached_count = _count(attached, problems)
    if attached and attached_count is not None and attached_count != len(gpus):
        problems.append(_problem(f"{len(gpus)} GPU sections for {attached_count} attached GPUs (output cut short, "
                                 "or run with -i)", attached[1]))
    if not sections:
        first = _first_line(lines)
        problems.insert(0, "empty output" if first is None else _problem("no 'GPU 00000000:07:00.0' section", first))
    return SmiQ(driver_version=_text(header.get("driver version")), cuda_version=_text(header.get("cuda version")),
                attached_gpus=attached_count, gpus=gpus, problems=problems)


def parse_smi_q(text: str) -> SmiQ:
    """Parse the full-text `nvidia-smi -q` report (also `-q -d ECC,PAGE_RETIREMENT,...`). Never raises."""
    try:
        return _capped(_q_parse(_lines(text)))
    except Exception as exc:
        return SmiQ(problems=[_internal(exc)])


# --------------------------------------------------------------------------------------------------
# What every nvidia-smi command prints when something is wrong, and the default table (`nvidia-smi`)

_HANDLE = re.compile(r"Unable to determine the device handle for GPU\s*([0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{1,2}:[0-9A-Fa-f]{1,2}"
                     r"(?:\.[0-7])?)\s*:\s*(.{0,120})")
_NO_GPU = re.compile(r"No devices were found|NVIDIA-SMI has failed|couldn't communicate with the NVIDIA driver|"
                     r"No supported GPUs were found|Failed to initialize NVML", re.I)
_INFOROM = re.compile(r"infoROM is corrupted at gpu\s+([0-9A-Fa-f:.]{7,20})", re.I)
_TABLE_ROW = re.compile(r"\|\s{1,4}([0-9]{1,3})\s{1,4}(.{1,40}?)\s{1,30}(On|Off|N/A)\s{0,4}\|\s{0,6}"
                        r"([0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{1,2}:[0-9A-Fa-f]{1,2}\.[0-7])")
_LIST_ROW = re.compile(r"GPU\s+([0-9]{1,3}):\s*(.{1,80}?)\s*\(UUID:")


@dataclass(frozen=True, slots=True)
class SmiTableRow:
    index: int
    name: str
    bus_id: str
    persistence: str | None
    err: bool
    """ERR! in the GPU's cells: the driver cannot read it (on a lost GPU, or a failing sensor)."""


@dataclass(frozen=True, slots=True)
class SmiMessages:
    """nvidia-smi's own words about GPUs it cannot reach, in any of its outputs; and the default table."""

    lost: list[tuple[str, str]] = field(default_factory=list)
    """(bus id, what nvidia-smi said): "Unable to determine the device handle for GPU ...: Unknown Error"."""
    no_gpu: str | None = None
    """The line saying it sees no GPU at all (No devices were found, NVIDIA-SMI has failed ...)."""
    inforom: list[tuple[str, str]] = field(default_factory=list)
    """(bus id, line): "WARNING: infoROM is corrupted at gpu ..."."""
    rows: list[SmiTableRow] = field(default_factory=list)
    """GPU rows of the default table, or `nvidia-smi -L` lines (bus id empty there)."""


def parse_smi_messages(text: str) -> SmiMessages:
    """The error lines of any nvidia-smi output, and the rows of `nvidia-smi` / `nvidia-smi -L`. Never raises."""
    try:
        lines = _lines(text)
        lost, inforom, rows = [], [], []
        no_gpu = None
        for k, line in enumerate(lines):
            if len(line) > 400:
                continue
            if m := _HANDLE.search(line):
                lost.append((m.group(1), quote(line)))
            elif m := _INFOROM.search(line):
                inforom.append((m.group(1), quote(line)))
            elif no_gpu is None and _NO_GPU.search(line):
                no_gpu = quote(line)
            elif m := _TABLE_ROW.search(line):
                cells = " ".join(lines[k:k + 3])
                rows.append(SmiTableRow(index=int(m.group(1)), name=m.group(2).strip(), bus_id=m.group(4),
                                        persistence=m.group(3) if m.group(3) != "N/A" else None, err="ERR!" in cells))
            elif m := _LIST_ROW.search(line):
                rows.append(SmiTableRow(index=int(m.group(1)), name=m.group(2).strip(), bus_id="", persistence=None, err=False))
        return SmiMessages(lost=lost, no_gpu=no_gpu, inforom=inforom, rows=rows)
    except Exception:
        return SmiMessages()
