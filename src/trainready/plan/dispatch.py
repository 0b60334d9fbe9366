"""How a mixture-of-experts job's tokens may travel: where DeepEP runs, and what Megatron-Core's EP overlap needs.

The planner models both (plan/moe.py, performance.overlapped_share); this module says whether a machine can run
DeepEP, for the search (which tries it only where it runs) and for `estimate` (which warns where a job asks for it on
a machine that cannot). What the frameworks refuse outright is a usage error in setup.resolve."""
from __future__ import annotations

from . import moe
from .job import JobSpec
from .performance import dp_layout
from .setup import Setup, ep1_dispatch_note

DEEPEP_ARCHS = ("hopper", "blackwell")
"""GPUs DeepEP's kernels run on: SM90 (deepseek-ai/DeepEP README), and Blackwell through Megatron-Core's HybridEP
backend ('GB200, B200, H100 supported', Core 0.15 release notes in megatron/core/transformer/moe/README.md)."""


def ep_spans_nodes(s: Setup) -> bool:
    """The expert-parallel group reaches past one node (its all-to-alls cross the network)."""
    return moe.ep_ranks_per_node(s, dp_layout(s)[0]) < s.ep


def deepep_reason(s: Setup) -> str | None:
    """Why DeepEP cannot carry this row's tokens (None: it can). Its intranode kernels need NVLink between every GPU
    pair; its internode kernels post RDMA from the GPU (IBGDA), which needs InfiniBand NICs: AWS's EFA has no IBGDA
    (deepseek-ai/DeepEP#369), and Megatron-Bridge's H100 recipe crashes on EFA once EP spans nodes, 'neither
    inter-node DeepEP backend supporting EFA' (NVIDIA-NeMo/Megatron-Bridge#3343, 2026-04)."""
    if s.gpu.arch not in DEEPEP_ARCHS:
        return f"DeepEP runs on Hopper and Blackwell GPUs, not {s.gpu.name}"
    if (s.instance.topology if s.instance else None) != "nvswitch":
        return "DeepEP needs NVLink between every GPU pair (NVSwitch)"
    if ep_spans_nodes(s) and (s.instance is None or s.instance.fabric != "infiniband"):
        fabric = s.instance.fabric if s.instance and s.instance.fabric else "not known to be InfiniBand"
        return f"DeepEP's inter-node kernels need InfiniBand (GPU-initiated RDMA); this network is {fabric}"
    return None


def _runs_deepep(s: Setup) -> bool:
    return s.model.is_moe and s.ep > 1 and s.ep_dispatcher == "deepep"


def deepep_warning(s: Setup) -> str | None:
    """The estimate's warning where its job runs DeepEP where it cannot run: on a GPU it has no kernels for, or on a
    catalog machine without NVSwitch or (EP across nodes) without InfiniBand."""
    if not _runs_deepep(s) or (s.instance is None and s.gpu.arch in DEEPEP_ARCHS):
        return None
    why = deepep_reason(s)
    return (f"DeepEP cannot run here: {why}; the figure is what DeepEP would give (--ep-dispatcher alltoall: the "
            f"collective all-to-all this machine runs)") if why else None


def deepep_assumption(s: Setup) -> str | None:
    """What the estimate assumes where it runs DeepEP on a GPU named without an instance (topology and network not
    known)."""
    if not _runs_deepep(s) or s.instance is not None or s.gpu.arch not in DEEPEP_ARCHS:
        return None
    return ("DeepEP taken to run: it needs NVSwitch (and InfiniBand once EP spans nodes), which a GPU named "
            "without --instance does not tell")


def dispatch_note(job: JobSpec, s: Setup) -> str | None:
    """plan's note where its best row does not run the MoE dispatch the job asked for: an ep-1 row, where it changes
    nothing, or a Megatron row with pipeline stages that could not take the virtual ones its EP overlap needs
    (search._moe_dispatch tries them)."""
    if not s.model.is_moe:
        return None
    if s.ep == 1:
        said = ep1_dispatch_note(job.ep_dispatcher == "deepep", bool(job.ep_overlap), bool(job.fp8_dispatch))
        return f"the best row has --ep 1: {said} there" if said else None
    if job.ep_overlap and not s.ep_overlap:
        why = (f"its {s.grad_accum} micro-batches per step are not a multiple of --pp {s.pp}" if s.grad_accum % s.pp
               else "no variant of it with virtual stages fits and runs")
        return (f"--ep-overlap does not apply to the best row: Megatron-Core overlaps the EP all-to-all across "
                f"pipeline stages (--pp {s.pp}) only with virtual ones, and {why}; it runs without the overlap")
    return None
