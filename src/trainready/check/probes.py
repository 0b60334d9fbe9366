"""Probes: run the commands and read the files a check needs, into a bundle.

Side effects come in through `Runner`, so tests can collect on any machine. Every probe has a
short timeout; a missing tool is recorded (exit_code None), never an error."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from .bundle import Bundle, BundleManifest, ProbeRecord, prepare_out, shareable

QUERY_FIELDS = ("index,name,memory.total,driver_version,pcie.link.gen.current,pcie.link.gen.max,"
                "pcie.link.width.current,pcie.link.width.max,clocks_throttle_reasons.active,"
                "ecc.errors.uncorrected.volatile.total,ecc.errors.uncorrected.aggregate.total")
ENV_PREFIXES = ("NCCL_", "FI_", "CUDA_", "TORCH_", "PYTORCH_", "OMP_", "RDMAV_", "UCX_", "NVIDIA_", "LD_LIBRARY_PATH",
                "MASTER_", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "TORCHELASTIC_", "OFI_NCCL_")
SECRET_WORDS = ("SECRET", "TOKEN", "PASSWORD", "PASSWD", "KEY", "CREDENTIAL")


@dataclass
class Result:
    exit_code: int | None
    stdout: str
    stderr: str
    duration_s: float


Runner = Callable[[list[str], float], Result]


def run_command(argv: list[str], timeout_s: float) -> Result:
    started = time.monotonic()
    if shutil.which(argv[0]) is None:
        return Result(None, "", f"{argv[0]}: command not found", 0.0)
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, errors="replace")
    except subprocess.TimeoutExpired:
        return Result(124, "", f"timed out after {timeout_s:.0f}s", time.monotonic() - started)
    except OSError as exc:
        return Result(None, "", str(exc), time.monotonic() - started)
    return Result(proc.returncode, proc.stdout, proc.stderr, time.monotonic() - started)


COMMANDS: dict[str, list[str]] = {
    "nvidia-smi-topo-m.txt": ["nvidia-smi", "topo", "-m"],
    "nvidia-smi-nvlink-s.txt": ["nvidia-smi", "nvlink", "-s"],
    "nvidia-smi-q.txt": ["nvidia-smi", "-q"],
    "nvidia-smi.txt": ["nvidia-smi"],
    "nvidia-smi-query-gpu.csv": ["nvidia-smi", f"--query-gpu={QUERY_FIELDS}", "--format=csv"],
    "fi_info-p-efa.txt": ["fi_info", "-p", "efa"],
    "ibstat.txt": ["ibstat"],
    "ibv_devinfo.txt": ["ibv_devinfo"],
    "lscpu.txt": ["lscpu"],
    "lsblk.json": ["lsblk", "-J", "-b", "-o", "NAME,TYPE,SIZE,MODEL,MOUNTPOINT,FSTYPE"],
    "kernel-xid.txt": ["dmesg", "--ctime"],
    "df.txt": ["df", "-B1", "--output=source,fstype,size,avail,target"],
    "cuda.json": [sys.executable, "-m", "trainready.check.cuda_probe"],
    "ps.txt": ["ps", "-eo", "pid,ppid,user,stat,etimes,comm"],
    "lspci-vvv.txt": ["lspci", "-vvv"],
    "uname.txt": ["uname", "-r"],
    "fabricmanager-status.txt": ["systemctl", "status", "nvidia-fabricmanager", "--no-pager", "--lines=20"],
}
# Run after the others, so the CUDA probe's own context is gone: GPU processes still there are someone else's.
COMPUTE_APPS = ("nvidia-smi-compute-apps.csv",
                ["nvidia-smi", "--query-compute-apps=gpu_bus_id,pid,process_name,used_memory", "--format=csv"])
# The kernel log lines kept besides the Xid ones: NIC links and errors, block-device I/O errors, hung tasks,
# NVSwitch and GPUDirect (nvidia-peermem) messages. The last KERNEL_LOG_LINES of them.
KERNEL_LOG = re.compile(r"lost carrier|link is down|link down|link becomes not ready|\befa\b|mlx5|I/O error|"
                        r"nvme nvme|EXT4-fs error|XFS \(|blocked for more than|nvidia-peermem|nvswitch|SXid|"
                        r"available PCIe bandwidth|\[10de:", re.I)
# The driver's lines kept in kernel-xid.txt: every Xid, and every NVRM line (a GPU that fell off the bus
# says so without an Xid token; RmInitAdapter failures; the continuation lines of both).
GPU_LOG = re.compile(r"Xid|NVRM")
KERNEL_LOG_LINES = 5000
# systemctl status exits 3 for an inactive unit and 4 for an unknown one; both say something true. nvidia-smi
# exits non-zero when a GPU is lost, and its error line ("Unable to determine the device handle for GPU ...")
# is the evidence: keep what it printed on both streams.
OUTPUT_ON_ANY_EXIT = ("fabricmanager-status.txt", "nvidia-smi.txt", "nvidia-smi-q.txt", "nvidia-smi-query-gpu.csv",
                      "nvidia-smi-topo-m.txt", "nvidia-smi-nvlink-s.txt")


def _filtered_env(environ: dict[str, str]) -> str:
    keep = sorted(k for k in environ if k.startswith(ENV_PREFIXES) and not any(w in k.upper() for w in SECRET_WORDS))
    return "".join(f"{k}={environ[k]}\n" for k in keep)


def _listing(path: str) -> str:
    root = Path(path)
    if not root.is_dir():
        return f"{path}: not present\n"
    return "".join(f"{entry.name}\n" for entry in sorted(root.iterdir()))


EFA_PATHS = ("/opt/amazon/efa/lib/libfabric.so", "/opt/amazon/efa/lib64/libfabric.so", "/usr/lib64/libfabric.so.1",
             "/usr/lib/x86_64-linux-gnu/libfabric.so.1", "/opt/amazon/ofi-nccl/lib/libnccl-net.so",
             "/opt/aws-ofi-nccl/lib/libnccl-net.so", "/usr/local/lib/libnccl-net.so",
             "/opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so")


def _efa_software() -> str:
    return "".join(f"{'present' if os.path.exists(p) else 'absent'} {p}\n" for p in EFA_PATHS)


def _read(path: str) -> str:
    return Path(path).read_text(errors="replace")


def detect_instance_type(timeout_s: float = 1.0) -> str | None:
    """EC2 only, live only: DMI says Amazon, then IMDSv2 with a short timeout."""
    try:
        vendor = _read("/sys/devices/virtual/dmi/id/sys_vendor").strip()
    except OSError:
        return None
    if "Amazon" not in vendor or os.environ.get("TRAINREADY_NO_IMDS"):
        return None
    import urllib.request

    try:
        token_req = urllib.request.Request("http://169.254.169.254/latest/api/token", method="PUT",
                                           headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"})
        token = urllib.request.urlopen(token_req, timeout=timeout_s).read().decode()
        req = urllib.request.Request("http://169.254.169.254/latest/meta-data/instance-type",
                                     headers={"X-aws-ec2-metadata-token": token})
        return urllib.request.urlopen(req, timeout=timeout_s).read().decode().strip() or None
    except Exception:
        return None


READ_FILES = ("meminfo.txt", "mounts.txt", "fstab.txt", "filesystems.txt", "env.txt", "sys-class-infiniband.txt",
              "efa-software.txt", "modules.txt", "cpufreq.txt", "clocksource.txt", "nvme-devices.txt",
              "fabricmanager-log.txt")  # read, not run (the readers in collect)
PROBE_COUNT = len(COMMANDS) + 1 + len(READ_FILES)  # + the compute-apps query, run after the others


def _cpufreq() -> str:
    root = Path("/sys/devices/system/cpu")
    governors = sorted(root.glob("cpu[0-9]*/cpufreq/scaling_governor"), key=lambda p: int(p.parent.parent.name[3:]))
    if not governors:
        return "absent: no /sys/devices/system/cpu/cpu*/cpufreq (frequency set by the hypervisor or firmware)\n"
    return "".join(f"{g.parent.parent.name} {_read(str(g)).strip()}\n" for g in governors)


def _clocksource() -> str:
    root = "/sys/devices/system/clocksource/clocksource0/"
    return f"current: {_read(root + 'current_clocksource').strip()}\navailable: {_read(root + 'available_clocksource').strip()}\n"


def _nvme_devices() -> str:
    root = Path("/sys/class/nvme")
    if not root.is_dir():
        return ""
    return "".join(f"{d.name} {_read(str(d / 'model')).strip()}\n" for d in sorted(root.iterdir()) if (d / "model").exists())


def _fabricmanager_log(path: str = "/var/log/fabricmanager.log", tail: int = 4 << 20) -> str:
    with open(path, "rb") as f:  # OSError when absent: the manifest records it, the file stays unknown
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - tail))
        text = f.read().decode("utf-8", errors="replace")
    keep = [line for line in text.splitlines() if "[ERROR]" in line or "[WARNING]" in line or "NVSwitch" in line
            or "multicast team" in line]
    return "".join(line + "\n" for line in keep[-500:])


def own_pids() -> list[int]:
    """trainready's processes on this machine (this one, its probes, torchrun's other ranks): their GPU
    contexts are not leftovers. Only PIDs are kept, never command lines (they may hold secrets)."""
    pids = {os.getpid()}
    for entry in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if b"trainready" in entry.read_bytes():
                pids.add(int(entry.parent.name))
        except (OSError, ValueError):
            continue
    return sorted(pids)


def collect(out: Path | None, runner: Runner = run_command, instance_type: str | None = None,
            environ: dict[str, str] | None = None, timeout_s: float = 20.0,
            on_progress: Callable[[float], None] | None = None) -> Bundle:
    """Run every probe; write the bundle to `out` when given (checked writable first: a UsageError
    before any probe runs); return it. `on_progress(1)` after each of PROBE_COUNT probes."""
    if out is not None:
        prepare_out(out)
    files: dict[str, str] = {}
    records: list[ProbeRecord] = []
    tick = on_progress or (lambda _n: None)

    def run(argv: list[str]) -> Result:
        try:
            return runner(argv, timeout_s)
        finally:
            tick(1)

    # In parallel: four nvidia-smi calls and the CUDA probe each take seconds on an 8-GPU node,
    # and the quick check has a 10 s budget.
    with ThreadPoolExecutor(max_workers=len(COMMANDS)) as pool:
        results = dict(zip(COMMANDS, pool.map(run, COMMANDS.values()), strict=True))
    results[COMPUTE_APPS[0]] = run(COMPUTE_APPS[1])
    kernel_log = None
    for name, argv in [*COMMANDS.items(), COMPUTE_APPS]:
        result = results[name]
        text = result.stdout
        if name in OUTPUT_ON_ANY_EXIT:
            text = result.stdout + result.stderr
        if name == "kernel-xid.txt":
            lines = result.stdout.splitlines()
            text = "".join(line + "\n" for line in lines if GPU_LOG.search(line))
            kernel_log = "".join(line + "\n" for line in [x for x in lines if KERNEL_LOG.search(x)][-KERNEL_LOG_LINES:])
            if result.exit_code not in (0, None):
                text = kernel_log = f"unreadable: {result.stderr.strip()[:200]}\n"
        if result.exit_code is not None and (text or name == "kernel-xid.txt"):
            files[name] = text
        records.append(ProbeRecord(file=name, command=" ".join(argv), exit_code=result.exit_code,
                                   duration_s=round(result.duration_s, 3), timestamp_unix=time.time(),
                                   error=result.stderr.strip()[:300] if result.exit_code != 0 else ""))
    dmesg = results["kernel-xid.txt"]
    if kernel_log is not None and dmesg.exit_code is not None:
        files["kernel-log.txt"] = kernel_log
    records.append(ProbeRecord(file="kernel-log.txt", command="dmesg --ctime (NIC, block device, hung task lines)",
                               exit_code=dmesg.exit_code, timestamp_unix=time.time(),
                               error=dmesg.stderr.strip()[:300] if dmesg.exit_code != 0 else ""))
    readers: dict[str, Callable[[], str]] = {
        "meminfo.txt": lambda: _read("/proc/meminfo"), "mounts.txt": lambda: _read("/proc/mounts"),
        "fstab.txt": lambda: _read("/etc/fstab"), "filesystems.txt": lambda: _read("/proc/filesystems"),
        "env.txt": lambda: _filtered_env(dict(os.environ if environ is None else environ)),
        "sys-class-infiniband.txt": lambda: _listing("/sys/class/infiniband"), "efa-software.txt": _efa_software,
        "modules.txt": lambda: _read("/proc/modules"), "cpufreq.txt": _cpufreq, "clocksource.txt": _clocksource,
        "nvme-devices.txt": _nvme_devices, "fabricmanager-log.txt": _fabricmanager_log,
    }
    assert tuple(readers) == READ_FILES
    for name, read in readers.items():
        started = time.monotonic()
        try:
            files[name] = read()
            error = ""
        except OSError as exc:
            error = str(exc)
        records.append(ProbeRecord(file=name, command=name, exit_code=0 if not error else 1, error=error,
                                   duration_s=round(time.monotonic() - started, 3), timestamp_unix=time.time()))
        tick(1)
    if instance_type:
        files["instance-type.txt"] = instance_type + "\n"
    manifest = BundleManifest(hostname=socket.gethostname(), probes=records, own_pids=own_pids())
    # redacted here too, so a live check never quotes a secret; Bundle.save redacts what it writes
    bundle = Bundle({name: shareable(name, text) for name, text in files.items()}, manifest, str(out) if out else "live")
    if out is not None:
        bundle.save(out)
    return bundle

