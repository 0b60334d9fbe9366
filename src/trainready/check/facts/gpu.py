"""Per-GPU facts from nvidia-smi's outputs: `-q` (full report or a pasted fragment), the query CSV,
the default table, `nvlink -s`, and torch's view (cuda.json). Each function returns one Fact, its
observations most direct source first (`-q`, then the CSV)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..parsers import node, nvsmi
from .base import Fact, bus_key

if TYPE_CHECKING:
    from . import Facts

SMI_Q = "nvidia-smi-q.txt"
QUERY = "nvidia-smi-query-gpu.csv"
TABLE = "nvidia-smi.txt"
NVLINK = "nvidia-smi-nvlink-s.txt"
TOPO = "nvidia-smi-topo-m.txt"
NVSMI_FILES = (TABLE, SMI_Q, QUERY, TOPO, NVLINK)

# nvidia-smi's clock event reasons that mean the hardware holds the clocks down (NVIDIA's nvidia-smi
# documentation of clocks_event_reasons: hw_slowdown, hw_thermal_slowdown, hw_power_brake_slowdown,
# sw_thermal_slowdown); idle, application clocks, the SW power cap (normal under load), sync boost
# and display clocks slow nobody down.
HARMFUL_REASONS = ("HW Slowdown", "HW Thermal Slowdown", "HW Power Brake Slowdown", "SW Thermal Slowdown")
_HARMFUL_BITS = {0x8: "HW Slowdown", 0x20: "SW Thermal Slowdown", 0x40: "HW Thermal Slowdown", 0x80: "HW Power Brake Slowdown"}
_CSV_REASONS = {"clocks_throttle_reasons.hw_slowdown": "HW Slowdown",
                "clocks_throttle_reasons.hw_thermal_slowdown": "HW Thermal Slowdown",
                "clocks_throttle_reasons.hw_power_brake_slowdown": "HW Power Brake Slowdown",
                "clocks_throttle_reasons.sw_thermal_slowdown": "SW Thermal Slowdown"}


@dataclass(frozen=True, slots=True)
class Ecc:
    volatile: int | None  # uncorrectable since the driver loaded / the last reset
    aggregate: int | None  # uncorrectable over the GPU's life
    sram_volatile: int | None = None  # the SRAM share (Ampere and later print it apart)


@dataclass(frozen=True, slots=True)
class Throttle:
    active: tuple[str, ...]  # harmful reasons active
    sm_mhz: int | None = None


@dataclass(frozen=True, slots=True)
class Pcie:
    gen: int | None
    gen_max: int | None
    width: int | None
    width_max: int | None


def smi_q(f: Facts) -> nvsmi.SmiQ | None:
    return f.parsed(SMI_Q, nvsmi.parse_smi_q)


def query(f: Facts) -> nvsmi.QueryGpu | None:
    return f.parsed(QUERY, nvsmi.parse_query_gpu)


def _q_complete(f: Facts, report: nvsmi.SmiQ) -> bool:
    """A section's position is its GPU index only when the report holds every attached GPU (not when it
    ran with -i, or the paste was cut)."""
    return report.attached_gpus == len(report.gpus) and all(g.bus_id for g in report.gpus) and \
        not f.paste(SMI_Q).elided


def q_sections(f: Facts) -> list[tuple[str, nvsmi.SmiGpu]]:
    """(GPU key, section) for each GPU of `nvidia-smi -q`; keyed once per analysis, after learn_table."""
    return f.memo("q_sections", _q_sections)


def _q_sections(f: Facts) -> list[tuple[str, nvsmi.SmiGpu]]:
    report = smi_q(f)
    if report is None:
        return []
    complete = _q_complete(f, report)
    out = []
    for k, gpu in enumerate(report.gpus):
        name = "GPU (no address in the nvidia-smi -q paste)" if len(report.gpus) == 1 else \
            f"GPU #{k + 1} of the nvidia-smi -q paste (no address)"
        out.append((f.table.key(k if complete else None, bus_key(gpu.bus_id), unnamed=name), gpu))
    return out


def csv_rows(f: Facts) -> list[tuple[str, nvsmi.GpuRow]]:
    """(GPU key, row) for each GPU of the query CSV; keyed once per analysis, after learn_table."""
    return f.memo("csv_rows", _csv_rows)


def _csv_rows(f: Facts) -> list[tuple[str, nvsmi.GpuRow]]:
    report = query(f)
    if report is None:
        return []
    return [(f.table.key(row.index, bus_key(row.get("pci.bus_id")), unnamed=f"GPU #{k + 1} of the query CSV"), row)
            for k, row in enumerate(report.rows)]


def learn_table(f: Facts) -> None:
    """Index <-> bus id from every source that gives both, before any fact is keyed: the query CSV (with
    pci.bus_id), a complete nvidia-smi -q (position = index), the default table."""
    report = query(f)
    for row in report.rows if report else []:
        f.table.learn(row.index, bus_key(row.get("pci.bus_id")))
    q = smi_q(f)
    if q is not None and _q_complete(f, q):
        for k, gpu in enumerate(q.gpus):
            f.table.learn(k, bus_key(gpu.bus_id))
    table = f.parsed(TABLE, nvsmi.parse_smi_messages)
    for row in table.rows if table else []:
        f.table.learn(row.index, bus_key(row.bus_id))


def _int(value: str | None) -> int | None:
    try:
        return int(float(value)) if value not in (None, "") else None
    except ValueError:
        return None


def ecc(f: Facts) -> Fact[Ecc]:
    fact: Fact[Ecc] = Fact()
    for key, gpu in q_sections(f):
        counts = gpu.ecc
        if counts.volatile_uncorrectable is None and counts.aggregate_uncorrectable is None:
            fact.add(key, None, SMI_Q, f"ECC Mode {gpu.ecc_mode or 'not shown'}")
            continue
        sram = _sram_volatile(gpu.fields)
        fact.add(key, Ecc(counts.volatile_uncorrectable, counts.aggregate_uncorrectable, sram), SMI_Q)
    for key, row in csv_rows(f):
        volatile = _int(row.get("ecc.errors.uncorrected.volatile.total"))
        aggregate = _int(row.get("ecc.errors.uncorrected.aggregate.total"))
        if volatile is not None or aggregate is not None:
            fact.add(key, Ecc(volatile, aggregate), QUERY)
        elif "ecc.errors.uncorrected.volatile.total" in (query(f).fields if query(f) else []):
            fact.add(key, None, QUERY, "ECC counters N/A")
    return fact


def _sram_volatile(fields: dict[str, str]) -> int | None:
    values = [_int(v.split()[0]) for k, v in fields.items()
              if k.lower().startswith("ecc errors/volatile/sram uncorrectable") and v.split()]
    values = [v for v in values if v is not None]
    return sum(values) if values else None


def remap(f: Facts) -> Fact[nvsmi.RemappedRows]:
    fact: Fact[nvsmi.RemappedRows] = Fact()
    for key, gpu in q_sections(f):
        rows = gpu.remapped_rows
        reported = any(v is not None for v in (rows.pending, rows.failure_occurred, rows.uncorrectable))
        fact.add(key, rows if reported else None, SMI_Q)
    return fact


def retired(f: Facts) -> Fact[nvsmi.RetiredPages]:
    fact: Fact[nvsmi.RetiredPages] = Fact()
    for key, gpu in q_sections(f):
        pages = gpu.retired_pages
        reported = any(v is not None for v in (pages.pending, pages.double_bit, pages.single_bit))
        fact.add(key, pages if reported else None, SMI_Q)
    for key, row in csv_rows(f):
        pending = row.get("retired_pages.pending")
        if pending is not None:
            fact.add(key, nvsmi.RetiredPages(pending=pending.lower() == "yes",
                                             double_bit=_int(row.get("retired_pages.double_bit.count"))), QUERY)
    return fact


def setting(f: Facts, name: str, q_key: str, csv_field: str | None) -> Fact[str]:
    """A word-valued setting (Persistence Mode, MIG Mode/Current, ...) from -q, the CSV and the table."""
    fact: Fact[str] = Fact()
    for key, gpu in q_sections(f):
        fact.add(key, node._value(gpu.fields, q_key), SMI_Q)
    if csv_field:
        for key, row in csv_rows(f):
            value = row.get(csv_field)
            if value is not None or csv_field in (query(f).fields if query(f) else []):
                fact.add(key, value, QUERY)
    if name == "persistence":
        table = f.parsed(TABLE, nvsmi.parse_smi_messages)
        for row in table.rows if table else []:
            if row.bus_id:
                fact.add(f.table.key(row.index, bus_key(row.bus_id)),
                         {"On": "Enabled", "Off": "Disabled"}.get(row.persistence or "", None), TABLE)
    return fact


def throttle(f: Facts) -> Fact[Throttle]:
    fact: Fact[Throttle] = Fact()
    for key, gpu in q_sections(f):
        if not gpu.clock_reasons:
            fact.add(key, None, SMI_Q)
            continue
        active = tuple(r for r in HARMFUL_REASONS if gpu.clock_reasons.get(r))
        fact.add(key, Throttle(active, _mhz(gpu.fields.get("Clocks/SM"))), SMI_Q)
    for key, row in csv_rows(f):
        named = {label: row.get(field) for field, label in _CSV_REASONS.items() if row.get(field) is not None}
        mask = row.get("clocks_throttle_reasons.active")
        if named:
            fact.add(key, Throttle(tuple(r for r, v in named.items() if (v or "").lower() == "active")), QUERY)
        elif mask is not None:
            bits = _bits(mask)
            if bits is None:
                fact.add(key, None, QUERY, f"throttle mask {mask!r} unreadable")
            else:
                fact.add(key, Throttle(tuple(n for b, n in _HARMFUL_BITS.items() if bits & b), _mhz(row.get("clocks.sm"))),
                         QUERY, f"mask {mask}")
    return fact


def _bits(value: str) -> int | None:
    try:
        return int(value, 16) if value.lower().startswith("0x") else int(value)
    except ValueError:
        return None


def _mhz(value: str | None) -> int | None:
    number = (value or "").split()
    return _int(number[0]) if number else None


def pcie(f: Facts) -> Fact[Pcie]:
    fact: Fact[Pcie] = Fact()
    for key, gpu in q_sections(f):
        link = gpu.pcie
        values = Pcie(link.gen_current, link.gen_max, link.width_current, link.width_max)
        fact.add(key, values if link.width_current is not None or link.gen_current is not None else None, SMI_Q)
    for key, row in csv_rows(f):
        values = Pcie(_int(row.get("pcie.link.gen.current")), _int(row.get("pcie.link.gen.max")),
                      _int(row.get("pcie.link.width.current")), _int(row.get("pcie.link.width.max")))
        if values.width is not None or values.gen is not None:
            fact.add(key, values, QUERY)
    return fact


def model(f: Facts) -> Fact[tuple[str, int | None]]:
    """(name, memory MiB) per GPU."""
    fact: Fact[tuple[str, int | None]] = Fact()
    for key, gpu in q_sections(f):
        if gpu.product_name:
            fact.add(key, (gpu.product_name, _mib(gpu.fields.get("FB Memory Usage/Total"))), SMI_Q)
    for key, row in csv_rows(f):
        if row.name:
            fact.add(key, (row.name, row.memory_total_mib), QUERY)
    links = f.parsed(NVLINK, nvsmi.parse_nvlink_status)
    for index, gpu in sorted((links.gpus if links else {}).items()):
        if gpu.name:
            fact.add(f.table.key(index), (gpu.name, None), NVLINK)
    return fact


def _mib(value: str | None) -> int | None:
    words = (value or "").split()
    number = _int(words[0]) if words else None
    if number is None:
        return None
    unit = words[1].lower() if len(words) > 1 else "mib"
    return number * 1024 if unit == "gib" else number


def fabric_state(f: Facts) -> Fact[tuple[str, str | None]]:
    """(Fabric State, Fabric Status) per GPU from -q; None where it says N/A (A100: no fabric registration)."""
    fact: Fact[tuple[str, str | None]] = Fact()
    for key, gpu in q_sections(f):
        state = node._value(gpu.fields, "Fabric/State")
        fact.add(key, (state, node._value(gpu.fields, "Fabric/Status")) if state else None, SMI_Q)
    return fact
