"""DeepSpeed 0.19: ZeRO stages 0-3 with CPU offload, AutoTP tensor parallelism and AutoEP
expert parallelism for Hugging Face models, PEFT LoRA/QLoRA; pipeline stages only through the
user's PipelineModule. One JSON, read by `deepspeed.initialize(config=...)` or the HF Trainer's
`--deepspeed`."""

from __future__ import annotations

import json

from ..lora_targets import peft_target_modules
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
    schedule_calls_reason,
    torchrun,
)

NAME = "deepspeed"
VERSION = "0.19.8"
CONFIG_FILE = "ds_config.json"
STAGE = {"ddp": 0, "zero1": 1, "zero2": 2, "zero3": 3}
# AutoEP presets in deepspeed 0.19.8 (module_inject/auto_ep_presets/registry.py: hf_model_types)
AUTOEP_FAMILIES = ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3")


AUTOEP_DOES_NOT_START = (
    "DeepSpeed 0.19.8's AutoEP does not initialize with transformers 5.23: module_inject/auto_ep_presets/base.py "
    "calls transformers' _CAN_RECORD_REGISTRY.get(key, default), whose get() takes one argument (TypeError at "
    "deepspeed.initialize, reproduced on 2 processes in the tests), so it runs no expert parallelism here; use "
    "--framework torchtitan or megatron")


def reason(s: Setup) -> str | None:
    why = (dropless_reason(s, "DeepSpeed AutoEP's experts (auto_ep_config.py: no capacity factor)")
           or no_tp_overlap_reason(s, "DeepSpeed AutoTP's layers")
           or schedule_calls_reason(s, "DeepSpeed's PipelineEngine (train_batch)"))
    if why:
        return why
    if s.cp > 1:
        return ("DeepSpeed's sequence parallelism is Ulysses (an all-to-all of attention heads), not the ring "
                "context parallelism this row models; use --framework megatron or torchtitan")
    if s.precision == "fp8":
        return "DeepSpeed has no fp8 training of its own (it needs Transformer Engine); use --framework megatron"
    if s.optimizer_dtype == "bf16":
        return ("DeepSpeed keeps fp32 master weights and optimizer states under bf16 (ZeRO's optimizer); "
                "pure bf16 (--optimizer-dtype bf16): use --framework torchtitan")
    if checkpointing(s).startswith("selective"):
        return ("a Hugging Face model under DeepSpeed recomputes whole layers (gradient_checkpointing), "
                "not selectively; use --framework torchtitan (op-level) or megatron (attention)")
    if s.pp > 1 and STAGE[s.strategy] > 1:
        return (f"DeepSpeed's pipeline engine takes ZeRO stage 0 or 1, not {s.strategy} "
                f"(deepspeed/runtime/pipe/engine.py)")
    if s.pp > 1 and s.tp > 1:
        return ("DeepSpeed's pipeline engine takes tensor parallelism from a Megatron-style mpu, not from "
                "AutoTP; tp x pp: use --framework megatron or torchtitan")
    if s.pp > 1 and s.method != "full":
        return "PEFT adapters in a DeepSpeed PipelineModule are not supported; use pp 1"
    if s.pp_virtual > 1:
        return ("DeepSpeed's pipeline engine runs one stage per rank (TrainSchedule, 1F1B), not interleaved "
                "virtual stages; use --framework megatron or torchtitan")
    if s.tp > 1 and s.method != "full":
        return f"PEFT {s.method} on AutoTP-sharded layers is not documented; use a tp 1 row"
    if s.tp > 1 and s.model.is_moe:  # transformers 5.23's MoE classes: fused 3D experts AutoTP cannot split
        return ("DeepSpeed AutoTP does not split transformers 5.23's MoE models (Mixtral's tp_plan styles "
                "'moe_tp_experts'/'packed_colwise' are refused at initialize; gpt-oss starts unsplit): use a tp 1 "
                "row, or --framework torchtitan or megatron")
    why = expert_tp_reason(s, "DeepSpeed", "AutoEP's expert_tensor_parallel_size 1, auto_ep_config.py; AutoTP "
                                           "splits every linear layer")
    if why:
        return why
    if s.ep > 1:  # AutoEP's own limits first, then why even a row within them does not start here
        if s.model.family not in AUTOEP_FAMILIES:
            return (f"DeepSpeed AutoEP knows {', '.join(AUTOEP_FAMILIES)} models, not {s.model.family}; "
                    f"use --framework torchtitan or megatron")
        if s.pp > 1 or s.tp > 1 or s.method != "full":
            return "DeepSpeed AutoEP here only with tp 1, pp 1 and full training; use --framework megatron"
        if why := collective_a2a_reason(s, "DeepSpeed AutoEP"):
            return why
        return AUTOEP_DOES_NOT_START
    return None


def hf_trainer(s: Setup) -> bool:
    """The JSON goes to the Hugging Face Trainer (`train.py --deepspeed`); a pipeline's train.py drives
    DeepSpeed's own engine (PipelineModule, engine.train_batch) and gets every value written out."""
    return s.pp == 1


def trainer_flags(s: Setup) -> list[str]:
    """The TrainingArguments flags that carry the row's values into the JSON's "auto" fields."""
    flags = [f"--per_device_train_batch_size {s.micro_batch}", f"--gradient_accumulation_steps {s.grad_accum}"]
    if s.precision in ("bf16", "fp16"):
        flags.append(f"--{s.precision}")
    if checkpointing(s) == "full":
        flags.append("--gradient_checkpointing")
    if s.compiled:  # the model's forward, its loss included
        flags.append("--torch_compile")
    return flags


def config(s: Setup) -> dict:
    zero: dict = {"stage": STAGE[s.strategy], "overlap_comm": True, "contiguous_gradients": True}
    if s.strategy == "zero3":  # save_model writes whole 16-bit weights (adapters too), not only ZeRO's shards
        zero["stage3_gather_16bit_weights_on_model_save"] = True
    if s.offload != "none":
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if s.offload == "optimizer+params":
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    # "auto": the HF Trainer fills these from its TrainingArguments (transformers integrations/deepspeed.py
    # HfTrainerDeepSpeedConfig.trainer_config_process), which the recipe's command sets to the row's values;
    # written out, any other value in the script makes the Trainer refuse to start
    auto = hf_trainer(s)
    cfg: dict = {
        "train_micro_batch_size_per_gpu": "auto" if auto else s.micro_batch,
        "gradient_accumulation_steps": "auto" if auto else s.grad_accum,
    }
    # With AutoTP DeepSpeed builds its config twice with two world sizes: deepspeed.initialize without an mpu
    # counts every rank, TP ones included, and ZeRO-3's zero.Init, given the TP groups as mpu, the data-parallel
    # ranks; each asserts train_batch_size = micro x accumulation x its world (runtime/config.py
    # _batch_assertion), so no single value starts. Left out, each derives it from the two fields above.
    if s.tp == 1:
        cfg["train_batch_size"] = "auto" if auto else s.global_batch
    if s.precision in ("bf16", "fp16"):
        cfg[s.precision] = {"enabled": "auto" if auto else True}
        low = "bf16" if s.precision == "bf16" else "fp16"
        cfg["communication_data_type"] = "fp32" if s.reduce_dtype == "fp32" else low
    cfg["zero_optimization"] = zero
    cfg["gradient_clipping"] = "auto" if auto else 1.0  # TrainingArguments.max_grad_norm defaults to 1.0
    if s.offload != "none":  # ZeRO-Offload refuses a client optimizer (zero_force_ds_cpu_optimizer): DeepSpeed
        # builds its CPU-Adam from this block, the Trainer filling "auto" from its learning rate and Adam flags
        params = ({"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"} if auto else
                  {"lr": 1e-5, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0})
        cfg["optimizer"] = {"type": "AdamW", "params": params}
    if s.tp > 1:
        cfg["tensor_parallel"] = {"autotp_size": s.tp}
    if s.ep > 1:
        cfg["expert_parallel"] = {"enabled": True, "autoep_size": s.ep}
    if s.pp > 1:
        cfg["pipeline"] = {"stages": s.pp}
    return cfg


def recipe(s: Setup) -> Recipe:
    env, notes = environment(s)
    text = json.dumps(config(s), indent=2)
    if hf_trainer(s):
        numbers = (f"train_micro_batch_size_per_gpu {s.micro_batch}, gradient_accumulation_steps {s.grad_accum}"
                   + (f", train_batch_size {s.global_batch}" if s.tp == 1 else "")
                   + ", gradient_clipping 1.0" + (f", {s.precision}.enabled true" if s.precision in ("bf16", "fp16")
                                                  else ""))
        notes.insert(0, f"DeepSpeed {VERSION}: save the JSON as {CONFIG_FILE}; train.py is a Hugging Face Trainer "
                        f"script (HfArgumentParser over TrainingArguments): the Trainer fills the JSON's \"auto\" "
                        f"values from the flags on the command line. A script that calls deepspeed.initialize "
                        f"itself writes them instead: {numbers}")
    else:
        notes.insert(0, f"DeepSpeed {VERSION}: save the JSON as {CONFIG_FILE}; train.py passes it to "
                        f"deepspeed.initialize(config=...)")
    if s.strategy == "zero3":
        notes.append("stage3_gather_16bit_weights_on_model_save: Trainer.save_model (and PEFT's adapter save) "
                     "gathers the ZeRO-3 shards into whole 16-bit weights; without it the output holds only "
                     "DeepSpeed's shards, to convert with zero_to_fp32.py")
    if s.strategy == "ddp" and s.precision in ("bf16", "fp16") and s.pp == 1 and s.method == "full":
        notes.append(f"ZeRO stage 0 with {s.precision}: DeepSpeed's {s.precision} optimizer wrapper keeps {s.precision} "
                     f"gradients and at the step their fp32 copies beside the fp32 masters (runtime/engine.py "
                     f"DDP_BFLOAT16, fp16/unfused_optimizer.py): 20 bytes per parameter, as the row counts")
    if s.tp > 1:
        notes.append(f"AutoTP training (tensor_parallel.autotp_size {s.tp}): Hugging Face transformers "
                     f"models; all ranks of a TP group must read the same batch (deepspeed/runtime/engine.py). "
                     f"train_batch_size is left for DeepSpeed to derive (its config counts TP ranks in one place "
                     f"and not in another, and asserts either way); a step trains on {s.global_batch:,} sequences, "
                     f"micro-batch {s.micro_batch} x {s.grad_accum} accumulation x {s.dp} data-parallel groups")
    if s.ep > 1:
        notes.append(f"AutoEP (expert_parallel.autoep_size {s.ep}) replaces the HF MoE layers at initialize")
    if s.pp > 1:
        notes.append(f"pipeline {s.pp}: train.py builds the model as deepspeed.pipe.PipelineModule("
                     f"layers=[LayerSpec...], num_stages={s.pp}) and calls engine.train_batch(); ZeRO <= 1")
    if s.compiled and not hf_trainer(s):
        notes.append("torch.compile with the loss: PipelineModule(..., loss_fn=torch.compile(loss_fn)) (the pipeline "
                     "engine calls loss_fn outside the module's forward) and engine.compile() after "
                     "deepspeed.initialize")
    if checkpointing(s) == "full" and not hf_trainer(s):
        notes.append("activation checkpointing: model.gradient_checkpointing_enable() (HF) before initialize")
    if s.method in ("lora", "qlora"):
        notes.append(f"{s.method}: PEFT get_peft_model(model, LoraConfig(r={s.lora_rank}, target_modules="
                     f"{peft_target_modules(s.lora_targets, s.model)}"
                     + (f", lora_dropout={s.lora_dropout!r}" if s.lora_dropout else "") + ", ...)) before initialize"
                     + ("; QLoRA loads the base with BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="
                        "'nf4', bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.bfloat16, "
                        "bnb_4bit_quant_storage=torch.bfloat16): double quantization is the ~0.52 bytes per weight "
                        "the row counts (without it 0.56), bf16 compute the activations it counts (the default is "
                        "fp32), and the storage dtype lets ZeRO-3 shard the 4-bit weights"
                        if s.method == "qlora" else ""))
    notes.append(batch_note(s))
    program = " ".join([f"train.py --deepspeed {CONFIG_FILE}", *(trainer_flags(s) if hf_trainer(s) else [])])
    return Recipe(framework=NAME, torchrun=torchrun(s, program), env=env,
                  config_kind="deepspeed-json", config_file=CONFIG_FILE, config=text, notes=notes)
