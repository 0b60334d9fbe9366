"""torchtitan 0.3: FSDP2 + tensor, pipeline and expert parallelism on DTensor, launched as
`torchrun -m torchtitan.train --module M --config C` with command-line overrides.

torchtitan 0.3 has no TOML job files any more: a job is a Python `Trainer.Config` from a model's
`config_registry` (`--module llama3 --config llama3_8b`), and its "command-line surface is
frozen" (torchtitan/config/configs.py): `--section.field value`, and the activation
checkpointing policy as a subcommand (`activation_checkpoint:selective|full|none`). The field
names below are those of torchtitan 0.3.0's config dataclasses (ParallelismConfig,
TrainingConfig, CheckpointManager.Config; distributed/activation_checkpoint.py).
"""

from __future__ import annotations

import re

from ..setup import Setup
from .common import (
    Recipe,
    args_lines,
    batch_note,
    checkpointing,
    dropless_reason,
    environment,
    expert_tp_reason,
    torchrun,
    windowed_reason,
)

NAME = "torchtitan"
VERSION = "0.3.0"
ARGS_FILE = "torchtitan.args"

# Our presets that torchtitan 0.3.0 ships a config for (torchtitan/models/*/config_registry.py).
# Llama 3, 3.1 and 3.3 70B share one shape; torchtitan's llama3_70b is that shape.
# Llama 3 (without .1) is not among them: torchtitan's llama3 flavors rotate with Llama 3.1's scaling
# (models/llama3/__init__.py scaling="llama"), which Llama 3's config does not have.
CONFIGS: dict[str, tuple[str, str]] = {
    "llama-3.1-8b": ("llama3", "llama3_8b"), "llama-3.1-70b": ("llama3", "llama3_70b"),
    "llama-3.3-70b": ("llama3", "llama3_70b"), "llama-3.1-405b": ("llama3", "llama3_405b"),
    "qwen3-0.6b": ("qwen3", "qwen3_0_6b"), "qwen3-1.7b": ("qwen3", "qwen3_1_7b"),
    "qwen3-14b": ("qwen3", "qwen3_14b"), "qwen3-32b": ("qwen3", "qwen3_32b"),
    "qwen3-30b-a3b": ("qwen3", "qwen3_30b_a3b"),
    "deepseek-v3": ("deepseek_v3", "deepseek_v3_671b"), "deepseek-r1": ("deepseek_v3", "deepseek_v3_671b"),
}


def reason(s: Setup) -> str | None:
    m = s.model
    why = dropless_reason(s, "torchtitan 0.3's MoE dispatchers (none drops tokens)") or windowed_reason(
        s, "torchtitan", "torchtitan 0.3 ships models/gpt_oss, a Python config trainready does not emit")
    if why:
        return why
    if s.method != "full":
        return (f"torchtitan 0.3 has no {s.method} on its command line (LoRA is a model converter in a "
                f"Python config; no 4-bit base); use --framework deepspeed (PEFT)")
    if s.pp > 1 and s.grad_accum < s.pp:
        return (f"{s.grad_accum} micro-batch(es) per step for pp {s.pp}: torch.distributed.pipelining's Schedule1F1B "
                f"needs at least as many as stages (a larger global batch), or --framework megatron")
    if m.norm != "rmsnorm" or m.position != "rope" or m.mlp != "swiglu" or m.qkv_bias:
        what = ("LayerNorm" if m.norm != "rmsnorm" else f"{m.position} positions" if m.position != "rope"
                else f"a {m.mlp} MLP" if m.mlp != "swiglu" else "QKV biases")
        # Megatron has neither ALiBi nor GeGLU (megatron.reason); transformers' plans have GeGLU (Gemma)
        alt = ("deepspeed" if m.position == "alibi" else "deepspeed or hf-tp" if m.mlp == "geglu"
               else "deepspeed or megatron")
        return (f"torchtitan implements Llama 3/Qwen3/DeepSeek-V3-style blocks (RMSNorm, RoPE, SwiGLU, no "
                f"biases); {m.name} has {what}: use --framework {alt}")
    if s.strategy in ("zero1", "zero2"):
        alt = "deepspeed or megatron" if s.strategy == "zero1" else "deepspeed"
        return (f"torchtitan shards with FSDP2 (ZeRO-3) or replicates (DDP), no {s.strategy}: "
                f"--framework {alt}")
    if s.offload == "optimizer":
        return ("torchtitan's CPU offload (training.enable_cpu_offload) moves parameters, gradients and "
                "optimizer states; the optimizer alone: --framework deepspeed")
    if s.precision not in ("bf16", "fp32"):  # DeepSpeed has fp16 but no fp8 of its own (deepspeed.reason)
        return (f"torchtitan's mixed_precision_param is bfloat16 or float32, not {s.precision} (float8 is a "
                f"model converter in a Python config); use --framework "
                f"{'megatron' if s.precision == 'fp8' else 'megatron or deepspeed'}")
    if s.reduce_dtype != "fp32":  # `plan` has no --reduce-dtype: the stack (or estimate's flag) sets it
        return (f"torchtitan reduces gradients in float32 only (training.mixed_precision_reduce), this row in "
                f"{s.reduce_dtype} (stack {s.stack}): use --stack torchtitan or --framework deepspeed")
    if s.ep > 1 and s.strategy == "ddp":
        return ("torchtitan carves expert parallelism out of the FSDP and TP ranks (efsdp = dp_shard x tp / ep, "
                "ParallelDims.build_mesh); replicated ddp has no dp_shard ranks: --framework megatron")
    why = expert_tp_reason(s, "torchtitan 0.3", "ParallelDims' sparse mesh: efsdp = dp_shard x cp x tp / ep, no "
                                               "expert_tensor_parallel_degree")
    if why:
        return why
    if checkpointing(s) == "selective-attn":
        return ("torchtitan's selective checkpointing is op-level (selective-op), not Megatron's attention "
                "recompute; use --framework megatron or --activation-checkpointing selective-op")
    if s.pp_virtual > 1 and layers_per_stage(s) is None:
        n = s.pp * s.pp_virtual
        return (f"torchtitan makes ceil({m.num_layers} / pipeline_parallel_layers_per_stage) stages: no whole "
                f"number of layers per stage gives {n} (pp {s.pp} x {s.pp_virtual} virtual); use --framework "
                f"megatron (--pipeline-model-parallel-layout) or another --pp-virtual")
    if s.ep > 1 and s.ep_dispatcher == "deepep":
        return ("torchtitan 0.3 picks DeepEP/HybridEP in the model's Python config (model_registry(..., "
                "moe_comm_backend='deepep')), not on its command line; use --framework megatron")
    if s.ep > 1 and s.ep_overlap:
        return ("torchtitan 0.3 has no all-to-all overlap on its command line for the 1F1B schedules; use "
                "--framework megatron (--overlap-moe-expert-parallel-comm)")
    return None


def layers_per_stage(s: Setup) -> int | None:
    """torchtitan's pipeline_parallel_layers_per_stage for pp x v stages: it makes ceil(layers / it) stages
    and splits the layers evenly over them, the extra ones first (distributed/pipeline_parallel.py), which
    is setup.pipeline_ranks' split; None: no value gives exactly pp x v stages."""
    n, layers = s.pp * s.pp_virtual, s.model.num_layers
    return next((k for k in range(1, layers + 1) if -(-layers // k) == n), None)


def module_config(s: Setup) -> tuple[str, str, bool]:
    """(module, config function, whether torchtitan ships it)."""
    m = s.model
    for key in (m.name, *m.aliases):
        hit = CONFIGS.get(key.lower())
        if hit:
            return (*hit, True)
    slug = re.sub(r"[^a-z0-9]+", "_", m.name.lower()).strip("_") or "model"
    return "trainready_models", slug if slug[0].isalpha() else f"m_{slug}", False


def overrides(s: Setup) -> list[tuple[str, object]]:
    """The command-line overrides that make torchtitan run exactly this setup."""
    replicate, shard = (s.dp, 1) if s.strategy == "ddp" else (1, s.dp)
    a: list[tuple[str, object]] = [
        # the DTensor path for the model-parallel axes: the default spmd_types path stops in fully_shard under
        # torch 2.13.0 ("When dp_mesh_dims is provided, all parameters must be DTensors on the full SPMD mesh",
        # the EP rows on 2 processes in the tests); partial_dtensor trains them
        ("--parallelism.spmd_backend", "partial_dtensor"),
        ("--parallelism.data_parallel_replicate_degree", replicate),
        ("--parallelism.data_parallel_shard_degree", shard),
        ("--parallelism.tensor_parallel_degree", s.tp),
        ("--parallelism.pipeline_parallel_degree", s.pp),
    ]
    if s.cp > 1:  # FSDP then shards over data_parallel_shard_degree x cp (its dp_shard_cp mesh)
        a.append(("--parallelism.context_parallel_degree", s.cp))
    if s.pp > 1:  # local_batch_size is split into pipeline micro-batches of this size
        a += [("--parallelism.pipeline_parallel_microbatch_size", s.micro_batch),
              ("--parallelism.pipeline_parallel_schedule", "Interleaved1F1B" if s.pp_virtual > 1 else "1F1B"),
              # layers split as the estimate splits them (setup.pipeline_split: even, the extra ones first);
              # torchtitan's default counts the embedding and the head as a layer each
              ("--parallelism.pipeline_parallel_first_stage_less_layers", 0),
              ("--parallelism.pipeline_parallel_last_stage_less_layers", 0)]
        if s.pp_virtual > 1:  # pp x v stages, stage i on rank i % pp (stage_ids_this_rank, "loop" style)
            a.append(("--parallelism.pipeline_parallel_layers_per_stage", layers_per_stage(s)))
    if s.model.is_moe:
        a.append(("--parallelism.expert_parallel_degree", s.ep))
    # under PP the trainer calls the schedule once per local batch (Trainer.train_step): the estimate's calls
    local = s.micro_batch * s.schedule_microbatches if s.pp > 1 else s.micro_batch
    a += [("--training.local_batch_size", local), ("--training.global_batch_size", s.global_batch),
          ("--training.seq_len", s.seq_len),
          ("--training.mixed_precision_param", "bfloat16" if s.precision == "bf16" else "float32"),
          ("--training.mixed_precision_reduce", "float32")]
    if s.optimizer_dtype == "bf16":
        a.append(("--training.dtype", "bfloat16"))  # pure bf16: no fp32 master weights
    if s.offload == "optimizer+params":
        a.append(("--training.enable_cpu_offload", True))
    if s.compiled:  # asked, or implied by async TP, which requires --compile.enable (CompileConfig)
        a.append(("--compile.enable", True))  # components default to model and loss (config/configs.py)
    if s.tp > 1 and s.tp_overlap:
        a.append(("--compile.enable_async_tensor_parallel", True))
    if s.pp > 1 or s.ep > 1:  # Trainer.Config refuses CUDA graphs (on by default) with PP and with the
        a.append(("--training.disable_cuda_graphs", True))  # default EP token dispatcher (trainer.py)
    a += [("--checkpoint.enable", True), ("--checkpoint.folder", "checkpoint")]
    return a


def custom_model_note(m, module: str, config: str) -> str:
    """What a config_registry function for a model torchtitan does not ship must hold: the shape,
    experts and latent attention included, after the shipped model family that has those blocks."""
    template = "deepseek_v3" if m.mla is not None else "qwen3" if (m.qk_norm or m.is_moe) else "llama3"
    dims = (f"{m.num_layers} layers, dim {m.hidden_size}, {m.num_heads} heads, {m.num_kv_heads} KV heads"
            + (f", head_dim {m.head_dim}" if m.head_dim and m.mla is None else "")
            + f", FFN {m.ffn_hidden_size}, vocab {m.vocab_size}" + (", tied embeddings" if m.tied_embeddings else "")
            + (", RMSNorm on q and k" if m.qk_norm else ", no RMSNorm on q and k" if template == "qwen3" else ""))
    if m.rope_theta is not None:
        sc = m.rope_scaling
        dims += f"; RoPE theta {m.rope_theta:g}" + (f", {sc.type} scaling factor {sc.factor:g}" if sc else
                                                      ", no RoPE scaling")
    if m.mla is not None:
        a = m.mla
        dims += (f"; latent attention: q_lora_rank {a.q_lora_rank or 0}, kv_lora_rank {a.kv_lora_rank}, "
                 f"qk_nope_head_dim {a.qk_nope_head_dim}, qk_rope_head_dim {a.qk_rope_head_dim}, "
                 f"v_head_dim {a.v_head_dim}")
    if m.moe is not None:
        e = m.moe
        dims += (f"; MoE: {e.num_experts} routed experts of FFN {e.expert_ffn_hidden_size}, top-{e.experts_per_token}"
                 + (f", shared experts of FFN {e.shared_width}" if e.num_shared_experts else "")
                 + (f", the first {e.first_dense_layers} layers dense" if e.first_dense_layers else "")
                 + (f", every {e.layer_freq}th layer MoE" if e.layer_freq > 1 else ""))
    return (f"torchtitan ships no config for {m.name}: write {module}/config_registry.py with "
            f"`def {config}() -> Trainer.Config` after torchtitan/models/{template}/config_registry.py, with {dims}; "
            f"its hf_assets_path names the model's tokenizer (torchtitan's scripts/download_hf_assets.py) and its "
            f"dataloader your data (the shipped configs' c4_test lives in torchtitan's source tree only)")


def ac_mode(s: Setup) -> str:
    return {"none": "none", "full": "full", "selective-op": "selective"}[checkpointing(s)]


def recipe(s: Setup) -> Recipe:
    module, config, shipped = module_config(s)
    env, notes = environment(s)
    args = args_lines(overrides(s)) + f"\nactivation_checkpoint:{ac_mode(s)}"
    program = f"-m torchtitan.train --module {module} --config {config} $(cat {ARGS_FILE})"
    notes.insert(0, f"torchtitan {VERSION}: save the config as {ARGS_FILE}; the subcommand "
                    f"activation_checkpoint:... stays last. It needs a PyTorch newer than 2.13.0 (the nightly its "
                    f"README recommends): after the first step it calls torch.distributed.set_timeout, which 2.13.0 "
                    f"lacks. --parallelism.spmd_backend partial_dtensor: the default spmd_types stopped in "
                    f"fully_shard under torch 2.13.0 where partial_dtensor trained (trainready's tests); torchtitan "
                    f"calls its DTensor backends deprecated (models/llama3/config_registry.py), so on a newer torch "
                    f"try the default by dropping that line")
    if not shipped:
        notes.append(custom_model_note(s.model, module, config))
    if s.strategy == "ddp":
        notes.append("data_parallel_shard_degree 1 with replicate degree = dp: replicated weights (DDP-like, "
                     "torchtitan applies it through fully_shard's HSDP mesh)")
    if s.tp > 1:
        notes.append("tensor parallel with sequence parallel (torchtitan's default enable_sequence_parallel)")
    if s.tp > 1 and s.tp_overlap:
        notes.append("async TP needs torch.compile (CompileConfig): model and loss compiled, as estimated")
    notes.append(batch_note(s))
    return Recipe(framework=NAME, torchrun=torchrun(s, program), env=env, config_kind="torchtitan-args",
                  config_file=ARGS_FILE, config=args, notes=notes)
