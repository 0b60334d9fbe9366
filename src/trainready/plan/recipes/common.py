"""What every framework's recipe shares: the Recipe model, the launch lines, the environment,
and a reading of a Setup (its checkpointing kind)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from trainready.catalog.launch_env import as_dict, launch_env

from ..setup import Setup

WIDTH = 79  # config lines print at 80 columns unwrapped (render.py prints them as they are)


class Recipe(BaseModel):
    """How to launch one row in one framework: the commands per node, their environment, and
    the framework's own config (saved as `config_file`)."""

    framework: str = Field(description="torchtitan | deepspeed | megatron | hf-tp")
    torchrun: list[str] = Field(description="launch commands, one per node")
    env: dict[str, str]
    config_kind: str = Field(description="torchtitan-args | deepspeed-json | megatron-args | transformers-python")
    config_file: str = Field(description="the file name the launch commands read the config from")
    config: str
    notes: list[str]


def expert_tp_reason(s: Setup, framework: str, how: str) -> str | None:
    """Frameworks without an expert tensor-parallel knob keep routed experts whole under EP (etp 1: the EP
    group folds over TP and data-parallel ranks) and split them like the dense MLP without it (etp = tp);
    `how` says where the framework fixes that. None when the setup's etp is that one."""
    if not s.model.is_moe:
        return None
    fixed = 1 if s.ep > 1 else s.tp
    if s.expert_tp == fixed:
        return None
    does = "keeps routed experts whole under EP (etp 1)" if s.ep > 1 else "splits experts tp ways without EP"
    return (f"{framework} {does} ({how}); this row has etp {s.expert_tp}: use --framework megatron "
            f"(--expert-tensor-parallel-size) or --etp {fixed}")


def collective_a2a_reason(s: Setup, who: str) -> str | None:
    """Frameworks whose expert parallelism is a collective all-to-all in the compute path cannot run a row
    estimated with DeepEP's dispatcher or with the all-to-all overlapped; None when the row has neither."""
    if s.ep_dispatcher == "alltoall" and not s.ep_overlap:
        return None
    return (f"{who} dispatches tokens by a collective all-to-all in the compute path: no DeepEP dispatcher, no "
            f"all-to-all overlap; use --framework megatron")


def dropless_reason(s: Setup, who: str) -> str | None:
    """Frameworks whose MoE routes dropless cannot run a row with token-drop routing at a capacity factor."""
    if s.model.moe is None or s.model.moe.capacity_factor is None:
        return None
    return (f"{who} route dropless; token-drop routing at a capacity factor: --framework megatron, "
            f"or --moe-routing dropless")


def schedule_calls_reason(s: Setup, who: str) -> str | None:
    """Frameworks that run every micro-batch of a step in one pipeline schedule cannot run a row estimated with
    several schedule calls per step (--pp-local-batch: torch.distributed.pipelining's local batch)."""
    if s.schedule_calls == 1:
        return None
    return (f"{who} runs every micro-batch of a step in one pipeline schedule; this row makes {s.schedule_calls} "
            f"calls of {s.schedule_microbatches} (--pp-local-batch {s.pp_local_batch}): drop --pp-local-batch, or "
            f"--stack torchtitan (torchtitan calls the schedule once per local batch)")


def no_tp_overlap_reason(s: Setup, who: str) -> str | None:
    """Frameworks that run each tensor-parallel collective after its GEMM cannot run a row estimated with it
    overlapped (--tp-overlap)."""
    if s.tp == 1 or not s.tp_overlap:
        return None
    return (f"{who} run the tensor-parallel collectives after each GEMM, with no overlap (--tp-overlap); "
            f"use --framework megatron (--tp-comm-overlap) or torchtitan (async TP)")


def checkpointing(s: Setup) -> str:
    """none | selective-op | selective-attn | full ("selective" from before stacks existed meant
    Megatron's attention recompute)."""
    return "selective-attn" if s.checkpointing == "selective" else s.checkpointing


NUMA_BINDING = "--numa-binding=exclusive"
"""With optimizer offload each rank's CPU-Adam runs on cores of its own (the estimate counts the node's physical
cores shared out among its ranks): torchrun binds each worker to an exclusive share of the cores of its GPU's NUMA
node (torch/numa/binding.py AffinityMode.EXCLUSIVE; torch releases without it reject the flag)."""


def torchrun(s: Setup, program: str) -> list[str]:
    """One command per node: `--standalone` on one node, a c10d rendezvous at node 0 beyond."""
    bind = f"{NUMA_BINDING} " if s.offload != "none" else ""
    if s.nodes == 1:
        return [f"torchrun --standalone --nproc-per-node={s.gpus_per_node} {bind}{program}"]
    return [f"torchrun --nnodes={s.nodes} --node-rank={r} --nproc-per-node={s.gpus_per_node} "
            f"--rdzv-backend=c10d --rdzv-endpoint=$HEAD_NODE_IP:29500 --rdzv-id=trainready {bind}{program}"
            for r in range(s.nodes)]


def environment(s: Setup) -> tuple[dict[str, str], list[str]]:
    """The launch environment (catalog/launch_env.py: the same for every `run --emit` file) and notes on it."""
    found = launch_env(s.instance, s.nodes)
    env = as_dict(found)
    notes = ["NCCL_DEBUG=INFO prints the transport NCCL picked: look for it in the first lines of rank 0"]
    if "FI_PROVIDER" in env:
        notes.append("EFA: needs the aws-ofi-nccl plugin (in the AWS Deep Learning AMIs); NCCL must log "
                     "'NET/OFI Selected Provider is efa', not 'NET/Socket'. The security group must allow "
                     "all traffic to and from itself."
                     + ("" if "FI_EFA_USE_DEVICE_RDMA" in env else " This instance has no GPUDirect RDMA over EFA."))
    if s.nodes > 1:
        notes.append("HEAD_NODE_IP: the private address of node 0, the same on every node")
    if said := binding_note(s):
        notes.append(said)
    return env, notes


def binding_note(s: Setup) -> str | None:
    """What the NUMA binding of an offload row does, and how to bind without it."""
    if s.offload == "none":
        return None
    return (f"{NUMA_BINDING}: each rank's CPU-Adam (optimizer offload) runs on cores of its own, next to its GPU, as "
            f"the estimate assumes; a torch without --numa-binding: numactl --physcpubind per rank, or DeepSpeed's "
            f"launcher with --bind_cores_to_rank")


def batch_note(s: Setup) -> str:
    return (f"micro-batch {s.micro_batch} per GPU, {s.grad_accum} accumulation step(s), "
            f"global batch {s.global_batch} x {s.seq_len} tokens")


def args_lines(args: list[tuple[str, object]]) -> str:
    """`--flag value` one a line (a bare flag for True); the launch reads them with $(cat FILE)."""
    out = []
    for flag, value in args:
        out.append(flag if value is True else f"{flag} {value}")
    return "\n".join(out)


def windowed_reason(s: Setup, framework: str, ships: str) -> str | None:
    """Why `framework`'s recipe cannot build a model with attention sinks or sliding windows (gpt-oss): its
    command line here carries neither; `ships` says where the framework has them."""
    m = s.model
    if not (m.attention_sinks or m.sliding_window):
        return None
    what = " and ".join(w for w, on in (("attention sinks", m.attention_sinks),
                                         ("sliding-window blocks", m.sliding_window)) if on)
    return (f"{m.name} has {what}, which trainready's {framework} recipe does not set ({ships}); "
            f"use --framework deepspeed (the Hugging Face model class)")
