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
import re
import secrets
import stat
import tarfile
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from trainready.errors import UsageError, printable
from trainready.io import create_exclusive, make_dir, parse_json, redact, redact_json, replace_durable
from trainready.io.files import read_regular
from trainready.version import __version__

MANIFEST = "manifest.json"
# nccl-tests ops a bundle can hold, one file each: nccl-tests-<op>.txt (the binaries are <op>_perf)
NCCL_OPS = ("all_reduce", "all_gather", "reduce_scatter", "alltoall", "broadcast", "reduce", "sendrecv")

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
    "deep.json": "--deep results: GEMM TFLOP/s, copies, collectives, pairwise node tests, storage bandwidth",
    # acceptance quick checks (issue 16); a bundle collected before them lacks these: unknown, never a failure
    "nvidia-smi-compute-apps.csv": "nvidia-smi --query-compute-apps=gpu_bus_id,pid,process_name,used_memory --format=csv",
    "ps.txt": "ps -eo pid,ppid,user,stat,etimes,comm (owners of GPU processes, processes in D state)",
    "lspci-vvv.txt": "lspci -vvv (PCIe bridges' bus ranges and ACS control)",
    "modules.txt": "/proc/modules (nvidia_peermem, efa, ...)",
    "uname.txt": "uname -r (kernel release: dma-buf needs Linux >= 5.12)",
    "fabricmanager-status.txt": "systemctl status nvidia-fabricmanager (stdout and stderr)",
    "fabricmanager-log.txt": "/var/log/fabricmanager.log: its last [ERROR]/[WARNING]/NVSwitch lines",
    "kernel-log.txt": "kernel log lines about NICs, block devices, hung tasks, NVSwitches (dmesg), or why unreadable",
    "cpufreq.txt": "`cpuN GOVERNOR` per CPU (cpufreq scaling_governor), or `absent: why`",
    "clocksource.txt": "`current: X` and `available: ...` (/sys/devices/system/clocksource/clocksource0)",
    "nvme-devices.txt": "`nvmeN MODEL` per NVMe controller (/sys/class/nvme/*/model)",
    "dcgm-diag.json": "--dcgm N: dcgmi diag -r N -j",
    # what users already have (issue 23): read when present, collected where cheap
    "nvidia-smi.txt": "nvidia-smi (the default table, or nvidia-smi -L; stdout and stderr: its error lines name lost GPUs)",
    "dcgm-diag.txt": "optional: dcgmi diag -r N as printed (the table), or --dcgm-output FILE",
    "cuda-log.txt": "optional: the error output of a CUDA program on the node (a training job, deviceQuery, torch's warning)",
    **{f"nccl-tests-{op}.txt": f"optional: {op}_perf output as printed (nccl-tests), or --nccl-tests FILE"
       for op in NCCL_OPS},
}


MiB = 1 << 20
# The most a bundle's file may hold (a received bundle is hostile input: a 300 MB file is refused
# from its size, before any read). nvidia-smi -q of a 16-GPU node is well under 1 MiB.
LIMITS: dict[str, int] = {MANIFEST: 1 * MiB, "instance-type.txt": 256, "nccl-debug.log": 64 * MiB,
                          "kernel-xid.txt": 64 * MiB, "kernel-log.txt": 64 * MiB, "lspci-vvv.txt": 16 * MiB,
                          "cuda-log.txt": 64 * MiB, **{f"nccl-tests-{op}.txt": 16 * MiB for op in NCCL_OPS}}
DEFAULT_LIMIT = 4 * MiB
# What an instance type name may be made of (every catalog name is): anything else in a bundle's
# instance-type.txt is not an instance type, and is only ever shown escaped.
INSTANCE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def limit(name: str) -> int:
    return LIMITS.get(name, DEFAULT_LIMIT)


def _size(n: int) -> str:
    return f"{n / MiB:g} MiB" if n >= MiB else f"{n} bytes"


def shown(text: str, width: int = 60) -> str:
    """A value read from a file we did not write, safe to print: quoted, control characters and
    terminal escapes written as \\x.. (repr), cut to `width` characters."""
    return repr(text[:width]) + ("..." if len(text) > width else "")


def instance_name(text: str) -> tuple[str | None, str]:
    """The instance type in `text` (instance-type.txt, or what EC2 said), or None and why not
    ('' when there is none)."""
    text = text.strip()
    if text and not INSTANCE_NAME.fullmatch(text):
        return None, f"instance-type.txt holds no instance type name: {shown(text)}"
    return text or None, ""


class _Refused(Exception):
    """A bundle entry we will not read; the message says why, in words."""


def _kind(mode: int) -> str:
    return ("a symlink, not followed" if stat.S_ISLNK(mode) else "a directory" if stat.S_ISDIR(mode)
            else "a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a regular file")


def _refusal(mode: int) -> str:
    kind = _kind(mode)
    return kind if stat.S_ISLNK(mode) else f"{kind}, not a plain file"


def _read_entry(path: Path, st: os.stat_result, cap: int) -> bytes:
    """The bytes of one bundle file (its lstat `st`), or _Refused: not a regular file, more than
    `cap` bytes, or unreadable. Never follows a symlink nor blocks on a FIFO, even if the entry is
    swapped between the lstat and the open (read_regular checks the file it opened)."""
    if not stat.S_ISREG(st.st_mode):
        raise _Refused(_refusal(st.st_mode))
    if st.st_size > cap:
        raise _Refused(f"too large: {st.st_size} bytes, more than the {_size(cap)} allowed for {path.name}")
    try:
        return read_regular(path, cap)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _Refused("a symlink, not followed") from None
        if exc.errno == errno.EINVAL:
            raise _Refused("not a plain file") from None
        if exc.errno == errno.EFBIG:
            raise _Refused(f"too large: it grew past the {_size(cap)} allowed for {path.name} while being read") from None
        raise _Refused(_os_problem(exc)) from None


def _os_problem(exc: OSError) -> str:
    if exc.errno == errno.ENAMETOOLONG:
        return "the name is too long for the file system"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "permission denied"
    return exc.strerror or str(exc)


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
    own_pids: list[int] = Field([], description="PIDs of trainready's own processes at collection time (the probes, "
                                "torchrun ranks): not leftover GPU processes. Absent in bundles collected before it.")


class Bundle:
    """Read access to a bundle directory (or an in-memory dict, for live runs)."""

    def __init__(self, files: dict[str, str], manifest: BundleManifest | None = None, source: str = "live"):
        self.files, self.manifest, self.source = files, manifest, source
        self.refused: dict[str, str] = {}  # file name -> why Bundle.load did not read it
        self.origins: dict[str, str] = {}  # file name -> the path a user gave it under (--nccl-tests FILE)

    @classmethod
    def load(cls, directory: str | Path) -> Bundle:
        """Read a bundle directory. UsageError (exit 2) when the path is missing, is a file, or is a
        directory with neither a manifest nor any probe file (not a bundle), or when its manifest
        cannot be read.

        A bundle is made to be shared, so one received is read as hostile input: only the known
        file names (FILES), never through a symlink, only regular files, each up to its size cap
        (`limit`), without blocking on a FIFO. A probe file refused is unknown, not evidence: it
        is left out, and `why_missing` gives the reason (the checks that needed it skip or warn)."""
        root = Path(directory)
        make = "make one with: trainready check collect --out DIR"
        if not str(directory):
            raise UsageError(f"the bundle directory is an empty path ({make})")
        try:
            st = os.stat(root)
        except FileNotFoundError:
            raise UsageError(f"bundle directory {root} does not exist ({make})") from None
        except OSError as exc:
            raise UsageError(f"cannot read bundle directory {root}: {_os_problem(exc)}") from None
        if not stat.S_ISDIR(st.st_mode):
            raise UsageError(f"bundle {root} is {_not_a_directory(root, st.st_mode)}")
        present: dict[str, os.stat_result] = {}
        for name in (MANIFEST, *FILES):
            try:
                present[name] = os.lstat(root / name)
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise UsageError(f"cannot read bundle directory {root}: {_os_problem(exc)}") from None
        if not present:
            raise UsageError(f"{root} is not a bundle: no {MANIFEST} and none of the probe files "
                             f"({', '.join(list(FILES)[:3])}, ...; docs/check.md lists them); {make}")
        manifest = None
        if MANIFEST in present:
            path = root / MANIFEST
            try:
                raw = _read_entry(path, present[MANIFEST], limit(MANIFEST))
            except _Refused as exc:
                raise UsageError(f"cannot read {path}: {exc}") from None
            try:
                manifest = BundleManifest.model_validate(parse_json(raw))
            except Exception as exc:  # a foreign or damaged manifest: what it says cannot be trusted
                raise UsageError(f"{path} is not a trainready bundle manifest: {printable(str(exc).splitlines()[0])}") from None
        files: dict[str, str] = {}
        refused: dict[str, str] = {}
        for name in FILES:
            if name not in present:
                continue
            try:
                files[name] = _read_entry(root / name, present[name], limit(name)).decode("utf-8", errors="replace")
            except _Refused as exc:
                refused[name] = str(exc)
        source = str(root) if str(root) not in ("live", "given files") else f"./{root}"  # never the live source
        bundle = cls(files, manifest, source)
        bundle.refused = refused
        return bundle

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
        return f"the bundle's machine {printable(host)}" if host else "the bundle's machine"

    def instance_type(self) -> tuple[str | None, str]:
        """The instance type named by instance-type.txt, or None and why not ('' when absent). A
        value that is no instance type name (control characters, a whole other file) is not one."""
        if "instance-type.txt" in self.refused:
            return None, self.why_missing("instance-type.txt")
        return instance_name(self.files.get("instance-type.txt") or "")

    def probe_state(self, name: str) -> Literal["present", "not-installed", "failed", "empty", "unknown"]:
        """What we know about a probe's output: its file is here; the manifest says its command is
        not installed, failed, or ran and printed nothing (evidence about the machine); or nothing
        (not in the bundle, no record: absence of evidence, never evidence of absence)."""
        if name in self.files:
            return "present"
        if name in self.refused:  # what the manifest says about it describes a file we did not read
            return "unknown"
        record = self.record(name)
        if record is None:
            return "unknown"
        return "not-installed" if record.exit_code is None else "failed" if record.exit_code != 0 else "empty"

    def why_missing(self, name: str) -> str:
        if name in self.refused:
            return f"{name} in the bundle not read: {self.refused[name]}"
        record = self.record(name)
        if record is not None and record.exit_code is None:
            # the manifest's words: shown as text, never as terminal escapes or line breaks
            name_ = printable(record.command.split()[0] if record.command.split() else record.command)
            return f"{name_} not available on {self.machine} ({printable(record.error or 'not found')})"
        if record is not None and record.error:
            return f"`{printable(record.command)}` failed on {self.machine}: {printable(record.error)}"
        return f"{name} not in the bundle (probe did not run)"


def prepare_out(directory: str | Path) -> Path:
    """Create the bundle directory (if missing) and make sure we can write files in it, before any
    probe runs. UsageError (exit 2) naming the path and why otherwise (a file in the way, /proc,
    a read-only or foreign directory)."""
    if not str(directory):
        raise UsageError("cannot write the bundle to an empty path: name a directory (--out DIR)")
    root = Path(directory)
    try:
        try:
            mode = os.stat(root).st_mode
        except FileNotFoundError:
            mode = None
        if mode is not None and not stat.S_ISDIR(mode):
            raise UsageError(f"cannot write the bundle to {root}: it is {_not_a_directory(root, mode)}")
        make_dir(root)
        probe = root / f".trainready-write-test-{os.getpid()}-{secrets.token_hex(4)}"
        os.close(create_exclusive(probe))
        probe.unlink()
    except OSError as exc:
        raise UsageError(f"cannot write the bundle to {root}: {_write_problem(root, exc)}") from exc
    return root


def _not_a_directory(path: Path, mode: int) -> str:
    """What `path` (its stat mode: symlinks followed, the user named it) is instead of a directory."""
    if not stat.S_ISREG(mode):
        return f"{_kind(mode)}, not a directory (a bundle is the directory `trainready check collect --out DIR` writes)"
    if path.name == MANIFEST:
        return f"a file, not a directory: pass the directory that holds it ({path.parent})"
    if _is_tarfile(path):
        return f"an archive, not a directory: unpack it first (mkdir b && tar -xf {path} -C b) and pass the directory"
    return "a file, not a directory (a bundle is the directory `trainready check collect --out DIR` writes)"


def _is_tarfile(path: Path) -> bool:
    try:
        return tarfile.is_tarfile(path)
    except OSError:
        return False


def _exists(path: Path) -> bool:
    try:
        os.stat(path)
        return True
    except OSError:
        return False


def _is_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.stat(path).st_mode)
    except OSError:
        return False


def _write_problem(root: Path, exc: OSError) -> str:
    """Why `root` cannot be written, in words, naming the path at fault."""
    where = Path(exc.filename) if exc.filename else root
    if exc.errno == errno.ENAMETOOLONG:
        return "the path or one of its names is too long for the file system"
    ancestor = next((p for p in [root, *root.parents] if _exists(p)), Path("/"))
    if exc.errno == errno.ENOTDIR or (ancestor != root and not _is_dir(ancestor)):
        blocking = next((p for p in root.parents if _exists(p) and not _is_dir(p)), ancestor)
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
        parse_json(out)
        return out
    except ValueError:
        pass
    try:
        data = parse_json(text)
    except ValueError:
        return out  # not JSON to begin with: text redaction is all we can do
    return json.dumps(redact_json(data))


