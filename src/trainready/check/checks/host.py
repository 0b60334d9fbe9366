"""Host checks: CPU, memory, storage tiers."""

from __future__ import annotations

from ..facts import Facts
from ..parsers import system
from ..registry import Verdict, check
from .common import presence, unparsed

GIB = 1024**3


@check("cpu.vcpu-per-gpu", "cpu")
def vcpu_per_gpu(f: Facts) -> Verdict | None:
    ctx = f.ctx
    text = ctx.bundle.text("lscpu.txt")
    if text is None:
        return Verdict.skip(ctx.bundle.why_missing("lscpu.txt"))
    lscpu = system.parse_lscpu(text)
    cpus = lscpu.cpus
    gpus = ctx.gpu_count or _gpus_seen(f)
    if not cpus:
        return Verdict.skip("CPU count not found in lscpu output" + unparsed(lscpu, text))
    if not gpus:  # nothing to divide by: unknown, not a pass
        return Verdict(status="skip", observed=f"{cpus} vCPUs",
                       expected=">= 8 vCPUs per GPU",
                       reason="CPU-only node (--cpu-only): no GPU to feed" if ctx.cpu_only and gpus == 0 else
                       "no GPU visible (see gpu.count): vCPUs per GPU cannot be judged" if gpus == 0 else
                       "GPU count unknown (see gpu.count): vCPUs per GPU cannot be judged")
    per = cpus / gpus
    finding = Verdict(status="pass", observed=f"{cpus} vCPUs for {gpus} GPUs ({per:.1f} each)",
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


def _gpus_seen(f: Facts) -> int | None:
    return presence(f).count


@check("mem.host", "mem")
def host_memory(f: Facts) -> Verdict | None:
    ctx = f.ctx
    text = ctx.bundle.text("meminfo.txt")
    if text is None:
        return Verdict.skip(ctx.bundle.why_missing("meminfo.txt"))
    info = system.parse_meminfo(text)
    if not info.total_bytes:
        return Verdict.skip("MemTotal not found in /proc/meminfo" + unparsed(info, text))
    total = info.total_bytes / GIB
    gpus = ctx.gpu_count or _gpus_seen(f) or 0
    observed = f"{total:.0f} GiB" + (f" ({total / gpus:.0f} GiB per GPU)" if gpus else "")
    finding = Verdict(status="pass", observed=observed,
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
def hot_tier(f: Facts) -> Verdict | None:
    ctx = f.ctx
    text = ctx.bundle.text("lsblk.json")
    if text is None:
        return Verdict.skip(ctx.bundle.why_missing("lsblk.json"))
    lsblk = system.parse_lsblk_json(text)
    devices = lsblk.devices
    if not devices:
        return Verdict.skip("no block devices parsed from lsblk.json" + unparsed(lsblk, text))
    local = [d for d in devices if d.is_instance_store or (d.is_nvme and not _is_ebs(d))]
    want = ctx.instance.nvme_count if ctx.instance else None
    unmounted = [d for d in local if not _mounted(d)]
    observed = f"{len(local)} local NVMe device(s)" + (f", {len(unmounted)} unmounted/unassembled" if unmounted else "")
    finding = Verdict(status="pass", observed=observed,
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


def _free_gib(ctx, devices) -> tuple[float | None, str]:
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
def shared_storage(f: Facts) -> Verdict | None:
    ctx = f.ctx
    text = ctx.bundle.text("mounts.txt")
    if text is None:
        return Verdict.skip(ctx.bundle.why_missing("mounts.txt"))
    mounts = system.parse_mounts(text)
    shared = mounts.of_type(SHARED_TYPES)
    missing = _fstab_unmounted(ctx, mounts)
    if missing:
        return Verdict(status="fail", observed="; ".join(missing[:3]),
                       expected="every shared filesystem in /etc/fstab mounted",
                       reason="a shared filesystem the node is configured for is not mounted" +
                       (" and its client is missing" if any("no kernel support" in m for m in missing) else ""),
                       advice="install the client (FSx Lustre: lustre-client matching the kernel; EFS: amazon-efs-utils / "
                              "nfs-utils), then `sudo mount -a`")
    if not shared:
        return Verdict(status="warn", observed="no shared filesystem mounted",
                       expected="a shared filesystem (FSx Lustre, EFS/NFS) or an S3 archive for checkpoints",
                       reason="without shared storage a lost node loses its checkpoints unless they go to S3",
                       advice="use CheckpointManager(archive='s3://...') or mount FSx for Lustre / EFS")
    desc = ", ".join(f"{m.mountpoint} ({m.fstype})" for m in shared[:4])
    finding = Verdict(status="pass", observed=desc, expected="a shared filesystem",
                      reason="shared storage mounted (throughput: --deep --shared-dir PATH)")
    measured = ctx.deep("shared")
    if measured and "write_gbps" in measured:
        finding.observed += f"; {measured['directory']}: write {measured['write_gbps']:.2f} GB/s, read {measured['read_gbps']:.2f} GB/s"
        finding.reason = "shared storage mounted and measured"
        if measured["write_gbps"] < 0.2:
            finding.status, finding.reason = "warn", "shared storage slower than 0.2 GB/s: checkpoint uploads will lag"
            finding.advice = "raise the file system's throughput (FSx: more capacity/throughput tier) or archive to S3"
    return finding


def _fstab_unmounted(ctx, mounts) -> list[str]:
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


