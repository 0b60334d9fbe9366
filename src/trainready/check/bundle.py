"""A bundle: one raw file per probe plus `manifest.json`, so a node's state can be analyzed
anywhere (or attached to a bug). A missing file means that probe did not run.

File names are fixed (docs/check.md) so bundles from other tools and machines can be dropped in.
Bundles are made to be shared: `Bundle.save` is the one writer, and it passes every file through
the redactor (an fstab's CIFS `password=`, URL credentials, tokens) and writes them private
(0700 directory, 0600 files unless TRAINREADY_FILE_MODE says otherwise).
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import tarfile
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from trainready import __version__
from trainready.errors import UsageError
from trainready.io import create_exclusive, make_dir, redact, replace_durable

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
        """Read a bundle directory. UsageError (exit 2) when the path is missing, is a file, or is a
        directory with neither a manifest nor any probe file (not a bundle)."""
        root = Path(directory)
        make = "make one with: trainready check collect --out DIR"
        if not root.exists():
            raise UsageError(f"bundle directory {root} does not exist ({make})")
        if not root.is_dir():
            raise UsageError(f"bundle {root} is {_not_a_directory(root)}")
        try:
            entries = sorted(root.iterdir())
        except OSError as exc:
            raise UsageError(f"cannot read bundle directory {root}: {exc.strerror or exc}") from exc
        known = [p.name for p in entries if p.name in FILES]
        if not (root / MANIFEST).exists() and not known:
            raise UsageError(f"{root} is not a bundle: no {MANIFEST} and none of the probe files "
                             f"({', '.join(list(FILES)[:3])}, ...; docs/check.md lists them); {make}")
        files = {}
        for path in entries:
            if path.name != MANIFEST and path.is_file():
                try:
                    files[path.name] = path.read_bytes().decode("utf-8", errors="replace")
                except OSError as exc:
                    raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from exc
        manifest = None
        if (root / MANIFEST).exists():
            try:
                manifest = BundleManifest.model_validate(json.loads((root / MANIFEST).read_text()))
            except OSError as exc:
                raise UsageError(f"cannot read {root / MANIFEST}: {exc.strerror or exc}") from exc
            except Exception as exc:  # a foreign or damaged manifest: the files still speak
                raise UsageError(f"{root / MANIFEST} is not a trainready bundle manifest: {str(exc).splitlines()[0]}") from exc
        return cls(files, manifest, str(root))

    def save(self, directory: str | Path, names: list[str] | None = None) -> None:
        """Write the bundle (or only `names`) to `directory`, secrets redacted, each file replaced whole.
        UsageError (exit 2) naming the path and why when it cannot be written there."""
        root = prepare_out(directory)
        try:
            for name in self.files if names is None else names:
                replace_durable(root / name, shareable(name, self.files[name]).encode())
            if self.manifest is not None and names is None:
                probes = [p.model_copy(update={"command": redact(p.command), "error": redact(p.error)})
                          for p in self.manifest.probes]
                manifest = self.manifest.model_copy(update={"probes": probes})
                replace_durable(root / MANIFEST, (manifest.model_dump_json(indent=1) + "\n").encode())
        except OSError as exc:
            raise UsageError(f"cannot write the bundle to {root}: {_write_problem(Path(root), exc)}") from exc

    def text(self, name: str) -> str | None:
        return self.files.get(name)

    def record(self, name: str) -> ProbeRecord | None:
        if self.manifest is None:
            return None
        return next((p for p in self.manifest.probes if p.file == name), None)

    @property
    def machine(self) -> str:
        """How findings name the machine the probes ran on."""
        if self.source == "live":
            return "this machine"
        host = self.manifest.hostname if self.manifest is not None else ""
        return f"the bundle's machine {host}" if host else "the bundle's machine"

    def probe_state(self, name: str) -> Literal["present", "not-installed", "failed", "empty", "unknown"]:
        """What we know about a probe's output: its file is here; the manifest says its command is
        not installed, failed, or ran and printed nothing (evidence about the machine); or nothing
        (not in the bundle, no record: absence of evidence, never evidence of absence)."""
        if name in self.files:
            return "present"
        record = self.record(name)
        if record is None:
            return "unknown"
        return "not-installed" if record.exit_code is None else "failed" if record.exit_code != 0 else "empty"

    def why_missing(self, name: str) -> str:
        record = self.record(name)
        if record is not None and record.exit_code is None:
            return f"{record.command.split()[0]} not available on {self.machine} ({record.error or 'not found'})"
        if record is not None and record.error:
            return f"`{record.command}` failed on {self.machine}: {record.error}"
        return f"{name} not in the bundle (probe did not run)"


def prepare_out(directory: str | Path) -> Path:
    """Create the bundle directory (if missing) and make sure we can write files in it, before any
    probe runs. UsageError (exit 2) naming the path and why otherwise (a file in the way, /proc,
    a read-only or foreign directory)."""
    root = Path(directory)
    try:
        if root.exists() and not root.is_dir():
            raise UsageError(f"cannot write the bundle to {root}: it is {_not_a_directory(root)}")
        make_dir(root)
        probe = root / f".trainready-write-test-{os.getpid()}-{secrets.token_hex(4)}"
        os.close(create_exclusive(probe))
        probe.unlink()
    except OSError as exc:
        raise UsageError(f"cannot write the bundle to {root}: {_write_problem(root, exc)}") from exc
    return root


def _not_a_directory(path: Path) -> str:
    if path.name == MANIFEST:
        return f"a file, not a directory: pass the directory that holds it ({path.parent})"
    if path.is_file() and tarfile.is_tarfile(path):
        return f"an archive, not a directory: unpack it first (mkdir b && tar -xf {path} -C b) and pass the directory"
    kind = "a file" if path.is_file() else "not a regular directory"
    return f"{kind}, not a directory (a bundle is the directory `trainready check collect --out DIR` writes)"


def _write_problem(root: Path, exc: OSError) -> str:
    """Why `root` cannot be written, in words, naming the path at fault."""
    where = Path(exc.filename) if exc.filename else root
    ancestor = next((p for p in [root, *root.parents] if p.exists()), Path("/"))
    if exc.errno == errno.ENOTDIR or (ancestor != root and not ancestor.is_dir()):
        blocking = next((p for p in root.parents if p.exists() and not p.is_dir()), ancestor)
        return f"{blocking} is a file, not a directory"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return f"permission denied on {where} (choose a directory you can write to)"
    if exc.errno == errno.EROFS:
        return f"{where} is on a read-only file system"
    if exc.errno == errno.ENOSPC:
        return f"no space left on the device of {where}"
    if exc.errno == errno.ENOENT:
        return f"{ancestor} does not allow creating {where} (a kernel or virtual file system?)"
    return f"{where}: {exc.strerror or exc}"


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
