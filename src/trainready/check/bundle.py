"""A bundle: one raw file per probe plus `manifest.json`, so a node's state can be analyzed
anywhere (or attached to a bug). A missing file means that probe did not run.

File names are fixed (docs/check.md) so bundles from other tools and machines can be dropped in.
Bundles are made to be shared: `Bundle.save` is the one writer, and it passes every file through
the redactor (an fstab's CIFS `password=`, URL credentials, tokens) and writes them private
(0700 directory, 0600 files unless TRAINREADY_FILE_MODE says otherwise).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from pydantic import BaseModel, Field

from trainready import __version__
from trainready.errors import UsageError
from trainready.io import make_dir, redact, replace_durable

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

    def save(self, directory: str | Path, names: list[str] | None = None) -> None:
        """Write the bundle (or only `names`) to `directory`, secrets redacted, each file replaced whole."""
        root = make_dir(directory)
        for name in self.files if names is None else names:
            replace_durable(root / name, shareable(name, self.files[name]).encode())
        if self.manifest is not None and names is None:
            probes = [p.model_copy(update={"command": redact(p.command), "error": redact(p.error)})
                      for p in self.manifest.probes]
            manifest = self.manifest.model_copy(update={"probes": probes})
            replace_durable(root / MANIFEST, (manifest.model_dump_json(indent=1) + "\n").encode())

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


def shareable(name: str, text: str) -> str:
    """`text` with secrets redacted; a JSON file stays valid JSON (a mask that would break an
    escaped quote falls back to redacting each string value)."""
    out = redact(text)
    if not name.endswith(".json") or out == text:
        return out
    try:
        json.loads(out)
        return out
    except ValueError:
        pass
    try:
        data = json.loads(text)
    except ValueError:
        return out  # not JSON to begin with: text redaction is all we can do
    return json.dumps(_redact_strings(data))


def _redact_strings(value: object) -> object:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, list):
        return [_redact_strings(v) for v in value]
    if isinstance(value, dict):
        return {k: _redact_pair(k, v) if isinstance(v, str) else _redact_strings(v) for k, v in value.items()}
    return value


def _redact_pair(key: str, value: str) -> str:
    """A string value judged with its key ({"password": "x"} is a secret, "x" alone is not)."""
    pair = redact(f"{key}={value}")
    return pair[len(key) + 1:] if pair.startswith(f"{key}=") else redact(value)
