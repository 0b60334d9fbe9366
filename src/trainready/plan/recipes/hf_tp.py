"""transformers 5.23's native distributed loading: `from_pretrained(...,
distributed_config=DistributedConfig(tp_size=..., fsdp_size=..., ...))` applies the model's
tensor-parallel plan (`base_model_tp_plan`, the successor of `tp_plan="auto"`), FSDP2
(fully_shard) over the data-parallel ranks and the expert-parallel plan, for full fine-tuning
of Hugging Face models in the user's own training loop.

Facts from transformers 5.23.0 distributed/configuration_utils.py and fsdp.py: FSDP mixed
precision is bf16 parameters with fp32 reduction; fsdp_cpu_offload is FSDP2's CPUOffloadPolicy
(parameters, gradients and optimizer states); pipeline parallelism does not combine with FSDP.
"""

from __future__ import annotations

from ..setup import Setup
from .common import (
    Recipe,
    batch_note,
    checkpointing,
    collective_a2a_reason,
    dropless_reason,
    environment,
    expert_tp_reason,
    no_tp_overlap_reason,
    torchrun,
)

NAME = "hf-tp"
VERSION = "5.23.0"
CONFIG_FILE = "load_model.py"
# model_types whose config carries base_model_tp_plan / base_model_ep_plan in transformers 5.23.0
# (tests/test_recipes.py checks both against the installed package)
TP_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "mixtral", "qwen2_moe", "qwen3_moe",
               "deepseek_v3", "gpt_neox")
EP_FAMILIES = ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3")


def reason(s: Setup) -> str | None:
    fam = s.model.family
    why = dropless_reason(s, "transformers' MoE blocks") or no_tp_overlap_reason(s, "transformers' TP plans")
    if why:
        return why
    if s.cp > 1:
        return "transformers' TP/FSDP plans have no context parallelism; use --framework megatron or torchtitan"
    if s.method != "full":
        return f"{s.method}: PEFT on transformers' TP/FSDP plan is not documented; use --framework deepspeed"
    if s.strategy in ("zero1", "zero2"):
        return (f"transformers' DistributedConfig shards with FSDP2 (ZeRO-3) or replicates; {s.strategy}: "
                f"--framework deepspeed")
    if s.offload == "optimizer":
        return ("transformers' fsdp_cpu_offload moves parameters, gradients and optimizer states; "
                "the optimizer alone: --framework deepspeed")
    if s.pp > 1:
        return "transformers' pipeline parallelism does not combine with FSDP; use --framework megatron or torchtitan"
    if s.precision not in ("bf16", "fp32"):
        return f"transformers' FSDP mixed precision is bf16 (fp32 reduce), not {s.precision}; use --framework megatron"
    if s.reduce_dtype != "fp32" and s.precision != "fp32":
        return (f"transformers' FSDP mixed precision reduces in fp32, this row in {s.reduce_dtype} (stack "
                f"{s.stack}): use --stack hf-trainer or --framework deepspeed")
    if checkpointing(s).startswith("selective"):
        return ("transformers' gradient_checkpointing recomputes whole layers; selective: --framework "
                "torchtitan (op-level) or megatron (attention)")
    if s.tp > 1 and fam not in TP_FAMILIES:
        return f"transformers ships no tensor-parallel plan for {fam} models; use --framework deepspeed (AutoTP)"
    why = expert_tp_reason(s, "transformers", "DistributedConfig.efsdp_size: 'Experts are not tensor-parallel'")
    if why:
        return why
    if s.ep > 1:
        if fam not in EP_FAMILIES:
            return f"transformers ships no expert-parallel plan for {fam} models; use --framework torchtitan"
        if s.ep % s.tp or (s.dp * s.tp) % s.ep:
            return f"transformers needs ep a multiple of tp dividing dp x tp (ep {s.ep}, tp {s.tp}, dp {s.dp})"
        if s.strategy == "ddp":
            return "transformers shards experts over FSDP ranks (fsdp_size x tp / ep); ddp: --framework megatron"
        if why := collective_a2a_reason(s, "transformers' expert-parallel plan"):
            return why
    return None


def distributed_kwargs(s: Setup) -> dict:
    fsdp, replicate = (1, s.dp) if s.strategy == "ddp" else (s.dp, 1)
    kw: dict = {"tp_size": s.tp, "fsdp_size": fsdp, "dp_replicate_size": replicate}
    if s.ep > 1:
        kw["ep_size"] = s.ep
    kw["fsdp_cpu_offload"] = s.offload == "optimizer+params"
    kw["fsdp_mixed_precision"] = s.precision == "bf16" and s.optimizer_dtype == "fp32"
    return kw


def recipe(s: Setup) -> Recipe:
    env, notes = environment(s)
    kw = distributed_kwargs(s)
    dtype = "torch.bfloat16" if s.optimizer_dtype == "bf16" else "torch.float32"
    items = [f"{k}={v}" for k, v in kw.items()]
    lines = ["import torch", "from transformers import AutoModelForCausalLM",
             "from transformers.distributed import DistributedConfig", "",
             "dc = DistributedConfig(" + ", ".join(items[:3]) + ","]
    lines += [f"                       {x}," for x in items[3:-1]]
    lines += [f"                       {items[-1]})",
              "model = AutoModelForCausalLM.from_pretrained(",
              f"    MODEL, distributed_config=dc, dtype={dtype})"]
    if checkpointing(s) == "full":
        lines.append("model.gradient_checkpointing_enable()")
    if s.compiled:  # its forward computes the loss from the labels: compiled together
        lines.append("model = torch.compile(model)")
    lines += ["optim = torch.optim.AdamW(model.parameters(), lr=LR)",
              f"# per step: {s.grad_accum} micro-batch(es) of {s.micro_batch} x {s.seq_len} tokens per rank"]
    notes.insert(0, f"transformers {VERSION}: {CONFIG_FILE} is the model set-up of your train.py "
                    f"(torchrun starts it; MODEL: a Hub name or local path)")
    if s.tp > 1:
        notes.append(f"tensor parallel {s.tp} by the model's base_model_tp_plan: the {s.tp} ranks of a TP "
                     f"group must read the same batch")
    notes.append(batch_note(s))
    return Recipe(framework=NAME, torchrun=torchrun(s, "train.py"), env=env, config_kind="transformers-python",
                  config_file=CONFIG_FILE, config="\n".join(lines), notes=notes)
