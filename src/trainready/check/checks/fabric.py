"""The NVSwitch fabric: is it up (the fabric manager, each GPU's registration, what CUDA says), and
have the switches logged errors (SXid)."""

from __future__ import annotations

from ..facts import Facts, source_name
from ..parsers import node
from ..registry import Verdict, check
from .common import has_nvswitch, kernel_unreadable, missing

# NVSwitch SXid codes by the Fabric Manager user guide's tables (DU-09883-001 v1.3, "Fatal" and "Always
# Fatal NVSwitch SXid Errors"), as leptonai/gpud's components/accelerator/nvidia/sxid/sxid.go lists them.
# The kernel line's own word ("Fatal" / "Non-fatal") wins over this table.
FATAL_SXIDS = frozenset({
    11001, 11009, 11013, 11018, 11019, 11020, 12001, 12002, 12022, 12024, 12025, 12026, 12027, 12030, 12031, 12032,
    14017, 15001, 15006, 15009, 15010, 15012, 15013, 19047, 19048, 19054, 19056, 19058, 19060, 19061, 19063, 19064,
    19066, 19067, 19069, 19070, 20034, 22012, 24004, 24005, 24006, 24007,
    # always fatal: the whole fabric, the host must restart
    10001, 10002, 10003, 10004, 10005, 12020, 20009, 22003, 22011, 23001, 23002, 23003, 23004, 23005, 23006, 23007,
    23008, 23009, 23010, 23011, 23012, 23013, 23014, 23015, 23016, 23017})
FM_STATUS, FM_LOG = "fabricmanager-status.txt", "fabricmanager-log.txt"
FM_ADVICE = ("sudo systemctl restart nvidia-fabricmanager (its version must match the driver's; on NVL5 systems "
             "ib_umad and NVLSM must be up); journalctl -u nvidia-fabricmanager says why it stopped")


def fabric_applies(f: Facts) -> str | None:
    """The fabric manager is needed where there are NVSwitches; without them it says NV_WARN_NOTHING_TO_DO."""
    why = has_nvswitch(f)
    if why:
        return why
    service = f.parsed(FM_STATUS, node.parse_fabricmanager_status)
    registers = any(f.fabric_state.reported(k) for k in f.fabric_state.gpus())  # Hopper+ on an NVSwitch board
    if f.ctx.instance is None and service is not None and service.nothing_to_do and not registers:
        return "the fabric manager found no NVSwitch to manage (NV_WARN_NOTHING_TO_DO): a bridge-only or PCIe node"
    return None


@check("nvswitch.fabric", "nvswitch", needs=("fabric",), applies=fabric_applies, decisive=True)
def fabric(f: Facts) -> Verdict | None:
    nvswitch = f.ctx.instance is not None  # fabric_applies ruled out the known instances without NVSwitch
    states = {k: s.value for k in f.fabric_state.gpus() if (s := f.fabric_state.first(k))}
    bad_states = [f"{f.label(k)}: {st}" + (f" ({ss})" if ss and ss != "Success" else "") for k, (st, ss) in states.items()
                  if st != "Completed" or (ss and ss != "Success")]
    service = f.parsed(FM_STATUS, node.parse_fabricmanager_status)
    if service is not None and service.installed is None and service.active is None:
        service = None  # a status file that says nothing (systemctl missing)
    not_ready = f.fabric_not_ready
    fm_log = f.parsed(FM_LOG, node.parse_fabricmanager_log)
    observed = []
    if states:
        observed.append(f"fabric state: {', '.join(sorted({s for s, _ in states.values()}))} ({len(states)} GPUs)")
    elif f.fabric_state.known:
        observed.append("fabric state N/A (A100 and older do not register with the fabric)")
    if service is not None:
        observed.append("nvidia-fabricmanager: " + ("not installed" if service.installed is False else
                                                    f"{service.active or '?'} {service.detail or ''}".strip() +
                                                    (" (from its journal)" if service.from_journal else "")))
    if not_ready:
        observed.append(f"CUDA: {not_ready[0].value[:120]} ({source_name(not_ready[0].source)})")
    if fm_log is not None and fm_log.running:
        observed.append("its log shows it configured the NVSwitches")
    v = Verdict("pass", observed="; ".join(observed)[:400], expected="fabric manager active; GPUs registered (Completed)")
    service_bad = service is not None and (service.installed is False or (service.active or "") in ("failed", "inactive"))
    if not_ready:
        v.status = "fail"
        v.reason = ("CUDA reports the system is not yet initialized (error 802, cudaErrorSystemNotReady) or refuses NVLink "
                    "multicast (NVLS, error 401): on an NVSwitch node the fabric manager has not set up the fabric, so "
                    "CUDA programs cannot start or NCCL cannot use NVLS")
    elif bad_states:
        v.status = "fail"
        v.reason = ("GPUs not registered with the NVLink fabric: " + "; ".join(bad_states[:8]) +
                    ". CUDA fails to start on them (error 802, system not yet initialized)")
    elif service_bad:
        why = service.errors[0] if service.errors else ""
        v.status = "fail" if not states else "warn"
        v.reason = ("the fabric manager is " + ("not installed" if service.installed is False else service.active or "down") +
                    (": on an NVSwitch node the GPUs cannot use NVLink without it (CUDA error 802)" if not states else
                     ", though the GPUs registered: a GPU reset or a new partition will not register") +
                    (f"; it said: {why}" if why else ""))
    elif service is None and not states and fm_log is not None and fm_log.running:
        v.reason = "the fabric manager's log shows it configured the NVSwitches and serves the fabric"
        if fm_log.other_errors:
            v.status, v.reason = "warn", f"the fabric manager ran, and logged errors: {fm_log.other_errors[0]}"
    elif service is None and not states:
        if f.fabric_state.known:  # A100's N/A: normal, and says nothing about the service
            return Verdict.skip("the fabric manager's state is not in the bundle (A100 GPUs report Fabric State N/A, "
                                "which is normal)" + ("" if nvswitch else f"; {f.ctx.unknown_instance}"),
                                "collect `systemctl status nvidia-fabricmanager` (trainready check collect does)",
                                observed="; ".join(observed))
        return missing(f, FM_STATUS)
    elif service is not None and service.active not in ("active", None) and not states:
        v.status, v.reason = "warn", f"the fabric manager is {service.active}"
    else:
        v.reason = "the NVLink fabric is up" + ("" if states else " (the fabric manager runs)")
    if v.status != "pass":
        v.advice = FM_ADVICE
    return v


def sxid_severity(code: int, message: str) -> str:
    words = message.lower()
    if "non-fatal" in words or "nonfatal" in words:
        return "non-fatal"
    if "fatal" in words:
        return "fatal"
    return "fatal" if code in FATAL_SXIDS else "non-fatal"


@check("nvswitch.sxid", "nvswitch", needs=("sxid",), applies=has_nvswitch)
def sxid(f: Facts) -> Verdict | None:
    from ..facts.events import kernel_readable

    events: dict[tuple[str, int], str] = {}  # (switch, code) -> severity (fatal wins)
    read, unreadable = kernel_readable(f, xids=False)
    for _, e in f.sxids:
        severity = sxid_severity(e.code, e.message)
        key = (e.switch or e.bus, e.code)
        events[key] = "fatal" if "fatal" in (events.get(key), severity) else severity
    fm_log = f.parsed(FM_LOG, node.parse_fabricmanager_log)
    sources = list(read)
    if fm_log is not None:
        sources.append(FM_LOG)
        for e in fm_log.errors:
            key = (e.switch or "?", e.code or 0)
            events[key] = "fatal" if e.fatal or events.get(key) == "fatal" else "non-fatal"
    if not read and fm_log is None:
        return kernel_unreadable(f) if unreadable else None
    if not events:
        return Verdict("pass", observed="no SXid errors", expected="no NVSwitch errors",
                       reason=f"read {', '.join(source_name(s) for s in sources)}")
    fatal = sorted(f"SXid {code} on {switch}" for (switch, code), sev in events.items() if sev == "fatal")
    other = sorted(f"SXid {code} on {switch}" for (switch, code), sev in events.items() if sev != "fatal")
    v = Verdict("fail" if fatal else "warn", observed=f"{len(events)} NVSwitch error(s): " + "; ".join([*fatal, *other][:6]),
                expected="no NVSwitch errors")
    if fatal:
        v.reason = ("fatal NVSwitch errors: NVLink traffic through that switch stalls and CUDA jobs abort (Xid 45/74); "
                    "the Fabric Manager guide says to restart the node (always-fatal ones: the host)")
        v.advice = "drain the node / stop-start the instance; on your own hardware: reset the NVSwitches and GPUs"
    else:
        v.reason = "non-fatal NVSwitch errors (corrected ECC, link replays): the fabric keeps working; watch for repeats"
        v.advice = "compare with the next boot's log; if they recur, ask for the node to be serviced"
    return v
