"""Acceptance floors for the `--deep` measurements: catalog data with sources (data/thresholds.toml),
and a derived figure, marked as such, where no source covers the node.

A sourced floor is strict, as the health checkers that publish it are: below it the node fails.
A derived figure comes from the catalog's datasheet numbers and a ratio taken from the sourced
floors; it is looser (fail below the floor, warn below `warn_gbps`) because nobody measured it."""

from __future__ import annotations

import functools
import tomllib
from dataclasses import dataclass
from importlib import resources
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from trainready.catalog.schema import Gpu, Instance

Kind = Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "h2d", "d2h", "p2p", "memory"]
COLLECTIVES: tuple[Kind, ...] = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")

# Ratios behind the derived figures, each taken from the sourced floors in data/thresholds.toml:
H2D_OF_PCIE = 0.67  # aznhc's PCIe gen4 floor 21 GB/s of the 31.5 GB/s a x16 link carries per direction
MEMORY_OF_HBM = 0.57  # DCGM's floors: A100-80GB 1173 of 2039 GB/s (0.575), H100 1905 of 3350 (0.569)
P2P_OF_NVLINK = 0.70  # aznhc: H100 335 of 18 x 26.562 = 478 GB/s per direction (0.70); A100 235 of 300 (0.78)
# The all-reduce model `check` used before sourced floors (docs/check.md): nccl-tests shows ~230 GB/s
# on 8x A100 = 0.77 x 12 links x 25 GB/s; rings over a cube-mesh use part of the links; across nodes
# ~0.8 of the network. Judged loosely, as before: fail below 40% of it, warn below 70%.
NVSWITCH_BUSBW_OF_LINKS = 0.77
MESH_BUSBW_OF_LINKS = 0.6
PCIE_BUSBW_OF_LINK = 0.6
NETWORK_BUSBW_OF_LINE_RATE = 0.8
DERIVED_FAIL, DERIVED_WARN = 0.4, 0.7
# bf16 GEMM per GPU (check --deep): against the datasheet peak as before (pass from 60%, fail under 40%), and
# against the best GPU of the node: Hugging Face's gpu-fryer (8192^3 cuBLAS GEMMs on every GPU at once) passes a
# GPU within 10% of the best one (--tflops-tolerance default 10); our run is seconds, not its 60, so a GPU 10%
# behind warns and one 25% behind fails. A steady rate 25% under the first window's is clocks falling under load.
GEMM_PASS_OF_PEAK, GEMM_FAIL_OF_PEAK = 0.6, 0.4
GEMM_WARN_BEHIND_BEST, GEMM_FAIL_BEHIND_BEST = 0.10, 0.25
GEMM_FALL_WARN = 0.25


class Floor(BaseModel):
    """One entry of data/thresholds.toml."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Kind
    gpus: list[str] = Field(min_length=1)
    instances: list[str] | None = None
    gpu_count: int | None = None
    topology: str | None = None
    nodes: int = 1
    floor_gbps: float = Field(gt=0)
    typical_gbps: float | None = None
    size_bytes: int | None = Field(None, gt=0)
    source: str = Field(min_length=1)


class _File(BaseModel):
    model_config = ConfigDict(extra="forbid")
    floor: list[Floor]


@functools.cache
def floors() -> tuple[Floor, ...]:
    text = resources.files("trainready.check").joinpath("data/thresholds.toml").read_text()
    return tuple(_File.model_validate(tomllib.loads(text)).floor)


@dataclass(frozen=True)
class Threshold:
    """What a measurement is judged against: fail below `floor_gbps`; warn below `warn_gbps` (derived only)."""

    floor_gbps: float
    source: str
    derived: bool = False
    size_bytes: int | None = None  # the message size the floor applies at (collectives)
    typical_gbps: float | None = None
    warn_gbps: float | None = None

    def describe(self) -> str:
        at = f" at {size_text(self.size_bytes)}" if self.size_bytes else ""
        if self.derived:
            return f">= {self.floor_gbps:.1f} GB/s{at} (derived: {self.source})"
        return f">= {self.floor_gbps:g} GB/s{at} ({self.source})"

    def judge(self, value: float) -> Literal["pass", "warn", "fail"]:
        if value < self.floor_gbps:
            return "fail"
        if self.warn_gbps is not None and value < self.warn_gbps:
            return "warn"
        return "pass"


def size_text(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def _matches(f: Floor, kind: str, instance: Instance | None, gpu: Gpu, nodes: int) -> bool:
    if f.kind != kind or gpu.name not in f.gpus or f.nodes != nodes:
        return False
    if f.instances is not None and (instance is None or instance.name not in f.instances):
        return False
    if f.gpu_count is not None and (instance is None or instance.gpu_count != f.gpu_count):
        return False
    return f.topology is None or (instance is not None and instance.topology == f.topology)


def threshold(kind: Kind, instance: Instance | None, gpu: Gpu | None, nodes: int = 1) -> Threshold | None:
    """The floor for `kind` on this node (or `nodes` of them measured together); None: nothing to judge by."""
    if gpu is None:
        return None
    for f in floors():
        if _matches(f, kind, instance, gpu, nodes):
            return Threshold(f.floor_gbps, f.source, size_bytes=f.size_bytes, typical_gbps=f.typical_gbps)
    return derived(kind, instance, gpu, nodes)


def derived(kind: Kind, instance: Instance | None, gpu: Gpu, nodes: int = 1) -> Threshold | None:
    """A figure from the catalog's datasheet numbers, for nodes no source covers."""
    if kind in ("h2d", "d2h"):
        if not gpu.pcie_gbps_per_dir:
            return None
        return Threshold(H2D_OF_PCIE * gpu.pcie_gbps_per_dir, f"{H2D_OF_PCIE} x PCIe {gpu.pcie_gbps_per_dir:g} GB/s "
                         "per direction, the ratio of aznhc's gen4 floor", derived=True)
    if kind == "memory":
        return Threshold(MEMORY_OF_HBM * gpu.hbm_gbps, f"{MEMORY_OF_HBM} x the datasheet {gpu.hbm_gbps:g} GB/s, "
                         "the ratio of DCGM's A100/H100 floors", derived=True)
    if kind == "p2p":
        if gpu.nvlink_links and gpu.nvlink_link_gbps and (instance is None or instance.topology == "nvswitch"):
            per_dir = gpu.nvlink_links * gpu.nvlink_link_gbps
            return Threshold(P2P_OF_NVLINK * per_dir, f"{P2P_OF_NVLINK} x {gpu.nvlink_links} NVLinks x "
                             f"{gpu.nvlink_link_gbps:g} GB/s, the ratio of aznhc's H100 floor", derived=True)
        if gpu.pcie_gbps_per_dir:  # through PCIe (and the host on some boards): loose
            link = gpu.pcie_gbps_per_dir
            return Threshold(DERIVED_FAIL * PCIE_BUSBW_OF_LINK * link, f"PCIe {link:g} GB/s per direction",
                             derived=True, warn_gbps=DERIVED_WARN * PCIE_BUSBW_OF_LINK * link)
        return None
    model = _busbw_model(instance, gpu, nodes)
    if model is None:
        return None
    value, why = model
    if kind == "all_to_all":  # every rank sends to every other at once: half the ring figure, judged loosely
        value, why = 0.5 * value, f"0.5 x {why}"
    return Threshold(DERIVED_FAIL * value, f"{DERIVED_FAIL:.0%} of ~{value:.0f} GB/s = {why}", derived=True,
                     warn_gbps=DERIVED_WARN * value)


def _busbw_model(instance: Instance | None, gpu: Gpu, nodes: int) -> tuple[float, str] | None:
    if instance is None:
        return None
    if nodes > 1:
        if not instance.network_gbps:
            return None
        return (NETWORK_BUSBW_OF_LINE_RATE * instance.network_gbps / 8,
                f"{NETWORK_BUSBW_OF_LINE_RATE} x {instance.network_gbps:g} Gbit/s network")
    links, speed = gpu.nvlink_links, gpu.nvlink_link_gbps
    if links and speed and instance.topology == "nvswitch":
        return NVSWITCH_BUSBW_OF_LINKS * links * speed, f"{NVSWITCH_BUSBW_OF_LINKS} x {links} NVLinks x {speed:g} GB/s"
    if links and speed:
        return MESH_BUSBW_OF_LINKS * links * speed, f"{MESH_BUSBW_OF_LINKS} x {links} NVLinks x {speed:g} GB/s (cube-mesh)"
    if gpu.pcie_gbps_per_dir:
        return (PCIE_BUSBW_OF_LINK * gpu.pcie_gbps_per_dir,
                f"{PCIE_BUSBW_OF_LINK} x PCIe {gpu.pcie_gbps_per_dir:g} GB/s per direction")
    return None
