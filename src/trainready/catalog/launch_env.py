"""The environment a launch on an instance needs, each value with why and its source: the one place `plan`'s launch
line (plan/recipes/common.py) and every `run --emit` file (run/emit/) take it from, so they cannot disagree.

- NCCL_DEBUG=INFO on every launch: NCCL then logs the transport it picked, the first thing to check on a new
  cluster (NCCL's environment variables, docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html).
- FI_PROVIDER=efa on an AWS instance with EFA interfaces, several nodes: libfabric (under the aws-ofi-nccl plugin)
  must pick the EFA provider, not fall back to TCP sockets (AWS EC2 user guide, "Get started with EFA and NCCL";
  SageMaker's torchrun driver sets it for its EFA instances: aws/sagemaker-python-sdk,
  container_drivers/common/utils.py SM_EFA_NCCL_INSTANCES).
- FI_EFA_USE_DEVICE_RDMA=1 where GPUDirect RDMA over EFA applies (the A100, H100/H200 and B200 instances of
  GPUDIRECT_RDMA_FAMILIES): NIC-to-GPU transfers without a host bounce (SageMaker sets it for p4d/p4de,
  SM_EFA_RDMA_INSTANCES; libfabric 1.18+ turns it on by itself on p5, where setting it changes nothing). Not set
  on EFA instances without GPUDirect RDMA (p3dn, g5, g6e).
"""

from __future__ import annotations

from dataclasses import dataclass

from .schema import Instance

GPUDIRECT_RDMA_FAMILIES = ("p4d", "p4de", "p5", "p5e", "p5en", "p6-b200", "p6-b300")
"""AWS instance families whose EFA supports GPUDirect RDMA (NIC reads and writes GPU memory)."""

NCCL_ENV_DOC = "NCCL user guide, environment variables (env.html)"
EFA_NCCL_DOC = "AWS EC2 user guide, EFA and NCCL (efa-start-nccl.html)"


@dataclass(frozen=True)
class EnvVar:
    name: str
    value: str
    why: str
    source: str


def has_gpudirect_rdma(instance: Instance) -> bool:
    return instance.cloud == "aws" and instance.name.split(".")[0] in GPUDIRECT_RDMA_FAMILIES


def launch_env(instance: Instance | None, nodes: int) -> list[EnvVar]:
    """What a launch of `nodes` x `instance` sets (None: an unknown instance, NCCL's debug line only)."""
    out = [EnvVar("NCCL_DEBUG", "INFO", "NCCL logs the transport it picked (look for NET/OFI or NET/IB, not "
                  "NET/Socket, in rank 0's first lines)", NCCL_ENV_DOC)]
    if instance is None or nodes < 2 or instance.cloud != "aws" or not (instance.efa_interfaces or 0):
        return out
    out.append(EnvVar("FI_PROVIDER", "efa", "libfabric uses EFA, not TCP sockets (needs the aws-ofi-nccl plugin, "
                      "in the AWS Deep Learning AMIs and containers)", EFA_NCCL_DOC))
    if has_gpudirect_rdma(instance):
        out.append(EnvVar("FI_EFA_USE_DEVICE_RDMA", "1", "GPUDirect RDMA: EFA reads and writes GPU memory directly",
                          f"{EFA_NCCL_DOC}; SageMaker's SM_EFA_RDMA_INSTANCES"))
    return out


def as_dict(env: list[EnvVar]) -> dict[str, str]:
    return {v.name: v.value for v in env}
