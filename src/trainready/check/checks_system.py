"""Host checks: CPU, memory, storage tiers, network (EFA, NCCL settings), CUDA runtime."""

from __future__ import annotations

from .context import Context
from .findings import Finding, skip
from .parsers import system
from .probes import cuda_summary
from .registry import check

GIB = 1024**3


def _unparsed(parsed, text: str) -> str:
    """What could not be read, shown: the parser's first problem, else the first line."""
    problems = getattr(parsed, "problems", None) or []
    if problems:
        return f": {problems[0]}"
    first = next((line.strip() for line in text.splitlines() if line.strip()), "(empty)")
    return f": first line {first[:120]!r}"


@check("cpu.vcpu-per-gpu", "cpu")
def vcpu_per_gpu(ctx: Context) -> Finding:
    text = ctx.bundle.text("lscpu.txt")
    if text is None:
        return skip("cpu.vcpu-per-gpu", "cpu", ctx.bundle.why_missing("lscpu.txt"))
    lscpu = system.parse_lscpu(text)
    cpus = lscpu.cpus
    gpus = ctx.gpu_count or _gpus_seen(ctx)
    if not cpus:
        return skip("cpu.vcpu-per-gpu", "cpu", "CPU count not found in lscpu output" + _unparsed(lscpu, text))
    if not gpus:  # nothing to divide by: unknown, not a pass
        return Finding(id="cpu.vcpu-per-gpu", area="cpu", status="skip", observed=f"{cpus} vCPUs",
                       expected=">= 8 vCPUs per GPU",
                       reason="CPU-only node (--cpu-only): no GPU to feed" if ctx.cpu_only and gpus == 0 else
                       "no GPU visible (see gpu.count): vCPUs per GPU cannot be judged" if gpus == 0 else
                       "GPU count unknown (see gpu.count): vCPUs per GPU cannot be judged")
    per = cpus / gpus
    finding = Finding(id="cpu.vcpu-per-gpu", area="cpu", status="pass", observed=f"{cpus} vCPUs for {gpus} GPUs ({per:.1f} each)",
                      expected=">= 8 vCPUs per GPU")
    if ctx.instance and ctx.instance.vcpus and cpus < ctx.instance.vcpus:
        finding.status = "fail"
        finding.reason = f"{cpus} vCPUs visible, {ctx.instance.name} has {ctx.instance.vcpus} (a cgroup/container limit?)"
        finding.advice = "give the container all CPUs (docker --cpus / Kubernetes requests)"
    elif per < 8:
        finding.status = "warn"
        finding.reason = "fewer than 8 vCPUs per GPU: data loading and tokenization may starve the GPUs"
        finding.advice = "pre-tokenize and pack data into shards (trainready data), keep num_workers <= vCPUs/GPU - 1"
    else:
        finding.reason = "enough CPU for data-loader workers"
    return finding


def _gpus_seen(ctx: Context) -> int | None:
    from .checks_gpu import presence

    return presence(ctx).count


@check("mem.host", "mem")
def host_memory(ctx: Context) -> Finding:
    text = ctx.bundle.text("meminfo.txt")
    if text is None:
        return skip("mem.host", "mem", ctx.bundle.why_missing("meminfo.txt"))
    info = system.parse_meminfo(text)
    if not info.total_bytes:
        return skip("mem.host", "mem", "MemTotal not found in /proc/meminfo" + _unparsed(info, text))
    total = info.total_bytes / GIB
    gpus = ctx.gpu_count or _gpus_seen(ctx) or 0
    observed = f"{total:.0f} GiB" + (f" ({total / gpus:.0f} GiB per GPU)" if gpus else "")
    finding = Finding(id="mem.host", area="mem", status="pass", observed=observed,
                      expected=ctx.expect(f"{ctx.instance.ram_gib:g} GiB" if ctx.instance and ctx.instance.ram_gib else "unknown"))
    if ctx.instance and ctx.instance.ram_gib and total < 0.9 * ctx.instance.ram_gib:
        finding.status = "fail"
        finding.reason = f"{total:.0f} GiB visible, {ctx.instance.name} has {ctx.instance.ram_gib:g} GiB"
        finding.advice = "a container memory limit? raise it; else this is not the instance you pay for"
    elif ctx.job and ctx.job.host_ram_gib and ctx.job.host_ram_gib > (info.available_bytes or info.total_bytes) / GIB:
        finding.status = "fail"
        finding.reason = f"the job needs {ctx.job.host_ram_gib:.0f} GiB of host RAM ({ctx.job.description}), " \
                         f"{(info.available_bytes or info.total_bytes) / GIB:.0f} GiB available"
        finding.advice = "use less offload (ZeRO-3 without CPU offload, more nodes) or a larger instance"
    else:
        finding.reason = "host memory as expected" + (f"; the job's {ctx.job.host_ram_gib:.0f} GiB fits" if ctx.job and ctx.job.host_ram_gib else "")
    return finding


@check("storage.hot-tier", "storage")
def hot_tier(ctx: Context) -> Finding:
    text = ctx.bundle.text("lsblk.json")
    if text is None:
        return skip("storage.hot-tier", "storage", ctx.bundle.why_missing("lsblk.json"))
    lsblk = system.parse_lsblk_json(text)
    devices = lsblk.devices
    if not devices:
        return skip("storage.hot-tier", "storage", "no block devices parsed from lsblk.json" + _unparsed(lsblk, text))
    local = [d for d in devices if d.is_instance_store or (d.is_nvme and not _is_ebs(d))]
    want = ctx.instance.nvme_count if ctx.instance else None
    unmounted = [d for d in local if not _mounted(d)]
    observed = f"{len(local)} local NVMe device(s)" + (f", {len(unmounted)} unmounted/unassembled" if unmounted else "")
    finding = Finding(id="storage.hot-tier", area="storage", status="pass", observed=observed,
                      expected=ctx.expect(f"{want} NVMe instance-store device(s), assembled and mounted" if want else
                                          "no local NVMe" if want == 0 else "unknown"))
    if want and len(local) < want:
        finding.status, finding.reason = "fail", f"{len(local)} of {want} instance-store NVMe devices present"
        finding.advice = "instance store lost? stop/start the instance"
    elif local and unmounted:
        names = " ".join(f"/dev/{d.name}" for d in unmounted)
        finding.status = "fail" if len(unmounted) == len(local) else "warn"
        finding.reason = f"local NVMe not in use: {names} (a fast hot tier for checkpoints going unused)"
        finding.advice = (f"sudo mdadm --create /dev/md0 --level=0 --raid-devices={len(unmounted)} {names} && "
                          "sudo mkfs.xfs /dev/md0 && sudo mkdir -p /scratch && sudo mount /dev/md0 /scratch")
    elif not local:
        finding.status = "warn" if want is None else "pass"
        finding.reason = "no local NVMe: checkpoints go to network storage (slower saves)" if want is None else "none expected"
        finding.advice = "" if want == 0 else "choose an instance with instance-store NVMe for the hot tier, or accept slower saves"
    else:
        mounted = sorted({f"{m} ({dev.fstype or '?'})" for d in local for dev in [d, *d.children] for m in dev.mountpoints})
        finding.observed += f"; mounted: {', '.join(mounted)}" if mounted else ""
        finding.reason = "local NVMe mounted"
    need = ctx.job.checkpoint_gib * (ctx.job.keep_checkpoints + 1) if ctx.job and ctx.job.checkpoint_gib else None
    if need and finding.status == "pass":
        free, where = _free_gib(ctx, local)
        if free is not None and free < need:
            finding.status = "fail"
            finding.reason = f"{free:.0f} GiB free on {where}, checkpoints need {need:.0f} GiB ({ctx.job.keep_checkpoints}+1 kept)"
            finding.advice = "free space, lower keep_hot, or use an instance with more local NVMe"
        elif free is not None:
            finding.reason += f"; {free:.0f} GiB free on {where} for {need:.0f} GiB of checkpoints"
    return finding


def _is_ebs(device) -> bool:
    return "Elastic Block Store" in (device.model or "")


def _mounted(device) -> bool:
    return bool(device.mountpoints) or any(_mounted(c) for c in device.children)


def _free_gib(ctx: Context, devices) -> tuple[float | None, str]:
    """Free space where the local NVMe is mounted (df); without df, the devices' size as an upper bound."""
    mountpoints = [m for d in devices for dev in [d, *d.children] for m in dev.mountpoints]
    text = ctx.bundle.text("df.txt")
    if text and mountpoints:
        df = system.parse_df(text)
        entries = [e for e in (df.find(m) for m in mountpoints) if e is not None]
        if entries:
            best = max(entries, key=lambda e: e.avail_bytes)
            return best.avail_bytes / GIB, best.target
    total = sum(d.size_bytes or 0 for d in devices)
    return (total / GIB if total else None), "local NVMe (size; df not collected)"


SHARED_TYPES = ("lustre", "nfs", "nfs4", "fuse.mountpoint-s3", "fuse.s3fs", "fuse.gcsfuse", "beegfs", "gpfs", "wekafs")


@check("storage.shared", "storage")
def shared_storage(ctx: Context) -> Finding:
    text = ctx.bundle.text("mounts.txt")
    if text is None:
        return skip("storage.shared", "storage", ctx.bundle.why_missing("mounts.txt"))
    mounts = system.parse_mounts(text)
    shared = mounts.of_type(SHARED_TYPES)
    missing = _fstab_unmounted(ctx, mounts)
    if missing:
        return Finding(id="storage.shared", area="storage", status="fail", observed="; ".join(missing[:3]),
                       expected="every shared filesystem in /etc/fstab mounted",
                       reason="a shared filesystem the node is configured for is not mounted" +
                       (" and its client is missing" if any("no kernel support" in m for m in missing) else ""),
                       advice="install the client (FSx Lustre: lustre-client matching the kernel; EFS: amazon-efs-utils / "
                              "nfs-utils), then `sudo mount -a`")
    if not shared:
        return Finding(id="storage.shared", area="storage", status="warn", observed="no shared filesystem mounted",
                       expected="a shared filesystem (FSx Lustre, EFS/NFS) or an S3 archive for checkpoints",
                       reason="without shared storage a lost node loses its checkpoints unless they go to S3",
                       advice="use CheckpointManager(archive='s3://...') or mount FSx for Lustre / EFS")
    desc = ", ".join(f"{m.mountpoint} ({m.fstype})" for m in shared[:4])
    finding = Finding(id="storage.shared", area="storage", status="pass", observed=desc, expected="a shared filesystem",
                      reason="shared storage mounted (throughput: --deep --shared-dir PATH)")
    measured = ctx.deep("shared")
    if measured and "write_gbps" in measured:
        finding.observed += f"; {measured['directory']}: write {measured['write_gbps']:.2f} GB/s, read {measured['read_gbps']:.2f} GB/s"
        finding.reason = "shared storage mounted and measured"
        if measured["write_gbps"] < 0.2:
            finding.status, finding.reason = "warn", "shared storage slower than 0.2 GB/s: checkpoint uploads will lag"
            finding.advice = "raise the file system's throughput (FSx: more capacity/throughput tier) or archive to S3"
    return finding


def _fstab_unmounted(ctx: Context, mounts) -> list[str]:
    """Shared filesystems listed in /etc/fstab but not mounted, with whether the kernel knows the type."""
    fstab = ctx.bundle.text("fstab.txt")
    if not fstab:
        return []
    filesystems = ctx.bundle.text("filesystems.txt")
    known = set(filesystems.split()) if filesystems else None
    mounted = {m.mountpoint for m in mounts.entries}
    missing = []
    for line in fstab.splitlines():
        cells = line.split()
        if len(cells) < 3 or cells[0].startswith("#") or not cells[2].startswith(("lustre", "nfs", "efs")):
            continue
        if cells[1] not in mounted and "noauto" not in (cells[3] if len(cells) > 3 else ""):
            kernel_type = "nfs4" if cells[2] == "efs" else cells[2]
            client = ("kernel client unknown (/proc/filesystems not in the bundle)" if known is None else
                      "client present" if kernel_type in known else "no kernel support for " + kernel_type)
            missing.append(f"{cells[1]} ({cells[2]} from {cells[0]}) not mounted, {client}")
    return missing


@check("net.efa", "net")
def efa(ctx: Context) -> Finding:
    """Judged from every file that can tell (fi_info, the /sys listing, the software listing, the
    manifest, an NCCL log); what none of them shows is `unknown` (warn/skip), never a failure."""
    want = ctx.instance.efa_interfaces if ctx.instance else None
    if ctx.instance is not None and not want:
        return Finding(id="net.efa", area="net", status="pass", observed="not applicable",
                       expected=f"no EFA on {ctx.instance.name}", reason="instance type without EFA")
    found, libfabric, plugin, sources = _efa_evidence(ctx)
    if found is None and libfabric is None and plugin is None:
        return skip("net.efa", "net", "nothing in the bundle shows EFA devices or software"
                    + (f" ({'; '.join(sources)})" if sources else ""),
                    "collect the bundle with `trainready check collect` on the node")
    if want is None and not found:
        return skip("net.efa", "net", "instance type unknown and no EFA device found", "pass --instance TYPE")
    word = {True: "found", False: "not found", None: "unknown"}
    observed = f"{'?' if found is None else found} EFA device(s); libfabric {word[libfabric]}; aws-ofi-nccl {word[plugin]}"
    finding = Finding(id="net.efa", area="net", status="pass", observed=observed,
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


def _efa_evidence(ctx: Context) -> tuple[int | None, bool | None, bool | None, list[str]]:
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
            gaps.append(f"fi_info output unreadable{_unparsed(fi, fi_text)}")
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
            gaps.append(f"efa-software.txt unreadable{_unparsed(None, software)}")
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
def nccl_env(ctx: Context) -> Finding:
    text = ctx.bundle.text("env.txt")
    log_text = ctx.bundle.text("nccl-debug.log")
    if text is None and log_text is None:
        return skip("net.nccl-env", "net", ctx.bundle.why_missing("env.txt"))
    efa_node = bool(ctx.instance and ctx.instance.efa_interfaces)
    bad = _bad_env(system.parse_env(text) if text else {}, efa_node)
    log_note = ""
    if log_text:
        log = system.parse_nccl_debug(log_text)
        if log.transport == "socket":
            bad.append("nccl-debug.log shows NET/Socket: cross-node traffic over TCP"
                       + (" (the aws-ofi-nccl plugin was not found)" if log.plugin_missing else ""))
        log_note = f"; log transport: {log.transport}"
    finding = Finding(id="net.nccl-env", area="net", status="pass",
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


TORCH_ADVICE = "pip install 'trainready[torch]' (or your own CUDA build of torch)"


@check("cuda.runtime", "cuda")
def cuda_runtime(ctx: Context) -> Finding:
    data = cuda_summary(ctx.bundle)
    if data is None:
        return skip("cuda.runtime", "cuda", ctx.bundle.why_missing("cuda.json"))
    if "unparsable" in data:
        return skip("cuda.runtime", "cuda", f"cuda.json unparsable: {data['unparsable']}")
    if not data.get("torch"):
        return skip("cuda.runtime", "cuda", "torch is not installed", TORCH_ADVICE)
    if not data.get("cuda_available"):
        seen = _gpus_seen(ctx)
        observed = f"torch {data['torch']}: CUDA not available"
        if seen == 0:  # no GPU at all: one root cause, reported by gpu.count
            return Finding(id="cuda.runtime", area="cuda", status="skip", observed=observed, expected="a GPU",
                           reason="CPU-only node (--cpu-only): CUDA not needed" if ctx.cpu_only else
                           "no GPU visible: see gpu.count")
        expected_gpus = seen or ctx.gpu_count
        status = "fail" if expected_gpus else "skip"
        return Finding(id="cuda.runtime", area="cuda", status=status, observed=observed,
                       expected=f"torch sees {expected_gpus} GPUs" if expected_gpus else "a GPU",
                       reason=data.get("reason", "") if expected_gpus else
                       f"{data.get('reason', 'CUDA not available')}; GPU count unknown (see gpu.count)",
                       advice="install a CUDA build of torch matching the driver" if expected_gpus else "")
    count = data.get("device_count", 0)
    want = ctx.gpu_count
    finding = Finding(id="cuda.runtime", area="cuda", status="pass", observed=f"torch {data['torch']} sees {count} GPUs",
                      expected=ctx.expect(f"{want} GPUs"))
    if want and count < want:
        finding.status, finding.reason = "fail", f"torch sees {count} of {want} GPUs"
        finding.advice = "check CUDA_VISIBLE_DEVICES and the container's --gpus setting"
    else:
        finding.reason = "torch sees every GPU"
    return finding


@check("cuda.graphs", "cuda")
def cuda_graphs(ctx: Context) -> Finding:
    data = cuda_summary(ctx.bundle)
    graphs = (data or {}).get("graphs")
    if not graphs:
        no_gpu = "CPU-only node (--cpu-only)" if ctx.cpu_only else "no GPU visible: see gpu.count"
        reason = (no_gpu if _gpus_seen(ctx) == 0 else
                  "CUDA not available: see cuda.runtime" if data and not data.get("cuda_available") else
                  "no CUDA device to capture on" if data else ctx.bundle.why_missing("cuda.json"))
        return skip("cuda.graphs", "cuda", reason)
    if graphs.get("ok"):
        return Finding(id="cuda.graphs", area="cuda", status="pass", observed="captured and replayed; result matches eager",
                       expected="capture + replay == eager", reason=f"max abs diff {graphs.get('max_abs_diff', 0):.2e}")
    return Finding(id="cuda.graphs", area="cuda", status="fail", observed=graphs.get("error", "replay differs from eager"),
                   expected="capture + replay == eager", reason="CUDA graphs broken: torch.compile(mode='reduce-overhead') "
                   "and CUDA-graph NCCL paths will fail", advice="update the driver / torch build pair")
