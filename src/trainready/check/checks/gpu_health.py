"""Is each GPU healthy: memory errors and repairs, Xid events, clocks held down, PCIe link."""

from __future__ import annotations

from ..facts import Facts, source_name
from ..facts.events import kernel_readable
from ..parsers import nvsmi
from ..registry import Verdict, check
from ..xid import judge
from .common import kernel_unreadable, plural, squeeze

RESET = "reset the GPU (sudo nvidia-smi -r -i N, or reboot) so the pending repair takes effect, then check again"


@check("gpu.ecc", "gpu", needs=("ecc", "retired-pages", "row-remap"), decisive=True, gpu=True)
def gpu_ecc(f: Facts) -> Verdict | None:
    """Fails: uncorrectable errors since boot, a row remap or page retirement waiting for a reset, a
    remap that found no spare row, a corrupted infoROM. Warns: uncorrectable errors in the GPU's past."""
    fails, warns, notes = [], [], []
    now = f.ecc.any(lambda e: bool(e.volatile))
    for key, seen in now.items():
        sram = next((s.value.sram_volatile for s in seen if s.value.sram_volatile), None)
        fails.append(f"{f.label(key)}: {max(s.value.volatile for s in seen)} uncorrectable ECC errors since boot" +
                     (f" ({sram} in SRAM)" if sram else ""))
    for key, seen in f.ecc.any(lambda e: bool(e.aggregate)).items():
        if key not in now:
            warns.append(f"{f.label(key)}: {max(s.value.aggregate for s in seen)} uncorrectable ECC errors in its lifetime")
    for key, seen in f.remap.any(lambda r: bool(r.failure_occurred)).items():
        fails.append(f"{f.label(key)}: row remapping failed (no spare row left)")
    for key, seen in f.remap.any(lambda r: bool(r.pending)).items():
        fails.append(f"{f.label(key)}: a row remap is pending until the GPU is reset")
    for key, seen in f.remap.any(lambda r: bool(r.uncorrectable) and not r.pending).items():
        notes.append(f"{f.label(key)}: {seen[0].value.uncorrectable} rows remapped after uncorrectable errors (in effect)")
    for key, seen in f.retired.any(lambda p: bool(p.pending)).items():
        fails.append(f"{f.label(key)}: a page retirement is pending until the GPU is reset")
    for key, seen in f.retired.any(lambda p: bool(p.double_bit) and not p.pending).items():
        warns.append(f"{f.label(key)}: {seen[0].value.double_bit} pages retired after double-bit errors")
    inforom = _inforom(f)
    fails += inforom
    known = any(f.ecc.reported(k) for k in f.ecc.gpus()) or any(f.remap.reported(k) for k in f.remap.gpus()) or \
        any(f.retired.reported(k) for k in f.retired.gpus())
    if not known and not inforom:
        if f.ecc.known or f.remap.known:
            return Verdict.skip("ECC counters, row remapping and page retirement not reported (ECC off or not supported "
                                "on this GPU)", "on data-center GPUs enable ECC: nvidia-smi -e 1, then reboot")
        return None
    disagree = f.ecc.disagreements(f.table, show=lambda e: f"{e.volatile} since boot / {e.aggregate} lifetime")
    gpus = len(set(f.ecc.gpus()) | set(f.remap.gpus()))
    v = Verdict("pass", expected="0 uncorrectable errors; no pending or failed row remap / page retirement",
                observed=squeeze("; ".join(fails + warns + notes) or f"no uncorrectable errors, no pending repairs ({gpus} GPUs)", 400))
    if fails:
        v.status = "fail"
        v.reason = squeeze("; ".join(fails), 500)
        failed = any("failed" in x or "infoROM" in x for x in fails)
        v.advice = ("the GPU has run out of spare memory rows or its infoROM is damaged: drain the node / stop-start the "
                    "instance (RMA)" if failed else RESET + "; uncorrectable errors since boot: do not train on it until then")
    elif warns:
        v.status, v.reason = "warn", squeeze("; ".join(warns), 500)
        v.advice = "watch for new errors (nvidia-smi -q -d ECC,ROW_REMAPPER); replace the GPU if they recur"
    else:
        v.reason = "no uncorrectable ECC errors and no pending repairs" + (f" ({'; '.join(notes)})" if notes else "")
    if disagree:
        v.reason = squeeze(v.reason + "; sources disagree: " + "; ".join(disagree[:3]), 600)
        if v.status == "pass":
            v.status = "warn"
    return v


def _inforom(f: Facts) -> list[str]:
    out = []
    for name in ("nvidia-smi.txt", "nvidia-smi-q.txt", "nvidia-smi-query-gpu.csv"):
        words = f.parsed(name, nvsmi.parse_smi_messages)
        for bus, line in words.inforom if words else []:
            out.append(f"infoROM corrupted on GPU {bus} ({source_name(name)}: {line}): ECC and retirement records "
                       "cannot be trusted")
    return out


@check("gpu.xid", "gpu", needs=("xid",), decisive=True)
def gpu_xid(f: Facts) -> Verdict | None:
    read, unreadable = kernel_readable(f)
    if not read:
        return kernel_unreadable(f) if unreadable else None
    lost = {k: v for k, v in f.inventory.lost.items() if any(s.source in read for s in v)}
    fails, warns, codes = [], [], set()
    for key in f.xids.gpus():
        events = [s.value for s in f.xids.by_gpu[key]]
        judged = [(e, judge(e)) for e in events]
        own = {e.code: j.severity for e, j in judged if j.root is None}
        for e, j in judged:
            codes.add(e.code)
            if e.code == 79 and key in lost:
                continue  # said once, as a lost GPU
            severity = own.get(j.root, j.severity) if j.root is not None else j.severity
            line = f"{f.label(key)}: Xid {e.code} {j.why}"
            target = fails if severity == "fail" else warns
            if line not in target:
                target.append(line)
    for key, seen in lost.items():
        fails.insert(0, f"{f.label(key)} lost: {seen[0].value}")
    events = sum(len(v) for v in f.xids.by_gpu.values())
    observed = (f"{plural(events, 'Xid event')} (code{'s' if len(codes) > 1 else ''} {', '.join(map(str, sorted(codes)))})"
                if codes else "no Xid events") + (f"; {plural(len(lost), 'GPU')} lost" if lost else "")
    v = Verdict("pass", observed=observed, expected="no Xid errors, no GPU lost")
    if fails:
        v.status = "fail"
        v.reason = squeeze("; ".join(fails + warns), 700)
        v.advice = ("hardware Xids (NVIDIA's catalog: reset the GPU, reboot the node or service it): reboot, then check "
                    "again; if they recur, stop/start the instance (other hardware) or drain the node")
        if lost:
            v.lost = "only" if len(fails) == len(lost) else "also"
    elif warns:
        v.status, v.reason = "warn", squeeze("; ".join(warns), 700)
        v.advice = ("usually the application (NVIDIA's catalog: restart the application): check your job's own errors; "
                    "the same Xid repeating on one GPU across jobs points at the GPU")
    else:
        v.reason = f"kernel log read ({', '.join(source_name(n) for n in read)}): no Xid lines, no GPU lost"
    return v


@check("gpu.throttle", "gpu", needs=("throttle",), gpu=True)
def gpu_throttle(f: Facts) -> Verdict | None:
    fact = f.throttle
    reported = {k: fact.reported(k) for k in fact.gpus() if fact.reported(k)}
    if not reported:
        return Verdict.skip("clock event (throttle) reasons not reported") if fact.known else None
    bad = {}
    for key, seen in reported.items():
        active = sorted({r for s in seen for r in s.value.active})
        if active:
            mhz = next((s.value.sm_mhz for s in seen if s.value.sm_mhz), None)
            bad[key] = ", ".join(active) + (f" at {mhz} MHz" if mhz else "")
    v = Verdict("pass", expected="no HW slowdown, power brake or thermal slowdown active",
                observed="; ".join(f"{f.label(k)}: {x}" for k, x in bad.items()) or f"none active ({len(reported)} GPUs)")
    if bad:
        v.status = "fail"
        v.reason = ("clocks held down by the hardware (HW slowdown: power brake or thermal; SW thermal slowdown): every "
                    "kernel on these GPUs runs slower, and a synchronous job runs at the slowest GPU's pace")
        v.advice = ("read `nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER`; active at idle means a cooling or power fault: "
                    "stop/start the instance or drain the node")
    else:
        v.reason = "no hardware slowdown (idle, application clocks and SW power cap are normal)"
    if disagree := fact.disagreements(f.table, show=lambda t: ", ".join(t.active) or "none active"):
        v.reason += "; sources disagree: " + "; ".join(disagree[:3])
        v.status = "warn" if v.status == "pass" else v.status
    return v


@check("gpu.pcie", "gpu", needs=("pcie",), gpu=True)
def gpu_pcie(f: Facts) -> Verdict | None:
    fact = f.pcie
    narrow, slow, seen = [], [], 0
    for key in fact.gpus():
        for s in fact.reported(key)[:1]:
            link = s.value
            if link.width is not None and link.width_max is not None:
                seen += 1
                if link.width < link.width_max:  # the width seldom drops at idle; the generation does (power saving)
                    narrow.append(f"{f.label(key)} x{link.width} of x{link.width_max}")
    for key, limits in f.pcie_limited().items():
        e = limits[0].event
        seen += 1
        if e.limited_width < e.capable_width:  # the limiting link may be a slot wired narrower: warn, not fail
            slow.append(f"{f.label(key)}: the kernel saw its path limited to x{e.limited_width} of the x{e.capable_width} "
                        f"it is capable of (at {e.at})")
        elif e.limited_gts < e.capable_gts:
            slow.append(f"{f.label(key)}: the kernel saw {e.limited_gts:g} of {e.capable_gts:g} GT/s (at {e.at})")
    if not seen:
        return Verdict.skip("PCIe link fields not reported") if fact.known else None
    v = Verdict("pass", expected="full link width on every GPU",
                observed="; ".join(narrow + slow) or f"full width ({seen} link(s) read)")
    if narrow:
        v.status = "fail"
        v.reason = "PCIe link trained narrower than the slot: host<->GPU copies (and GPUDirect) slow down"
        v.advice = "stop/start the instance for other hardware (on your own: reseat or replace the card or riser)"
    elif slow:
        v.status = "warn"
        v.reason = ("the kernel saw a GPU's PCIe path below what the GPU is capable of, at enumeration: a link that trained "
                    "down, or a slot wired narrower (risers, laptops); GPUs also lower the link speed at idle to save "
                    "power. nvidia-smi -q's Link Width Max (what this system allows) tells a fault from the design")
        v.advice = "read `nvidia-smi -q -d PCI` under load, and run a copy test (trainready check --deep)"
    else:
        v.reason = "link width at maximum (the generation may idle lower to save power: that is normal)"
    return v
