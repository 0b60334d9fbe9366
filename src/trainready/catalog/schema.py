"""Typed records for GPU and instance facts (the catalog's data files follow this shape)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, computed_field, model_validator

from trainready.errors import printable
from trainready.limits import MAX_USD_PER_HOUR

Precision = Literal["bf16", "fp16", "fp8", "tf32", "fp32"]
Topology = Literal["nvswitch", "nvlink-mesh", "pcie", "single"]
PricingModel = Literal["on-demand", "spot"]
MAX_GPUS_PER_NODE = 1024  # the NVLink matrix is gpu_count x gpu_count


def _plain(name: str) -> str:
    if printable(name) != name:
        raise ValueError(f"'{printable(name)}' holds a control character: names are plain text")
    return name


Name = Annotated[str, AfterValidator(_plain)]  # shown in tables, titles and messages


class _Strict(BaseModel):
    # A typo in a user's catalog must be an error, not a silently ignored key; and
    # `gpu_count = true` is an error, not 1 GPU.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)


class PeakTflops(_Strict):
    """Dense peak TFLOP/s per precision; None where the GPU lacks it or nobody sourced it."""

    bf16: float | None = Field(None, gt=0)
    fp16: float | None = Field(None, gt=0)
    fp8: float | None = Field(None, gt=0)
    tf32: float | None = Field(None, gt=0)
    fp32: float | None = Field(None, gt=0)


class Gpu(_Strict):
    name: Name = Field(description="canonical name, e.g. a100-80gb")
    display_name: Name = ""
    aliases: list[Name] = []
    arch: Literal["volta", "ampere", "ada", "hopper", "blackwell", "other"] = "other"
    memory_gib: float = Field(gt=0, description="memory per GPU, GiB")
    hbm_gbps: float = Field(gt=0, description="memory bandwidth, GB/s")
    tflops: PeakTflops
    gpu_link: Name = Field("pcie4", description="GPU-GPU link kind: nvlink2..5, pcie3..5")
    gpu_gpu_gbps_bidir: float | None = Field(None, gt=0, description="GPU-GPU bandwidth per GPU, both directions, GB/s")
    nvlink_links: int | None = Field(None, ge=0)
    nvlink_link_gbps: float | None = Field(None, gt=0, description="per link and direction, GB/s")
    nvlink_domain: int | None = Field(None, gt=0, description="GPUs one NVLink domain joins across servers (GB200 "
                                                               "NVL72: 72); None: the server's own GPUs")
    pcie_gen: int | None = Field(None, ge=1)
    power_w: float | None = Field(None, gt=0, description="rated board power, W: the default power limit nvidia-smi "
                                                          "reports (None: not in the catalog)")
    pcie_gbps_per_dir: float | None = Field(None, gt=0)
    uncertain: str | None = None
    source: str = Field(min_length=1)
    sources: dict[str, str] = {}

    def peak_tflops(self, precision: str) -> float | None:
        return getattr(self.tflops, precision, None)

    @property
    def has_nvlink(self) -> bool:
        return self.gpu_link.startswith("nvlink")


class Price(_Strict):
    region: Name
    model: PricingModel
    usd_per_hour: float | None = Field(None, gt=0, le=MAX_USD_PER_HOUR, description="None: no price is known")
    usd_per_hour_max: float | None = Field(None, gt=0, le=MAX_USD_PER_HOUR)
    as_of: str = ""
    suspect: bool = False
    note: str | None = None
    source: str = ""
    verified: str | None = Field(None, min_length=1, description="where this very figure was checked (price page or "
                                 "spot history on a date, a bill); an unusual spot price with it is not flagged")


class Instance(_Strict):
    name: Name
    cloud: Name
    gpu: Name = Field(description="canonical GPU name from the GPU catalog")
    gpu_count: int = Field(ge=1, le=MAX_GPUS_PER_NODE)
    vcpus: int | None = Field(None, ge=1)
    ram_gib: float | None = Field(None, gt=0)
    nvme_count: int | None = Field(None, ge=0)
    nvme_gb: float | None = Field(None, ge=0, description="per device, decimal GB")
    network_gbps: float | None = Field(None, gt=0, description="inter-node network, Gbit/s")
    efa_interfaces: int | None = Field(None, ge=0)
    fabric: Literal["infiniband", "efa"] | None = Field(
        None, description="the inter-node RDMA fabric: infiniband (Mellanox/NVIDIA ConnectX, which GPU-initiated RDMA "
                          "such as DeepEP's IBGDA needs) or efa (AWS Elastic Fabric Adapter); None: not known")
    gpus_per_pcie_switch: int | None = Field(None, ge=1, le=MAX_GPUS_PER_NODE,
                                             description="GPUs behind one PCIe switch, sharing its uplink to the "
                                                         "host (host-memory copies of all GPUs at once split it); "
                                                         "None: not known")
    ebs_mbps: float | None = Field(None, gt=0)
    topology: Topology
    nvlink_all_pairs: int | None = Field(None, ge=0)
    nvlink_matrix: list[list[int]] | None = None
    regions: list[Name] = []
    notes: str | None = None
    source: str = Field(min_length=1)
    sources: dict[str, str] = {}
    price: list[Price] = []

    @model_validator(mode="after")
    def _check_nvlink(self) -> "Instance":
        if self.nvlink_all_pairs is not None and self.nvlink_matrix is not None:
            raise ValueError("give nvlink_all_pairs or nvlink_matrix, not both")
        m = self.nvlink_matrix
        if m is not None:
            n = self.gpu_count
            if len(m) != n or any(len(row) != n for row in m):
                raise ValueError(f"nvlink_matrix must be {n}x{n} (gpu_count)")
            for i in range(n):
                if m[i][i] != 0:
                    raise ValueError(f"nvlink_matrix[{i}][{i}] must be 0 (a GPU has no link to itself)")
                for j in range(n):
                    if m[i][j] != m[j][i]:
                        raise ValueError(f"nvlink_matrix is not symmetric at GPU{i}-GPU{j}")
        return self

    @computed_field  # type: ignore[prop-decorator]
    @property
    def expected_nvlink(self) -> list[list[int]] | None:
        """NVLink count between every GPU pair (0 = none), or None where unknown."""
        n = self.gpu_count
        if self.nvlink_matrix is not None:
            return [list(row) for row in self.nvlink_matrix]
        if self.nvlink_all_pairs is not None:
            return [[0 if i == j else self.nvlink_all_pairs for j in range(n)] for i in range(n)]
        if n == 1:
            return [[0]]
        return None

    @property
    def nvme_total_gb(self) -> float | None:
        if self.nvme_count is None or self.nvme_gb is None:
            return None
        return self.nvme_count * self.nvme_gb

    def price_for(self, model: PricingModel, region: str | None = None) -> Price | None:
        """The price entry for a pricing model, in `region` or else the first listed."""
        matches = [p for p in self.price if p.model == model]
        if region is not None:
            matches = [p for p in matches if p.region == region]
        return matches[0] if matches else None


class GpuList(BaseModel):
    """`trainready catalog gpus --json`"""

    schema_version: int = 1
    gpus: list[Gpu]


class InstanceList(BaseModel):
    """`trainready catalog instances --json`"""

    schema_version: int = 1
    instances: list[Instance]
