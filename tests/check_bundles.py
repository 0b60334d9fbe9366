"""Fixture bundles for `trainready check --bundle`: healthy nodes on disk, broken ones made from them.

`make_bundle(kind, tmp_path, drop, replace)` copies tests/fixtures/check/bundles/KIND into tmp_path and
applies edits; `make_variant(name, tmp_path)` builds one of the named broken nodes in VARIANTS. The edit
helpers below change raw probe output the way a fault would show in it (see the bundles' README.md).
"""

from __future__ import annotations

import json
import random
import re
import shutil
from collections.abc import Callable
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures" / "check"
BUNDLES = FIXTURES / "bundles"
KINDS = ("p4d", "p5", "g5", "p3", "cpu-only")
INSTANCE = {"p4d": "p4d.24xlarge", "p5": "p5.48xlarge", "g5": "g5.48xlarge", "p3": "p3dn.24xlarge", "cpu-only": None}

QUERY = "nvidia-smi-query-gpu.csv"
TOPO = "nvidia-smi-topo-m.txt"
NVLINK = "nvidia-smi-nvlink-s.txt"

Edit = str | bytes | Callable[[str], str | bytes]


def make_bundle(kind: str, tmp_path: Path, drop: tuple[str, ...] | list[str] = (),
                replace: dict[str, Edit] | None = None) -> Path:
    """Copy bundle `kind` to a fresh directory under tmp_path, delete `drop`, write `replace`.

    A replace value is the new content (str or bytes), or a function of the file's current text
    (empty string when the file is absent) that returns it."""
    source = BUNDLES / kind
    if not source.is_dir():
        raise ValueError(f"no bundle {kind!r}; have {', '.join(KINDS)}")
    dest = tmp_path / kind
    n = 1
    while dest.exists():
        n += 1
        dest = tmp_path / f"{kind}-{n}"
    shutil.copytree(source, dest)
    for name in drop:
        (dest / name).unlink(missing_ok=True)
    for name, edit in (replace or {}).items():
        path = dest / name
        if callable(edit):
            edit = edit(path.read_text() if path.exists() else "")
        if isinstance(edit, bytes):
            path.write_bytes(edit)
        else:
            path.write_text(edit)
    return dest


# ---------------------------------------------------------------- edits of nvidia-smi output


def query_drop_gpu(index: int) -> Callable[[str], str]:
    """--query-gpu CSV without GPU `index`'s row."""
    def edit(text: str) -> str:
        return "".join(line for line in text.splitlines(keepends=True) if not line.startswith(f"{index}, "))
    return edit


def query_set(index: int, field: str, value: str) -> Callable[[str], str]:
    """--query-gpu CSV with one cell of GPU `index` changed (field as the header names it, units dropped)."""
    def edit(text: str) -> str:
        lines = text.splitlines(keepends=True)
        fields = [re.sub(r"\s*\[.*\]$", "", c.strip()) for c in lines[0].split(",")]
        column = fields.index(field)
        out = []
        for line in lines:
            cells = line.rstrip("\n").split(", ")
            if cells[0] == str(index):
                cells[column] = value
                line = ", ".join(cells) + "\n"
            out.append(line)
        return "".join(out)
    return edit


def _topo_matrix_end(lines: list[str]) -> int:
    return next((k for k, line in enumerate(lines) if line.strip() == "Legend:"), len(lines))


def topo_drop_gpu(index: int) -> Callable[[str], str]:
    """topo -m as a node shows it with GPU `index` gone: its row and its column removed."""
    def edit(text: str) -> str:
        lines = text.splitlines()
        end = _topo_matrix_end(lines)
        column = lines[0].split("\t").index(f"GPU{index}")
        out = []
        for k, line in enumerate(lines):
            if k < end and line.strip():
                cells = line.split("\t")
                if cells[0] == f"GPU{index}":
                    continue
                del cells[column]
                line = "\t".join(cells)
            out.append(line)
        return "\n".join(out) + "\n"
    return edit


def topo_set_pair(i: int, j: int, token: str) -> Callable[[str], str]:
    """topo -m with the GPUi-GPUj cell (both directions) set to `token`, e.g. NV6."""
    def edit(text: str) -> str:
        lines = text.splitlines()
        header = lines[0].split("\t")
        out = []
        for line in lines:
            cells = line.split("\t")
            for row, col in ((i, j), (j, i)):
                if cells[0] == f"GPU{row}":
                    cells[header.index(f"GPU{col}")] = token
            out.append("\t".join(cells))
        return "\n".join(out) + "\n"
    return edit


def _nvlink_sections(text: str) -> list[list[str]]:
    sections: list[list[str]] = []
    for line in text.splitlines():
        if line.startswith("GPU ") or not sections:
            sections.append([])
        sections[-1].append(line)
    return sections


def nvlink_drop_gpu(index: int) -> Callable[[str], str]:
    def edit(text: str) -> str:
        kept = [s for s in _nvlink_sections(text) if not s[0].startswith(f"GPU {index}:")]
        return "".join(line + "\n" for s in kept for line in s)
    return edit


def nvlink_inactive(index: int, links: tuple[int, ...]) -> Callable[[str], str]:
    """nvlink -s with `links` of GPU `index` shown `<inactive>`, as nvidia-smi prints a down link."""
    def edit(text: str) -> str:
        out = []
        for section in _nvlink_sections(text):
            for line in section:
                m = re.match(r"(\s*Link (\d+): ).*", line)
                if section[0].startswith(f"GPU {index}:") and m and int(m.group(2)) in links:
                    line = m.group(1) + "<inactive>"
                out.append(line + "\n")
        return "".join(out)
    return edit


def cuda_devices(count: int) -> Callable[[str], str]:
    def edit(text: str) -> str:
        data = json.loads(text)
        data["device_count"], data["devices"] = count, data["devices"][:count]
        return json.dumps(data) + "\n"
    return edit


def env_add(**values: str) -> Callable[[str], str]:
    def edit(text: str) -> str:
        env = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
        env.update(values)
        return "".join(f"{k}={v}\n" for k, v in sorted(env.items()))
    return edit


# ---------------------------------------------------------------- lsblk / logs

def lsblk_unassembled(text: str) -> str:
    """lsblk -J with every instance-store disk bare: no md member, no filesystem, no mount."""
    doc = json.loads(text)
    for device in doc["blockdevices"]:
        if "Instance Storage" in (device.get("model") or ""):
            device.pop("children", None)
            device["fstype"] = None
            device["mountpoint"] = None
    return json.dumps(doc, indent=3) + "\n"


def mounts_without(mountpoint: str) -> Callable[[str], str]:
    def edit(text: str) -> str:
        return "".join(line for line in text.splitlines(keepends=True) if line.split()[1:2] != [mountpoint])
    return edit


# dmesg --ctime as collect keeps it (lines containing "Xid"); GPU7 of a p4d sits at PCI a0:1d
XID_79 = ("[Tue Nov 25 03:12:44 2025] NVRM: Xid (PCI:0000:a0:1d): 79, pid='<unknown>', name=<unknown>, "
          "GPU has fallen off the bus.\n")


def socket_fallback_log() -> str:
    """An NCCL_DEBUG=INFO log of a 2-node p4d job that fell back to NET/Socket (no aws-ofi-nccl plugin):
    the parser tests' synthetic log, reused."""
    return (FIXTURES / "system" / "nccl-debug_socket_fallback.log").read_text()


# ---------------------------------------------------------------- damaged files

def garbage(seed: int) -> Callable[[str], bytes]:
    """Random bytes (NUL, invalid UTF-8, CR, NVIDIA-looking tokens) of about the original's length."""
    def edit(text: str) -> bytes:
        rng = random.Random(f"{seed}:{len(text)}")
        pieces = [bytes([rng.randrange(256)]) for _ in range(rng.randrange(50, 400))]
        pieces += [rng.choice([b"\x00", b"\xff\xfe", b"\r", b"\n", b"\t", b"GPU0\t", b"NV12", b"{", b"[", b"Link 3: ",
                               b"MemTotal:", b"CPU(s):", b"provider: efa", b"NVRM: Xid (", b"=", b","])
                   for _ in range(rng.randrange(20, 200))]
        rng.shuffle(pieces)
        return b"".join(pieces)
    return edit


def truncated(fraction: float) -> Callable[[str], str]:
    """The file cut mid-line at `fraction` of its length (a capture cut short)."""
    def edit(text: str) -> str:
        return text[: int(len(text) * fraction)]
    return edit


def every_file(kind: str, edit: Callable[[str], str | bytes]) -> dict[str, Edit]:
    """The same edit for every probe file of a bundle (manifest.json left alone)."""
    return {p.name: edit for p in sorted((BUNDLES / kind).iterdir()) if p.name != "manifest.json"}


# ---------------------------------------------------------------- named broken nodes

Variant = tuple[str, tuple[str, ...], dict[str, Edit]]


def _variants() -> dict[str, Variant]:
    return {
        # GPU7 fell off the bus: 7 rows, topo and nvlink without it, torch sees 7
        "gpu-missing": ("p4d", (), {QUERY: query_drop_gpu(7), TOPO: topo_drop_gpu(7), NVLINK: nvlink_drop_gpu(7),
                                    "cuda.json": cuda_devices(7)}),
        "nvlink-inactive": ("p4d", (), {NVLINK: nvlink_inactive(3, (4, 5))}),
        "nvlink-topo-nv6": ("p4d", (), {TOPO: topo_set_pair(2, 5, "NV6")}),
        "efa-absent": ("p4d", (), {"fi_info-p-efa.txt": "fi_getinfo: -61 (No data available)\n",
                                   "sys-class-infiniband.txt": "/sys/class/infiniband: not present\n"}),
        "bad-env": ("p4d", (), {"env.txt": env_add(NCCL_P2P_DISABLE="1", NCCL_NET="Socket", CUDA_LAUNCH_BLOCKING="1")}),
        "socket-fallback": ("p4d", (), {"nccl-debug.log": lambda _: socket_fallback_log()}),
        "nvme-unmounted": ("p4d", (), {"lsblk.json": lsblk_unassembled, "mounts.txt": mounts_without("/scratch")}),
        "ecc": ("p4d", (), {QUERY: lambda t: query_set(5, "ecc.errors.uncorrected.aggregate.total", "2")(
            query_set(5, "ecc.errors.uncorrected.volatile.total", "2")(t))}),
        "xid79": ("p4d", (), {"kernel-xid.txt": XID_79}),
    }


VARIANTS = tuple(_variants())


def make_variant(name: str, tmp_path: Path) -> Path:
    kind, drop, replace = _variants()[name]
    return make_bundle(kind, tmp_path, drop, replace)
