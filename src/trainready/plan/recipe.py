"""Launch recipe for a chosen setup: torchrun commands, environment, and the sharding config
(FSDP2 for ZeRO-3/FSDP and DDP, DeepSpeed JSON for ZeRO-1/2 and offload)."""

from __future__ import annotations

import json

from pydantic import BaseModel

from .setup import Setup


class Recipe(BaseModel):
    torchrun: list[str]
    env: dict[str, str]
    config_kind: str
    config: str
    notes: list[str]


def _torchrun(s: Setup) -> list[str]:
    script = "train.py"
    if s.nodes == 1:
        return [f"torchrun --standalone --nproc-per-node={s.gpus_per_node} {script}"]
    return [f"torchrun --nnodes={s.nodes} --node-rank={r} --nproc-per-node={s.gpus_per_node} "
            f"--rdzv-backend=c10d --rdzv-endpoint=$HEAD_NODE_IP:29500 --rdzv-id=trainready {script}"
            for r in range(s.nodes)]


def _env(s: Setup) -> tuple[dict[str, str], list[str]]:
    env = {"NCCL_DEBUG": "INFO"}
    notes = ["NCCL_DEBUG=INFO prints the transport NCCL picked: look for it in the first lines of rank 0"]
    inst = s.instance
    if inst is not None and inst.cloud == "aws" and (inst.efa_interfaces or 0) > 0 and s.nodes > 1:
        env.update({"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1"})
        notes.append("EFA: needs the aws-ofi-nccl plugin (in the AWS Deep Learning AMIs); NCCL must log "
                     "'NET/OFI Selected Provider is efa', not 'NET/Socket'. The security group must allow "
                     "all traffic to and from itself.")
    return env, notes


def _fsdp2(s: Setup) -> str:
    reduce = "torch.float32" if s.reduce_dtype == "fp32" else "torch.bfloat16"
    param = {"bf16": "torch.bfloat16", "fp8": "torch.bfloat16", "fp16": "torch.float16"}.get(s.precision, "torch.float32")
    lines = [
        "import torch",
        "from torch.distributed.fsdp import (",
        "    CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard)",
        "",
        f"mp = MixedPrecisionPolicy(param_dtype={param},",
        f"                          reduce_dtype={reduce})",
        "kw = dict(mp_policy=mp" + (", offload_policy=CPUOffloadPolicy()" if s.offload == "optimizer+params" else "") + ")",
    ]
    if s.checkpointing == "full":
        lines += ["from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (",
                  "    checkpoint_wrapper)",
                  "for i, block in enumerate(model.model.layers):",
                  "    model.model.layers[i] = checkpoint_wrapper(block)"]
    lines += ["for block in model.model.layers:  # one FSDP unit per transformer block",
              "    fully_shard(block, **kw)",
              "# embeddings and head: FSDP units of their own",
              "fully_shard(model.model.embed_tokens, **kw)",
              "fully_shard(model.lm_head, **kw)",
              "fully_shard(model, **kw)",
              "optim = torch.optim.AdamW(model.parameters(), lr=..., fused=True)"]
    if s.tp > 1:
        lines[:0] = [f"# 2-D: tensor parallel {s.tp} inside each node",
                     "# (torch.distributed.tensor.parallel), FSDP across nodes"]
    return "\n".join(lines)


def _ddp(s: Setup) -> str:
    lines = [
        "import torch",
        "from torch.nn.parallel import DistributedDataParallel as DDP",
        "",
        "# gradient_as_bucket_view: no second copy of the gradients",
        "model = DDP(model.cuda(), gradient_as_bucket_view=True)",
        "optim = torch.optim.AdamW(model.parameters(), lr=..., fused=True)",
        f"with torch.autocast('cuda', dtype=torch.{'bfloat16' if s.precision == 'bf16' else 'float16'}):",
        "    loss = model(**batch).loss",
    ]
    if s.checkpointing == "full":
        lines[3:3] = ["# Hugging Face models; else torch.utils.checkpoint per block",
                      "model.gradient_checkpointing_enable()"]
    return "\n".join(lines)


def _deepspeed(s: Setup) -> str:
    stage = {"ddp": 0, "zero1": 1, "zero2": 2, "zero3": 3}[s.strategy]  # ddp with tp/pp: stage 0
    zero: dict = {"stage": stage, "overlap_comm": True, "contiguous_gradients": True}
    if s.offload != "none":
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if s.offload == "optimizer+params":
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    cfg = {
        "train_micro_batch_size_per_gpu": s.micro_batch,
        "gradient_accumulation_steps": s.grad_accum,
        "train_batch_size": s.global_batch,
        ("bf16" if s.precision == "bf16" else "fp16"): {"enabled": True},
        "zero_optimization": zero,
        "gradient_clipping": 1.0,
    }
    if s.checkpointing == "full":
        cfg["activation_checkpointing"] = {"partition_activations": False, "contiguous_memory_optimization": False}
    if s.pp > 1:
        cfg["pipeline"] = {"stages": s.pp}
    return json.dumps(cfg, indent=2)


def recipe_for(s: Setup) -> Recipe:
    """The config's lines stay within 79 characters, so it prints at 80 columns unwrapped."""
    env, notes = _env(s)
    if s.strategy == "ddp" and s.tp == 1 and s.pp == 1:
        kind, cfg = "pytorch-ddp", _ddp(s)
    elif s.strategy == "zero3" and s.offload in ("none", "optimizer+params") and s.pp == 1:
        kind, cfg = "pytorch-fsdp2", _fsdp2(s)
    else:
        kind, cfg = "deepspeed-json", _deepspeed(s)
        notes.append("pass the JSON to deepspeed.initialize(config=...); launch with torchrun as shown")
    if s.tp > 1 or s.pp > 1:
        notes.append(f"tensor parallel {s.tp} x pipeline {s.pp} x data parallel {s.dp}: needs a framework "
                     "that implements them (Megatron-LM, torchtitan, DeepSpeed pipeline)")
    notes.append(f"micro-batch {s.micro_batch} per GPU, {s.grad_accum} accumulation step(s), "
                 f"global batch {s.global_batch} x {s.seq_len} tokens")
    return Recipe(torchrun=_torchrun(s), env=env, config_kind=kind, config=cfg, notes=notes)
