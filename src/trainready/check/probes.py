"""Probes: run the commands and read the files a check needs, into a bundle.

Side effects come in through `Runner`, so tests can collect on any machine. Every probe has a
short timeout; a missing tool is recorded (exit_code None), never an error."""

from __future__ import annotations

import json
import os
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
    "nvidia-smi-query-gpu.csv": ["nvidia-smi", f"--query-gpu={QUERY_FIELDS}", "--format=csv"],
    "fi_info-p-efa.txt": ["fi_info", "-p", "efa"],
    "ibstat.txt": ["ibstat"],
    "ibv_devinfo.txt": ["ibv_devinfo"],
    "lscpu.txt": ["lscpu"],
    "lsblk.json": ["lsblk", "-J", "-b", "-o", "NAME,TYPE,SIZE,MODEL,MOUNTPOINT,FSTYPE"],
    "kernel-xid.txt": ["dmesg", "--ctime"],
    "df.txt": ["df", "-B1", "--output=source,fstype,size,avail,target"],
    "cuda.json": [sys.executable, "-m", "trainready.check.cuda_probe"],
}


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
              "efa-software.txt")  # read, not run (the readers in collect)
PROBE_COUNT = len(COMMANDS) + len(READ_FILES)


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
    for name, argv in COMMANDS.items():
        result = results[name]
        text = result.stdout
        if name == "kernel-xid.txt":
            text = "".join(line + "\n" for line in result.stdout.splitlines() if "Xid" in line)
            if result.exit_code not in (0, None):
                text = f"unreadable: {result.stderr.strip()[:200]}\n"
        if result.exit_code is not None and (text or name == "kernel-xid.txt"):
            files[name] = text
        records.append(ProbeRecord(file=name, command=" ".join(argv), exit_code=result.exit_code,
                                   duration_s=round(result.duration_s, 3), timestamp_unix=time.time(),
                                   error=result.stderr.strip()[:300] if result.exit_code != 0 else ""))
    readers: dict[str, Callable[[], str]] = {
        "meminfo.txt": lambda: _read("/proc/meminfo"), "mounts.txt": lambda: _read("/proc/mounts"),
        "fstab.txt": lambda: _read("/etc/fstab"), "filesystems.txt": lambda: _read("/proc/filesystems"),
        "env.txt": lambda: _filtered_env(dict(os.environ if environ is None else environ)),
        "sys-class-infiniband.txt": lambda: _listing("/sys/class/infiniband"), "efa-software.txt": _efa_software,
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
    manifest = BundleManifest(hostname=socket.gethostname(), probes=records)
    # redacted here too, so a live check never quotes a secret; Bundle.save redacts what it writes
    bundle = Bundle({name: shareable(name, text) for name, text in files.items()}, manifest, str(out) if out else "live")
    if out is not None:
        bundle.save(out)
    return bundle


def cuda_summary(bundle: Bundle) -> dict | None:
    text = bundle.text("cuda.json")
    if not text:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return {"unparsable": text[:120]}
    return data if isinstance(data, dict) else {"unparsable": text[:120]}
