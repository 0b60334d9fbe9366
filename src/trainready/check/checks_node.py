"""Acceptance quick checks on the GPUs' settings: persistence mode, application clocks, VBIOS, GSP,
MIG, NVSwitch fabric and SXid errors, and leftover GPU processes.

They read `nvidia-smi -q` (every bundle since the first has it), plus files collected since issue 16
(`systemctl status nvidia-fabricmanager`, the fabric manager's log, the compute-apps query, `ps`).
A file a bundle lacks makes its check skip with why; only evidence fails."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from trainready.errors import printable

from .checks_gpu import _see_count
from .context import Context
from .findings import Finding, skip
from .parsers import node, nvsmi, system
from .registry import check

SMI_Q = "nvidia-smi-q.txt"
RECOLLECT = "a bundle from an older trainready: collect it again (trainready check collect --out DIR)"

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


def parsed(ctx: Context, name: str, parser: Callable[[str], Any]) -> Any:
    """`parser(file)`, once per analysis and parser (several parsers read nvidia-smi -q); None if absent."""
    key = f"{name}::{parser.__module__}.{parser.__name__}"
    if key not in ctx._parsed:
        text = ctx.bundle.text(name)
        ctx._parsed[key] = None if text is None else parser(text)
    return ctx._parsed[key]


def missing(check_id: str, area: str, ctx: Context, name: str) -> Finding:
    """Skip: the file this check reads is not in the bundle. A manifest without a record of its probe
    means a trainready older than the probe collected the bundle: say so, and how to get it."""
    bundle = ctx.bundle
    if name not in bundle.files and name not in bundle.refused and bundle.manifest is not None \
            and bundle.record(name) is None and bundle.source != "live":
        return skip(check_id, area, f"{name} was not collected: the bundle's manifest has no such probe "
                    f"(trainready {printable(bundle.manifest.tool_version)} collected it)", RECOLLECT)  # its words
    return skip(check_id, area, bundle.why_missing(name), RECOLLECT if bundle.probe_state(name) == "unknown"
                and bundle.source != "live" else "")


def _settings(check_id: str, ctx: Context) -> list[node.GpuSettings] | Finding:
    folded = _see_count(ctx, check_id, SMI_Q)
    if folded is not None:
        return folded
    smi_q = ctx.parsed(SMI_Q, nvsmi.parse_smi_q)
    if smi_q is None:
        return missing(check_id, "gpu", ctx, SMI_Q)
    settings = node.gpu_settings(smi_q)
    if not settings:
        why = smi_q.problems[0] if smi_q.problems else "no GPU sections"
        return skip(check_id, "gpu", f"nvidia-smi -q unreadable: {why}"[:300], "run `nvidia-smi -q` by hand")
    return settings


def _gpus(indices: list[int]) -> str:
    return ", ".join(map(str, indices[:16])) + (f" and {len(indices) - 16} more" if len(indices) > 16 else "")


@check("gpu.persistence", "gpu")
def persistence(ctx: Context) -> Finding:
    settings = _settings("gpu.persistence", ctx)
    if isinstance(settings, Finding):
        return settings
    off = [s.index for s in settings if (s.persistence or "").lower() == "disabled"]
    unknown = [s.index for s in settings if s.persistence is None]
    finding = Finding(id="gpu.persistence", area="gpu", status="pass", expected="Enabled on every GPU",
                      observed=f"Disabled on GPU {_gpus(off)}" if off else
                      f"Enabled on {len(settings) - len(unknown)} of {len(settings)} GPUs")
    if off:
        finding.status = "warn"
        finding.reason = ("persistence mode off: the driver tears the GPU state down whenever no process holds it, so "
                          "every CUDA start (each rank, each nvidia-smi) pays the initialization again, and settings "
                          "made with nvidia-smi are lost")
        finding.advice = "sudo nvidia-smi -pm 1 (or trainready check --fix); at boot: enable nvidia-persistenced"
    elif unknown and len(unknown) == len(settings):
        finding.status, finding.reason = "skip", "nvidia-smi -q does not report Persistence Mode"
    else:
        finding.reason = "persistence mode on"
    return finding


@check("gpu.clocks", "gpu")
def application_clocks(ctx: Context) -> Finding:
    settings = _settings("gpu.clocks", ctx)
    if isinstance(settings, Finding):
        return settings
    low, seen = [], []
    for s in settings:
        pairs = [(s.app_graphics_mhz, s.default_app_graphics_mhz, "graphics"), (s.app_memory_mhz, s.default_app_memory_mhz, "memory")]
        for now, default, what in pairs:
            if now is None or default is None:
                continue
            seen.append(s.index)
            if now < default:
                low.append(f"GPU {s.index} {what} {now} of {default} MHz")
    if not seen:
        return skip("gpu.clocks", "gpu", "application clocks not reported (N/A or deprecated on this GPU and driver)")
    sample = next(s for s in settings if s.index in seen)
    finding = Finding(id="gpu.clocks", area="gpu", status="pass", expected="application clocks at their defaults",
                      observed="; ".join(low[:6]) if low else
                      f"graphics {sample.app_graphics_mhz} MHz, memory {sample.app_memory_mhz} MHz (the defaults)")
    if low:
        finding.status = "warn"
        finding.reason = "application clocks set below their defaults (nvidia-smi -ac): every kernel runs slower"
        finding.advice = "sudo nvidia-smi -rac (or trainready check --fix) resets them; locked clocks: sudo nvidia-smi -rgc"
    else:
        finding.reason = "application clocks at their defaults (locked clocks, nvidia-smi -lgc, are not shown by -q)"
    return finding


@check("gpu.vbios", "gpu")
def vbios(ctx: Context) -> Finding:
    settings = _settings("gpu.vbios", ctx)
    if isinstance(settings, Finding):
        return settings
    versions = Counter(s.vbios for s in settings if s.vbios)
    if not versions:
        return skip("gpu.vbios", "gpu", "nvidia-smi -q does not report VBIOS Version")
    finding = Finding(id="gpu.vbios", area="gpu", status="pass", expected="one VBIOS version on every GPU",
                      observed=", ".join(f"{v} ({n} GPUs)" for v, n in versions.most_common()))
    if len(versions) > 1:
        odd = [s.index for s in settings if s.vbios and s.vbios != versions.most_common(1)[0][0]]
        finding.status = "fail"
        finding.reason = (f"GPUs run different VBIOS versions (GPU {_gpus(odd)} differ): a firmware update that did "
                          "not finish; Azure's node health checks fail such a node (check_vbios_version)")
        finding.advice = "drain the node / stop-start the instance for other hardware; on your own hardware: update every GPU"
    else:
        finding.reason = "every GPU runs the same VBIOS (gpu.driver checks the driver the same way)"
    return finding


@check("gpu.gsp", "gpu")
def gsp(ctx: Context) -> Finding:
    settings = _settings("gpu.gsp", ctx)
    if isinstance(settings, Finding):
        return settings
    modes = Counter("off" if (s.gsp_firmware or "N/A").upper() == "N/A" else s.gsp_firmware for s in settings)
    observed = ", ".join(("GSP off" if m == "off" else f"GSP firmware {m}") + f" ({n} GPUs)" for m, n in modes.most_common())
    finding = Finding(id="gpu.gsp", area="gpu", status="pass", observed=observed,
                      expected="one GSP mode on every GPU (noted, not judged)")
    if len(modes) > 1:
        finding.status = "warn"
        finding.reason = "GPUs differ in GSP firmware mode or version: a half-applied driver setting or upgrade"
        finding.advice = "reboot after the driver change; NVreg_EnableGpuFirmware must be the same for every GPU"
    else:
        finding.reason = ("the GPU System Processor runs the driver's firmware (the default on recent drivers; Xid 119/120 "
                          "are GSP timeouts)" if "off" not in modes else "GSP off: the driver runs on the CPU")
    return finding


@check("gpu.mig", "gpu")
def mig(ctx: Context) -> Finding:
    settings = _settings("gpu.mig", ctx)
    if isinstance(settings, Finding):
        return settings
    on = [s.index for s in settings if (s.mig_current or "").lower() == "enabled"]
    pending = [s.index for s in settings if s.mig_pending and s.mig_current and s.mig_pending != s.mig_current]
    reported = [s for s in settings if s.mig_current]
    want = "MIG on (--mig)" if ctx.mig_expected else "MIG off on every GPU"
    if not reported:
        return Finding(id="gpu.mig", area="gpu", status="warn" if ctx.mig_expected else "pass", observed="MIG not supported (N/A)",
                       expected=want, reason="these GPUs have no MIG mode" + ("; --mig cannot apply" if ctx.mig_expected else ""))
    finding = Finding(id="gpu.mig", area="gpu", status="pass", expected=want,
                      observed=f"MIG enabled on GPU {_gpus(on)}" if on else f"MIG disabled on {len(reported)} GPUs")
    if on and not ctx.mig_expected:
        finding.status = "fail"
        finding.reason = "MIG splits each GPU into isolated slices: a training process sees one slice, not the GPU"
        finding.advice = "sudo nvidia-smi -mig 0, then reset the GPUs (nvidia-smi -r); pass --mig if slices are intended"
    elif ctx.mig_expected and len(on) < len(reported):
        finding.status, finding.reason = "warn", "--mig says MIG is intended, but it is off on some GPUs"
        finding.advice = "sudo nvidia-smi -mig 1 on them, then reset the GPUs"
    elif pending:
        finding.status = "warn"
        finding.reason = f"a MIG mode change on GPU {_gpus(pending)} waits for a GPU reset"
        finding.advice = "reset the GPUs (sudo nvidia-smi -r, or reboot) before training"
    else:
        finding.reason = "MIG as intended"
    return finding


def _nvswitch_node(ctx: Context) -> bool | None:
    return None if ctx.instance is None else ctx.instance.topology == "nvswitch"


@check("nvswitch.fabric", "nvswitch")
def fabric(ctx: Context) -> Finding:
    nvswitch = _nvswitch_node(ctx)
    if nvswitch is False:
        return Finding(id="nvswitch.fabric", area="nvswitch", status="pass", observed="not applicable",
                       expected=f"no NVSwitch on {ctx.instance.name}", reason="no fabric manager needed")
    smi_q = ctx.parsed(SMI_Q, nvsmi.parse_smi_q)
    states = [(s.index, s.fabric_state, s.fabric_status) for s in node.gpu_settings(smi_q) if s.fabric_state]
    status_text = parsed(ctx, "fabricmanager-status.txt", node.parse_fabricmanager_status)
    bad_states = [f"GPU {i}: {st}" + (f" ({ss})" if ss and ss != "Success" else "") for i, st, ss in states
                  if st != "Completed" or (ss and ss != "Success")]
    service = None if status_text is None or (status_text.installed is None and status_text.active is None) else status_text
    if nvswitch is None and not states:
        return skip("nvswitch.fabric", "nvswitch", f"{ctx.unknown_instance}: cannot tell whether the node has NVSwitches",
                    "pass --instance TYPE")
    expected = "fabric manager active; every GPU's fabric state Completed"
    observed = []
    if states:
        observed.append(f"fabric state: {', '.join(sorted({s for _, s, _ in states}))} ({len(states)} GPUs)")
    if service is not None:
        observed.append("nvidia-fabricmanager: " + ("not installed" if service.installed is False else
                                                    f"{service.active or '?'} {service.detail or ''}".strip()))
    finding = Finding(id="nvswitch.fabric", area="nvswitch", status="pass", observed="; ".join(observed)[:300],
                      expected=expected)
    service_bad = service is not None and (service.installed is False or (service.active or "") in ("failed", "inactive"))
    if bad_states:
        finding.status = "fail"
        finding.reason = ("GPUs not registered with the NVLink fabric: " + "; ".join(bad_states[:8]) +
                          ". CUDA fails to start on them (error 802, system not yet initialized)")
    elif service_bad and not states:
        finding.status = "fail"
        finding.reason = ("the fabric manager is " + ("not installed" if service.installed is False else service.active or "down") +
                          ": on an NVSwitch node the GPUs cannot use NVLink without it (CUDA error 802)" +
                          (f"; {service.errors[0]}" if service.errors else ""))
    elif service_bad:
        finding.status = "warn"
        finding.reason = ("fabric state Completed, but the fabric manager service is " + (service.active or "not installed") +
                          ": a GPU reset or a new partition will not register")
    elif not states and service is None:
        return missing("nvswitch.fabric", "nvswitch", ctx, "fabricmanager-status.txt")
    else:
        finding.reason = "the NVLink fabric is up"
    if finding.status != "pass":
        finding.advice = ("sudo systemctl restart nvidia-fabricmanager (its version must match the driver's); "
                          "journalctl -u nvidia-fabricmanager says why it stopped")
    return finding


def sxid_severity(code: int, message: str) -> str:
    words = message.lower()
    if "non-fatal" in words or "nonfatal" in words:
        return "non-fatal"
    if "fatal" in words:
        return "fatal"
    return "fatal" if code in FATAL_SXIDS else "non-fatal"


@check("nvswitch.sxid", "nvswitch")
def sxid(ctx: Context) -> Finding:
    events: dict[tuple[str, int], str] = {}  # (switch, code) -> severity (fatal wins)
    readable, sources = False, []
    for name in ("kernel-xid.txt", "kernel-log.txt"):
        text = ctx.bundle.text(name)
        if text is None:
            continue
        log = system.parse_xid(text)
        if log.readable:
            readable = True
            sources.append(name)
        for e in log.sxid_events:
            severity = sxid_severity(e.code, e.message)
            key = (e.switch or e.pci, e.code)
            events[key] = "fatal" if "fatal" in (events.get(key), severity) else severity
    fm_log = parsed(ctx, "fabricmanager-log.txt", node.parse_fabricmanager_log)
    if fm_log is not None:
        sources.append("fabricmanager-log.txt")
        for e in fm_log.errors:
            key = (e.switch or "?", e.code or 0)
            events[key] = "fatal" if e.fatal or events.get(key) == "fatal" else "non-fatal"
    if not readable and fm_log is None:
        if ctx.bundle.text("kernel-xid.txt") is not None:
            return skip("nvswitch.sxid", "nvswitch", f"kernel log was not readable on {ctx.bundle.machine} (dmesg needs root)",
                        "sudo trainready check" if ctx.bundle.source == "live" else
                        "collect the bundle again as root there: sudo trainready check collect --out DIR")
        return missing("nvswitch.sxid", "nvswitch", ctx, "kernel-xid.txt")
    if not events:
        applies = _nvswitch_node(ctx)
        return Finding(id="nvswitch.sxid", area="nvswitch", status="pass", observed="no SXid errors",
                       expected="no NVSwitch errors", reason=f"read {', '.join(sources)}" +
                       ("" if applies is not False else " (no NVSwitch on this instance type)"))
    fatal = sorted(f"SXid {code} on {switch}" for (switch, code), sev in events.items() if sev == "fatal")
    other = sorted(f"SXid {code} on {switch}" for (switch, code), sev in events.items() if sev != "fatal")
    finding = Finding(id="nvswitch.sxid", area="nvswitch", status="fail" if fatal else "warn",
                      observed=f"{len(events)} NVSwitch error(s): " + "; ".join([*fatal, *other][:6]),
                      expected="no NVSwitch errors")
    if fatal:
        finding.reason = ("fatal NVSwitch errors: NVLink traffic through that switch stalls and CUDA jobs abort (Xid 45/74); "
                          "the Fabric Manager guide says to restart the node (always-fatal ones: the host)")
        finding.advice = "drain the node / stop-start the instance; on your own hardware: reset the NVSwitches and GPUs"
    else:
        finding.reason = "non-fatal NVSwitch errors (corrected ECC, link replays): the fabric keeps working; watch for repeats"
        finding.advice = "compare with the next boot's log; if they recur, ask for the node to be serviced"
    return finding


@check("gpu.processes", "gpu")
def gpu_processes(ctx: Context) -> Finding:
    folded = _see_count(ctx, "gpu.processes", SMI_Q)
    if folded is not None:
        return folded
    own = set(ctx.bundle.manifest.own_pids if ctx.bundle.manifest else [])
    apps = parsed(ctx, "nvidia-smi-compute-apps.csv", node.parse_compute_apps)
    source = "nvidia-smi --query-compute-apps"
    if apps is None:
        apps = parsed(ctx, SMI_Q, node.parse_smi_q_processes)
        source = "nvidia-smi -q"
    if apps is None:
        return missing("gpu.processes", "gpu", ctx, "nvidia-smi-compute-apps.csv")
    ps = parsed(ctx, "ps.txt", node.parse_ps)
    owners = ps.by_pid() if ps is not None else {}
    others = [p for p in apps.processes if p.pid not in own]
    finding = Finding(id="gpu.processes", area="gpu", status="pass", expected="no process on the GPUs before training",
                      observed="none" if not others else "; ".join(_describe(p, owners) for p in others[:6]))
    if not others:
        finding.reason = f"no GPU process ({source})" + (f"; {len(apps.processes)} of trainready's own" if apps.processes else "")
        return finding
    finding.observed = f"{len(others)} process(es): {finding.observed}"
    if source == "nvidia-smi -q" and not own:
        finding.status = "warn"
        finding.reason = ("nvidia-smi -q lists processes on the GPUs; this bundle predates trainready's own-PID "
                          "record, so one of them may be its CUDA probe")
    else:
        finding.status = "fail"
        finding.reason = "processes hold GPUs: they take memory and compute from the training job (and may OOM it)"
    finding.advice = "end them (kill PID; ask their owner) or wait for them; then check again"
    return finding


def _describe(p: node.GpuProcess, owners: dict[int, node.PsEntry]) -> str:
    owner = owners.get(p.pid)
    parts = [p.name or (owner.command if owner else None) or "?"]
    if owner and owner.user:
        parts.append(f"user {owner.user}")
    if p.used_mib is not None:
        parts.append(f"{p.used_mib} MiB")
    if p.gpu:
        parts.append(f"on {p.gpu}")
    return f"PID {p.pid} ({', '.join(parts)})"
