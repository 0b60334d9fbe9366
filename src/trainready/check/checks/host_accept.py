"""Acceptance quick checks on the host: GPUDirect RDMA for EFA, PCIe ACS on the GPU/NIC paths,
processes in D state, NVMe count, CPU governor and clock source, NIC link flaps and errors, and
block-device I/O errors. Each reads files collected since issue 16; without them, it skips with why."""

from __future__ import annotations

from ..facts import Facts
from ..parsers import node, system
from ..registry import Verdict, check
from .common import kernel_unreadable, missing

KERNEL_LOG = "kernel-log.txt"
# aznhc's check_ib_link_flapping fails a device with this many lost-carrier events in 24 h (its default
# threshold, github.com/Azure/azurehpc-health-checks customTests/azure_ib_link_flapping.nhc at 0e0a1ac).
LINK_FLAP_FAIL = 5
# Clock sources whose reads leave the vDSO (a hypervisor call or an I/O port): every timestamp costs
# microseconds. The Intel SDM, as Linux's kvmguest TSC commit 7539b174 quotes it: "TSC reads are much more
# efficient and do not incur the overhead associated with a ring transition or access to a platform resource".
SLOW_CLOCKSOURCES = ("xen", "hpet", "acpi_pm", "jiffies", "refined-jiffies", "pit")
# Linux gained dma-buf import for RDMA memory regions in 5.12 ("RDMA/umem: Support importing dma-buf as user
# memory region"): with it, EFA reaches GPU memory without the nvidia_peermem module.
DMABUF_KERNEL = (5, 12)


def _gdr_node(ctx) -> bool | None:
    """GPUDirect RDMA over EFA is offered on EFA instances with NVSwitch boards (p4d, p4de, p5*, p6)."""
    if ctx.instance is None:
        return None
    return bool(ctx.instance.efa_interfaces) and ctx.instance.topology == "nvswitch"


def _gdr_applies(f: Facts) -> str | None:
    if _gdr_node(f.ctx) is False:
        return f"{f.ctx.instance.name} has no GPUDirect RDMA over EFA"
    return None


@check("net.gpudirect-rdma", "net", applies=_gdr_applies)
def gpudirect_rdma(f: Facts) -> Verdict | None:
    ctx = f.ctx
    if _gdr_node(ctx) is None:
        return Verdict.skip(f"{ctx.unknown_instance}: cannot tell whether EFA GPUDirect RDMA applies", "pass --instance TYPE")
    env = system.parse_env(ctx.bundle.text("env.txt") or "")
    log_text = ctx.bundle.text("nccl-debug.log")
    log = system.parse_nccl_debug(log_text) if log_text else None
    modules = f.parsed("modules.txt", node.parse_modules)
    release = node.kernel_release(ctx.bundle.text("uname.txt")) if ctx.bundle.text("uname.txt") else None
    device_rdma = env.get("FI_EFA_USE_DEVICE_RDMA")
    expected = "GPUDirect RDMA: nvidia_peermem loaded or dma-buf (Linux >= 5.12); FI_EFA_USE_DEVICE_RDMA not 0"
    facts = []
    if modules is not None:
        facts.append("nvidia_peermem " + ("loaded" if "nvidia_peermem" in modules.names else "not loaded"))
    if release:
        facts.append(f"kernel {release[0]}.{release[1]}")
    if device_rdma is not None:
        facts.append(f"FI_EFA_USE_DEVICE_RDMA={device_rdma}")
    if log is not None:
        facts.append("NCCL log: " + ("GDRDMA" if log.gdrdma else "no GDRDMA"))
    finding = Verdict(status="pass", observed="; ".join(facts) or "unknown",
                      expected=expected)
    advice = ("load nvidia_peermem (sudo modprobe nvidia_peermem) or use a kernel >= 5.12 with the EFA driver's dma-buf "
              "support; unset FI_EFA_USE_DEVICE_RDMA=0; check with NCCL_DEBUG=INFO that channels say GDRDMA")
    if device_rdma == "0":
        finding.status, finding.advice = "fail", advice
        finding.reason = "FI_EFA_USE_DEVICE_RDMA=0 turns GPUDirect RDMA off: every EFA transfer is staged through host memory"
    elif log is not None and log.gdrdma:
        finding.reason = "NCCL used GPUDirect RDMA (GDRDMA in the log)"
    elif modules is not None and "nvidia_peermem" in modules.names:
        finding.reason = "nvidia_peermem loaded: EFA can register GPU memory"
    elif modules is not None and release is not None and release >= DMABUF_KERNEL:
        finding.reason = (f"no nvidia_peermem, but Linux {release[0]}.{release[1]} imports GPU memory through dma-buf "
                          "(confirm GDRDMA in an NCCL_DEBUG=INFO log)")
    elif modules is not None and release is not None:
        finding.status, finding.advice = "fail", advice
        finding.reason = (f"neither nvidia_peermem nor dma-buf (Linux {release[0]}.{release[1]} < 5.12): GPUDirect RDMA "
                          "is unavailable, EFA traffic is staged through host memory")
    elif modules is not None:
        finding.status, finding.advice = "warn", advice
        finding.reason = "nvidia_peermem not loaded and the kernel release is unknown (uname.txt not in the bundle)"
    else:
        return missing(f, "modules.txt")
    return finding


@check("pci.acs", "pci")
def pci_acs(f: Facts) -> Verdict | None:
    lspci = f.parsed("lspci-vvv.txt", node.parse_lspci)
    if lspci is None:
        return missing(f, "lspci-vvv.txt")
    if not lspci.devices:
        return Verdict.skip("no device in lspci -vvv output" + (f": {lspci.problems[0]}" if lspci.problems else ""))
    if lspci.notes and not any(b.acs_ctl is not None for b in lspci.devices):
        return Verdict.skip("lspci ran without root: ACS control registers are not shown",
                    "sudo trainready check (or collect the bundle as root)")
    on_path = [(b, below) for b, below in lspci.path_bridges() if below]
    redirect = [(b, below) for b, below in on_path if b.acs_ctl.get("ReqRedir") or b.acs_ctl.get("CmpltRedir")]
    validate = [(b, below) for b, below in on_path if b.acs_ctl.get("SrcValid") and (b, below) not in redirect]
    endpoints = sum(1 for d in lspci.devices if d.is_gpu or d.is_nic)

    def names(items):
        return "; ".join(f"{b.address} above {', '.join(e.address for e in below[:3])}" for b, below in items[:4])

    finding = Verdict(status="pass", expected="ACS off on the bridges between GPUs and NICs",
                      observed=f"{len(on_path)} ACS-capable bridge(s) above {endpoints} GPU/NIC(s); "
                               f"{len(redirect)} redirecting, {len(validate)} source-validating")
    advice = ("disable ACS on those bridges (BIOS setting, or per NCCL's troubleshooting guide: "
              "setpci -s BDF ECAP_ACS+0x6.w=0000); on a cloud VM: stop/start for another host")
    if redirect:
        finding.status, finding.advice = "fail", advice
        finding.reason = ("ACS redirects peer-to-peer requests to the root complex on " + names(redirect) +
                          ": GPU-GPU and GPUDirect traffic takes the long way (NCCL: hangs or low bandwidth)")
    elif validate:
        finding.status, finding.advice = "warn", advice
        finding.reason = "ACS source validation on (SrcValid+, which NCCL's guide reads as ACS enabled) on " + names(validate)
    elif not on_path:
        finding.reason = ("no ACS-capable bridge above a GPU or RDMA NIC" +
                          (" (a VM's flat bus shows none)" if endpoints else "; no GPU or RDMA NIC listed"))
    else:
        finding.reason = "ACS off on every bridge above the GPUs and NICs"
    return finding


@check("proc.d-state", "cpu")
def d_state(f: Facts) -> Verdict | None:
    ps = f.parsed("ps.txt", node.parse_ps)
    events = f.parsed(KERNEL_LOG, node.parse_kernel_events)
    if ps is None and (events is None or not events.readable):
        return missing(f, "ps.txt")
    stuck = ps.d_state() if ps is not None else []
    hung = events.hung_tasks if events is not None else []
    observed = (f"{len(stuck)} in D state" + (": " + ", ".join(f"PID {e.pid} {e.command} ({e.user})" for e in stuck[:5])
                                              if stuck else "")) if ps is not None else "ps not collected"
    if hung:
        observed += f"; kernel: {len(hung)} hung task report(s) ({', '.join(hung[:3])})"
    finding = Verdict(status="pass", observed=observed,
                      expected="no process stuck in uninterruptible sleep")
    if stuck or hung:
        finding.status = "warn"
        finding.reason = ("processes in uninterruptible sleep (D) or kernel hung-task reports: usually I/O that does not "
                          "return (a hung NFS/Lustre mount, a failing disk, a stuck driver)")
        finding.advice = "cat /proc/PID/stack (root) for where they wait; check storage.shared and storage.io-errors"
    else:
        finding.reason = "no process waits on I/O that does not return"
    return finding


@check("storage.nvme-count", "storage")
def nvme_count(f: Facts) -> Verdict | None:
    ctx = f.ctx
    devices = f.parsed("nvme-devices.txt", node.parse_nvme_devices)
    if devices is None:
        finding = missing(f, "nvme-devices.txt")
        finding.reason += " (storage.hot-tier counts them from lsblk)"
        return finding
    if not devices.controllers and devices.problems:  # garbage is unknown, not "0 controllers" (an empty file is)
        return Verdict.skip(f"nvme-devices.txt unreadable: {devices.problems[0]}")
    want = ctx.instance.nvme_count if ctx.instance else None
    local = devices.instance_store or sorted(set(devices.controllers) - set(devices.ebs))
    finding = Verdict(status="pass",
                      observed=f"{len(local)} local NVMe controller(s)" + (f", {len(devices.ebs)} EBS" if devices.ebs else ""),
                      expected=ctx.expect(f"{want} instance-store NVMe device(s)" if want is not None else "unknown"))
    if want is None:
        finding.status, finding.reason = "skip", f"{ctx.unknown_instance}: the expected count is unknown"
        finding.advice = "pass --instance TYPE"
    elif len(local) < want:
        finding.status = "fail"
        finding.reason = f"{len(local)} of {want} instance-store NVMe controllers: the hot tier is short of what you pay for"
        finding.advice = "stop/start the instance for another host (instance-store drives are not repaired in place)"
    else:
        finding.reason = "every instance-store NVMe device present"
    return finding


@check("cpu.governor", "cpu")
def cpu_governor(f: Facts) -> Verdict | None:
    freq = f.parsed("cpufreq.txt", node.parse_cpufreq)
    if freq is None:
        return missing(f, "cpufreq.txt")
    if freq.exposed is False:
        return Verdict(status="pass", observed="no cpufreq (not exposed to the OS)",
                       expected="performance", reason="frequency is set by the hypervisor or firmware, not the guest")
    if not freq.governors:
        return Verdict.skip("cpufreq.txt unreadable" + (f": {freq.problems[0]}" if freq.problems else ""))
    slow = {g: n for g, n in freq.governors.items() if g != "performance"}
    finding = Verdict(status="pass", expected="performance on every CPU",
                      observed=", ".join(f"{g} ({n} CPUs)" for g, n in sorted(freq.governors.items())))
    if slow:
        finding.status = "warn"
        finding.reason = ("CPUs scale their frequency down when idle (" + ", ".join(slow) + "): data loaders, the "
                          "launch path and NCCL's proxy threads wake up slow")
        finding.advice = "sudo cpupower frequency-set -g performance (or the tuned/BIOS performance profile)"
    else:
        finding.reason = "every CPU at the performance governor"
    return finding


@check("cpu.clocksource", "cpu")
def clocksource(f: Facts) -> Verdict | None:
    source = f.parsed("clocksource.txt", node.parse_clocksource)
    if source is None:
        return missing(f, "clocksource.txt")
    if not source.current:
        return Verdict.skip("current clock source not in clocksource.txt")
    finding = Verdict(status="pass", observed=source.current,
                      expected="tsc (or kvm-clock / arch_sys_counter)")
    if source.current in SLOW_CLOCKSOURCES:
        finding.status = "warn"
        finding.reason = (f"{source.current} is read through the hypervisor or an I/O port, not the vDSO: every "
                          "timestamp (profilers, NCCL, Python's time) costs microseconds")
        finding.advice = ("echo tsc | sudo tee /sys/devices/system/clocksource/clocksource0/current_clocksource"
                          if "tsc" in source.available else "boot with clocksource=tsc tsc=reliable if the CPU's TSC is invariant")
    else:
        finding.reason = "a clock source read without leaving user space"
    return finding


def _kernel_events(f: Facts) -> node.KernelEvents | Verdict:
    events = f.parsed(KERNEL_LOG, node.parse_kernel_events)
    if events is None:
        return missing(f, KERNEL_LOG)
    if not events.readable:
        return kernel_unreadable(f)
    return events


@check("net.link-flaps", "net")
def link_flaps(f: Facts) -> Verdict | None:
    events = _kernel_events(f)
    if isinstance(events, Verdict):
        return events
    flapping = {d: n for d, n in events.link_down.items() if n >= LINK_FLAP_FAIL}
    observed = ", ".join(f"{d}: {n} link down" for d, n in sorted(events.link_down.items())[:6]) or "no link down events"
    if events.nic_errors:
        observed += "; driver errors on " + ", ".join(sorted(events.nic_errors)[:6])
    finding = Verdict(status="pass", observed=observed,
                      expected=f"no NIC link flaps (fail: >= {LINK_FLAP_FAIL} on one device, aznhc's threshold) or driver errors")
    if flapping:
        finding.status = "fail"
        finding.reason = (f"links that keep going down ({', '.join(flapping)}): collectives over them stall and retry; "
                          f"Azure's health checks fail a node with >= {LINK_FLAP_FAIL} in 24 h")
        finding.advice = "drain the node / stop-start the instance; on your own hardware: reseat or replace the cable/transceiver"
    elif events.link_down or events.nic_errors:
        finding.status = "warn"
        lines = [line for lines in events.nic_errors.values() for line in lines]
        finding.reason = ("NIC link went down or its driver logged errors since boot" +
                          (f": {lines[0]}" if lines else "")) [:400]
        finding.advice = "watch the kernel log (dmesg -w) during a collective test; repeated events mean a bad link"
    else:
        finding.reason = "kernel log read: no EFA/InfiniBand link or driver errors"
    return finding


@check("storage.io-errors", "storage")
def io_errors(f: Facts) -> Verdict | None:
    events = _kernel_events(f)
    if isinstance(events, Verdict):
        return events
    observed = ", ".join(f"{d}: {n} I/O error(s)" for d, n in sorted(events.io_errors.items())[:6])
    if events.io_timeouts:
        observed = "; ".join(x for x in (observed, ", ".join(f"{d}: {n} timeout(s)" for d, n in
                                                              sorted(events.io_timeouts.items())[:6])) if x)
    finding = Verdict(status="pass", observed=observed or "none",
                      expected="no block-device I/O errors")
    if events.io_errors:
        finding.status = "fail"
        finding.reason = "I/O errors on " + ", ".join(sorted(events.io_errors)) + ": checkpoints or data there may be lost"
        finding.advice = "do not use that device: stop/start the instance (instance store) or replace the volume"
    elif events.io_timeouts:
        finding.status = "warn"
        finding.reason = "NVMe commands timed out (the controller was reset): a failing or overloaded drive"
        finding.advice = "watch for I/O errors; move the hot tier off that drive if they recur"
    else:
        finding.reason = "kernel log read: no I/O errors"
    return finding
