"""A bundle: one raw file per probe plus `manifest.json`, so a node's state can be analyzed
anywhere (or attached to a bug). A missing file means that probe did not run.

File names are fixed (docs/check.md) so bundles from other tools and machines can be dropped in.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from pydantic import BaseModel, Field

from trainready import __version__
from trainready.errors import UsageError

MANIFEST = "manifest.json"

# file -> what it holds (the command that makes it lives in probes.py)
FILES: dict[str, str] = {
    "nvidia-smi-topo-m.txt": "nvidia-smi topo -m",
    "nvidia-smi-nvlink-s.txt": "nvidia-smi nvlink -s",
    "nvidia-smi-q.txt": "nvidia-smi -q",
    "nvidia-smi-query-gpu.csv": "nvidia-smi --query-gpu=... --format=csv",
    "fi_info-p-efa.txt": "fi_info -p efa",
    "ibstat.txt": "ibstat",
    "ibv_devinfo.txt": "ibv_devinfo",
    "lscpu.txt": "lscpu",
    "meminfo.txt": "/proc/meminfo",
    "lsblk.json": "lsblk -J -b -o NAME,TYPE,SIZE,MODEL,MOUNTPOINT,FSTYPE",
    "mounts.txt": "/proc/mounts",
    "fstab.txt": "/etc/fstab (file systems the node is meant to mount)",
    "filesystems.txt": "/proc/filesystems (file system types the kernel supports: lustre, nfs4, ...)",
    "df.txt": "df -B1 --output=source,fstype,size,avail,target (free space per file system)",
    "env.txt": "environment variables that matter to training (NCCL_*, FI_*, CUDA_*, ...), values of secrets dropped",
    "instance-type.txt": "instance type (EC2 DMI/IMDSv2, or given)",
    "nccl-debug.log": "optional: a training log with NCCL_DEBUG=INFO",
    "kernel-xid.txt": "kernel log lines with NVRM Xid (dmesg), or why it was unreadable",
    "sys-class-infiniband.txt": "listing of /sys/class/infiniband (rdmap* = EFA, mlx5_* = Mellanox)",
    "efa-software.txt": "libfabric and aws-ofi-nccl presence (paths found)",
    "cuda.json": "torch's view: CUDA available, device count and names, CUDA graph capture/replay result",
    "deep.json": "--deep results: GEMM TFLOP/s, all-reduce bus bandwidth, storage bandwidth",
}


class ProbeRecord(BaseModel):
    file: str
    command: str
    exit_code: int | None = Field(None, description="None: the command could not be started (not installed).")
    duration_s: float = 0.0
    timestamp_unix: float = 0.0
    error: str = ""


class BundleManifest(BaseModel):
    """`manifest.json` of a bundle. Schema: docs/schemas/check-bundle.schema.json."""

    schema_version: int = 1
    kind: str = "trainready.check-bundle"
    tool_version: str = __version__
    created_unix: float = Field(default_factory=time.time)
    hostname: str = ""
    probes: list[ProbeRecord] = []


class Bundle:
    """Read access to a bundle directory (or an in-memory dict, for live runs)."""

    def __init__(self, files: dict[str, str], manifest: BundleManifest | None = None, source: str = "live"):
        self.files, self.manifest, self.source = files, manifest, source

    @classmethod
    def load(cls, directory: str | Path) -> Bundle:
        root = Path(directory)
        if not root.is_dir():
            raise UsageError(f"bundle directory {root} does not exist (make one with: trainready check collect --out DIR)")
        files = {}
        for path in sorted(root.iterdir()):
            if path.is_file() and path.name != MANIFEST:
                files[path.name] = path.read_bytes().decode("utf-8", errors="replace")
        manifest = None
        if (root / MANIFEST).exists():
            try:
                manifest = BundleManifest.model_validate(json.loads((root / MANIFEST).read_text()))
            except Exception as exc:  # a foreign or damaged manifest: the files still speak
                raise UsageError(f"{root / MANIFEST} is not a trainready bundle manifest: {str(exc).splitlines()[0]}") from exc
        return cls(files, manifest, str(root))

    def text(self, name: str) -> str | None:
        return self.files.get(name)

    def record(self, name: str) -> ProbeRecord | None:
        if self.manifest is None:
            return None
        return next((p for p in self.manifest.probes if p.file == name), None)

    def why_missing(self, name: str) -> str:
        record = self.record(name)
        if record is not None and record.exit_code is None:
            return f"{record.command.split()[0]} not available on this machine ({record.error or 'not found'})"
        if record is not None and record.error:
            return f"`{record.command}` failed: {record.error}"
        return f"{name} not in the bundle (probe did not run)"
