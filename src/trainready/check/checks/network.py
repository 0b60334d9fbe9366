"""Network checks: EFA devices and software, NCCL/libfabric settings, InfiniBand ports."""

from __future__ import annotations

from ..facts import Facts
from ..parsers import system
from ..registry import Verdict, check
from .common import unparsed


def _efa_applies(f: Facts) -> str | None:
    if f.ctx.instance is not None and not f.ctx.instance.efa_interfaces:
        return f"{f.ctx.instance.name} has no EFA"
    return None


@check("net.efa", "net", applies=_efa_applies)
def efa(f: Facts) -> Verdict | None:
    """Judged from every file that can tell (fi_info, the /sys listing, the software listing, the
    manifest, an NCCL log); what none of them shows is `unknown` (warn/skip), never a failure."""
    ctx = f.ctx
    want = ctx.instance.efa_interfaces if ctx.instance else None
    found, libfabric, plugin, sources = _efa_evidence(ctx)
    if found is None and libfabric is None and plugin is None:
        return Verdict.skip("nothing in the bundle shows EFA devices or software"
                    + (f" ({'; '.join(sources)})" if sources else ""),
                    "collect the bundle with `trainready check collect` on the node")
    if want is None and not found:
        return Verdict.skip("instance type unknown and no EFA device found", "pass --instance TYPE")
    word = {True: "found", False: "not found", None: "unknown"}
    observed = f"{'?' if found is None else found} EFA device(s); libfabric {word[libfabric]}; aws-ofi-nccl {word[plugin]}"
    finding = Verdict(status="pass", observed=observed,
                      expected=f"{want} EFA device(s), libfabric, aws-ofi-nccl" if want else "EFA devices with libfabric and aws-ofi-nccl")
    missing = [x for x, ok in (("libfabric", libfabric), ("the aws-ofi-nccl plugin", plugin)) if ok is False]
    unknown = [x for x, ok in (("the EFA device count", found), ("libfabric", libfabric), ("the aws-ofi-nccl plugin", plugin))
               if ok is None]
    if want and found is not None and found < want:
        finding.status = "fail"
        finding.reason = (f"{found} of {want} EFA devices: multi-node NCCL falls back to TCP sockets (several x slower). "
                          "EFA is SRD over libfabric, not RoCE/InfiniBand")
        finding.advice = ("launch with EFA interfaces attached (InterfaceType=efa on every network card), in a cluster "
                          "placement group, security group allowing all traffic to and from itself; install the EFA driver")
    elif missing:
        finding.status = "fail" if want else "warn"
        finding.reason = "EFA device present but " + " and ".join(missing) + " not found"
        finding.advice = "install the EFA installer (libfabric) and aws-ofi-nccl, or use a Deep Learning AMI"
    elif unknown:
        finding.status = "warn"
        finding.reason = "could not tell " + " or ".join(unknown) + (": " + "; ".join(sources) if sources else "")
        finding.advice = "collect the bundle with `trainready check collect` (it lists the EFA software), or look in /opt/amazon"
    else:
        finding.reason = "EFA devices and software present"
    return finding


def _efa_evidence(ctx) -> tuple[int | None, bool | None, bool | None, list[str]]:
    """(EFA devices, libfabric present, aws-ofi-nccl present, what could not be read); None: unknown."""
    bundle = ctx.bundle
    counts: list[int] = []
    libfabric: bool | None = None
    plugin: bool | None = None
    gaps: list[str] = []
    fi_text = bundle.text("fi_info-p-efa.txt")
    fi_state = bundle.probe_state("fi_info-p-efa.txt")
    if fi_text is not None:
        fi = system.parse_fi_info(fi_text)
        if fi.entries or fi.no_data:  # fi_info ran: libfabric is installed; it lists the EFA devices it has
            counts.append(fi.device_count)
            libfabric = True
        elif fi.libfabric_version:
            libfabric = True
        elif not fi.command_missing:
            gaps.append(f"fi_info output unreadable{unparsed(fi, fi_text)}")
    elif fi_state in ("failed", "empty"):  # it ran (so libfabric is there) but listed nothing
        libfabric = True
        record = bundle.record("fi_info-p-efa.txt")
        if fi_state == "empty" or "-61" in (record.error if record else ""):
            counts.append(0)
    elif fi_state == "unknown":
        gaps.append("fi_info-p-efa.txt not in the bundle")
    listing = bundle.text("sys-class-infiniband.txt")
    if listing is not None:
        counts.append(len([line for line in listing.splitlines() if line.startswith("rdmap")]))
    else:
        gaps.append("sys-class-infiniband.txt not in the bundle")
    software = bundle.text("efa-software.txt")
    if software is not None:
        cells = [line.split(None, 1) for line in software.splitlines()]
        paths = [(c[0], c[1]) for c in cells if len(c) == 2 and c[0] in ("present", "absent")]
        fabric = [state for state, path in paths if "libfabric" in path]
        nccl_net = [state for state, path in paths if "nccl-net" in path]
        if fabric and libfabric is None:
            libfabric = "present" in fabric
        if nccl_net:
            plugin = "present" in nccl_net
        if not fabric or not nccl_net:
            gaps.append(f"efa-software.txt unreadable{unparsed(None, software)}")
    else:
        gaps.append("efa-software.txt not in the bundle")
    log_text = bundle.text("nccl-debug.log")
    if log_text:
        log = system.parse_nccl_debug(log_text)
        if log.transport == "ofi" or log.ofi_plugin_version or log.ofi_provider:
            plugin, libfabric = True, True  # NCCL used the plugin, over libfabric
        elif log.plugin_missing and plugin is None:
            plugin = False
    if libfabric is None and fi_state == "not-installed" and software is None:
        gaps.append("fi_info not installed (it lives in /opt/amazon/efa/bin, often not on PATH)")
    return (max(counts) if counts else None), libfabric, plugin, gaps


def _bad_env(env: dict[str, str], efa_node: bool) -> list[str]:
    bad = []
    rules = [("NCCL_P2P_DISABLE", "1", "disables NVLink/PCIe peer-to-peer: intra-node all-reduce through host memory"),
             ("NCCL_SHM_DISABLE", "1", "disables shared-memory transport"),
             ("CUDA_LAUNCH_BLOCKING", "1", "serializes every kernel launch (debug only): large slowdown"),
             ("NCCL_BLOCKING_WAIT", "1", "blocks the CPU in every collective"),
             ("NCCL_DEBUG", "TRACE", "TRACE logging slows collectives")]
    for key, value, why in rules:
        if env.get(key, "").upper() == value:
            bad.append(f"{key}={env[key]}: {why}")
    if efa_node:
        if env.get("NCCL_IB_DISABLE") == "1" and env.get("FI_PROVIDER", "efa") != "efa":
            bad.append("NCCL_IB_DISABLE=1 without EFA: cross-node traffic over sockets")
        if env.get("NCCL_NET", "").lower() == "socket":
            bad.append("NCCL_NET=Socket on an EFA node: TCP instead of EFA")
        if env.get("FI_PROVIDER") and env["FI_PROVIDER"] != "efa":
            bad.append(f"FI_PROVIDER={env['FI_PROVIDER']}: libfabric will not use EFA")
        if env.get("FI_EFA_USE_DEVICE_RDMA") == "0":
            bad.append("FI_EFA_USE_DEVICE_RDMA=0: GPUDirect RDMA off (p4d/p5 support it)")
    return bad


@check("net.nccl-env", "net")
def nccl_env(f: Facts) -> Verdict | None:
    ctx = f.ctx
    text = ctx.bundle.text("env.txt")
    log_text = ctx.bundle.text("nccl-debug.log")
    if text is None and log_text is None:
        return Verdict.skip(ctx.bundle.why_missing("env.txt"))
    efa_node = bool(ctx.instance and ctx.instance.efa_interfaces)
    bad = _bad_env(system.parse_env(text) if text else {}, efa_node)
    log_note = ""
    if log_text:
        log = system.parse_nccl_debug(log_text)
        if log.transport == "socket":
            bad.append("nccl-debug.log shows NET/Socket: cross-node traffic over TCP"
                       + (" (the aws-ofi-nccl plugin was not found)" if log.plugin_missing else ""))
        log_note = f"; log transport: {log.transport}"
    finding = Verdict(status="pass",
                      observed=(f"{len(bad)} setting(s) that hurt" if bad else "no harmful NCCL/CUDA settings") + log_note,
                      expected="no settings that disable fast transports", reason="; ".join(bad)[:500] or "nothing found")
    if bad:
        finding.status = "fail" if any("Socket" in b or "P2P" in b or "EFA" in b for b in bad) else "warn"
        finding.advice = ("unset the variables named; for EFA: FI_PROVIDER=efa, aws-ofi-nccl on LD_LIBRARY_PATH, and a "
                          "security group that allows all traffic to and from itself")
    elif text is None:  # only the log was there: the variables themselves are unknown, not harmless
        finding.status, finding.observed = "warn", "environment unknown" + log_note
        finding.reason = f"{ctx.bundle.why_missing('env.txt')}; the NCCL log shows no harmful transport"
        finding.advice = "collect the bundle with `trainready check collect` on the node (it saves env.txt)"
    return finding




@check("net.infiniband", "net", needs=("infiniband",))
def infiniband(f: Facts) -> Verdict | None:
    """Only ports whose link layer is InfiniBand are the compute fabric: an Ethernet port (a front-end
    NIC, RoCE) that is down is noted, never a failure. EFA devices are net.efa's."""
    ib = f.infiniband
    if not ib.read:
        return None
    fabric = [p for p in ib.ports if (p.link_layer or "").lower() == "infiniband"]
    ethernet = [p for p in ib.ports if (p.link_layer or "").lower() == "ethernet"]
    eth_down = [p for p in ethernet if not p.active]
    note = (f"; {len(ethernet)} Ethernet port(s), {len(eth_down)} down (not the InfiniBand fabric: not judged)"
            if ethernet else "")
    if not fabric:
        return Verdict.skip("no InfiniBand port listed" + note + (f" ({ib.notes[0]})" if ib.notes else ""),
                            observed=f"{len(ib.ports)} RDMA port(s), none InfiniBand")
    down = [p for p in fabric if not p.active]
    name = lambda p: f"{p.device} port {p.port}: {p.state or '?'}" + (f"/{p.physical}" if p.physical else "")  # noqa: E731
    v = Verdict("pass", expected="every InfiniBand port Active / LinkUp",
                observed=f"{len(fabric) - len(down)} of {len(fabric)} InfiniBand port(s) active" + note)
    if down:
        v.status = "fail"
        v.reason = ("InfiniBand ports down: " + "; ".join(name(p) for p in down[:8]) +
                    " (Polling: no link partner or a bad cable; Down with LinkUp: no subnet manager answered)")
        v.advice = "check the cable/transceiver and the subnet manager (sminfo); on a cloud VM: stop/start for another host"
    elif ib.notes and any("ibpanic" in n or "ibwarn" in n for n in ib.notes):
        v.status, v.partial = "warn", True
        v.reason = f"ibstat stopped early ({ib.notes[0]}): the ports it did not list are unknown"
        v.advice = "run `ibstat` by hand (a device whose driver is wedged makes it stop)"
    else:
        v.reason = "every InfiniBand port is up"
    return v
