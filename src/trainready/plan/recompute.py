"""Megatron-Core's fine-grained recomputation (`--recompute-granularity selective --recompute-modules ...`):
which modules a job names, what each one stops saving for backward, and what backward runs again.

Source: Megatron-LM megatron/core/transformer/transformer_config.py `recompute_modules` (d98e8a6, 2026-08; the
list since Core 0.13, 2025-07), with the modules' own code:

* core_attn (the default): the attention core is checkpointed; FlashAttention/cuDNN keep only Q, K, V and the
  output, which their neighbours save anyway, so it frees nothing and runs the attention forward again.
* mla_up_proj (multi_latent_attention.py, CheckpointWithoutOutput around `qkv_up_proj_and_rope_apply`): the
  up projections' and RoPE's outputs (the attention's Q, K and V) are dropped once the attention has run and
  rebuilt before its backward from the compressed latents the checkpoint keeps; the up projections no longer
  keep their normalized inputs either. Runs the up-projection GEMMs again.
* layernorm (transformer_layer.py): the input norm and the pre-MLP norm where they are modules of their own
  (MLA's input norm; a MoE layer's pre-MLP norm; GQA attention and dense MLPs fuse theirs into
  TELayerNormColumnParallelLinear, which this leaves alone); under FP8 the next linear then saves the
  recomputed original input instead of its FP8 copy (`set_save_original_input`): the normalized output is
  freed, 1 byte per element under FP8, 2 under BF16.
* mlp: a dense layer's MLP under torch checkpointing: it keeps its input only (the residual stream, which the
  fused norm keeps anyway) and runs again; MoE layers are left to `moe`.
* moe_act (experts.py, CheckpointWithoutOutput around the activation): the activation's output, the second
  expert GEMM's input, is dropped and recomputed: one element per routed row and expert width.
* shared_experts: the shared experts' MLP under torch checkpointing.
* moe: the whole MoE layer under torch checkpointing: router, dispatch, experts and combine run again, the
  all-to-alls included; it keeps the layer's input.
"""

from __future__ import annotations

from trainready.errors import UsageError, printable

from .activations import act_output_bytes, mlp_bytes_per_token, norm_output_bytes
from .model_spec import ModelSpec

MODULES = ("core_attn", "mla_up_proj", "layernorm", "mlp", "moe_act", "shared_experts", "moe")
"""What trainready models of Megatron's list (the Gated DeltaNet and hyper-connection modules are left out)."""
MOE_MODULES = ("moe_act", "shared_experts", "moe")
DEFAULT_MODULES = ("core_attn",)
"""Megatron's default: `--recompute-granularity selective` alone recomputes the attention core."""


PUBLISHED_ALIASES = {"norm": "layernorm", "rmsnorm": "layernorm", "act": "moe_act", "shared_expert": "shared_experts"}
"""Short names publications use for Megatron's modules (the Megatron-MoE-ModelZoo tables write "norm, act" for the
`--recompute-modules layernorm moe_act` of their commands)."""


def published_modules(text: str) -> list[str]:
    """Megatron module names from a published list ("selective:norm,act" or "layernorm, moe_act")."""
    names = text.split(":", 1)[-1].replace(" ", "").split(",")
    return [PUBLISHED_ALIASES.get(n, n) for n in names if n]


def check_modules(names: list[str] | tuple[str, ...] | None, model: ModelSpec, *, stack: str, checkpointing: str,
                  asked: str, method: str) -> tuple[str, ...]:
    """The modules a setup recomputes, in Megatron's order: the job's (validated as Megatron validates them), else
    the default for Megatron-style selective recompute, else none. A usage error names the bad value and the valid
    ones."""
    if names is None:
        return DEFAULT_MODULES if checkpointing == "selective-attn" else ()
    if stack != "megatron":
        raise UsageError(f"--recompute-modules is Megatron-Core's (--recompute-modules of --recompute-granularity "
                         f"selective); stack {printable(stack)} has no such list: use --stack megatron, or drop it")
    if checkpointing != "selective-attn":
        raise UsageError(f"--recompute-modules needs --activation-checkpointing selective (Megatron's "
                         f"--recompute-granularity selective); this job asks for {printable(asked)}")
    if method != "full":  # frozen linears save no inputs for weight gradients: what a module frees is not counted
        raise UsageError(f"--recompute-modules is modelled for full training, not {printable(method)}: use "
                         f"--activation-checkpointing selective (the attention core) or full")
    if not names:
        raise UsageError("--recompute-modules names no module: give one or more of " + ", ".join(MODULES)
                         + ", or --activation-checkpointing none")
    unknown = [n for n in names if n not in MODULES]
    if unknown:
        raise UsageError(f"--recompute-modules: unknown module {printable(unknown[0][:80])}; valid: "
                         f"{', '.join(MODULES)}")
    here = ", ".join(m for m in MODULES if (m != "mla_up_proj" or model.mla is not None)
                     and (m not in MOE_MODULES or model.moe is not None))
    if "mla_up_proj" in names and model.mla is None:  # TransformerConfig.__post_init__ refuses it too
        raise UsageError(f"--recompute-modules mla_up_proj needs multi-latent attention; {printable(model.name)} "
                         f"has none (valid here: {here})")
    moe_only = [n for n in names if n in MOE_MODULES]
    if moe_only and model.moe is None:
        raise UsageError(f"--recompute-modules {moe_only[0]} needs a mixture-of-experts model; "
                         f"{printable(model.name)} is dense (valid here: {here})")
    return tuple(m for m in MODULES if m in names)


def modules_text(modules: tuple[str, ...]) -> str:
    """How outputs name Megatron-style selective recompute: the attention core alone keeps its old name."""
    if modules == DEFAULT_MODULES:
        return "selective-attn"
    return "selective (" + ", ".join(modules) + ")"


def norm_modules(model: ModelSpec, moe_layer: bool) -> int:
    """Norms of one layer that are modules of their own, which `layernorm` recomputes (module docstring)."""
    return (1 if model.mla is not None else 0) + (1 if moe_layer else 0)


def up_proj_params(model: ModelSpec) -> int:
    """Weights `mla_up_proj` runs again per token: the q and kv up projections, or without a q latent
    (DeepSeek-V2-Lite) the whole q projection, which `qkv_up_proj_and_rope_apply` then holds."""
    a, h = model.mla, model.num_heads
    q_in = a.q_lora_rank or model.hidden_size
    return q_in * h * a.qk_head_dim + a.kv_lora_rank * h * (a.qk_nope_head_dim + a.v_head_dim)


def up_proj_saved_elements(model: ModelSpec) -> int:
    """Elements per token `mla_up_proj` stops saving: Q and K (heads x qk_head_dim), V (heads x v_head_dim) and the
    normalized latents the up projections kept (activations._attention_saved counts the latents twice)."""
    a, h = model.mla, model.num_heads
    return 2 * h * a.qk_head_dim + h * a.v_head_dim + (a.q_lora_rank or 0) + a.kv_lora_rank


def freed_per_token(modules: tuple[str, ...], model: ModelSpec, *, moe_layer: bool, kernels: str, act_bytes: int,
                    fp8_saved: bool, routed_rows: float = 0.0, moe_saved: float = 0.0) -> float:
    """Bytes per token (before the TP split) one layer stops saving under `modules` (module docstring).
    `routed_rows`: routed rows per token (moe.busy_rows; expert TP splits their width as it splits the stand-in
    MLP's, and the caller divides by tp); `moe_saved`: what the MoE part of a MoE
    layer saves beyond its input (its MLP, routing and routed rows: moe.moe_layer_bytes_per_token)."""
    a, d = act_bytes, model.hidden_size
    freed = 0.0
    if "mla_up_proj" in modules and model.mla is not None:
        freed += a * up_proj_saved_elements(model)
    if "layernorm" in modules:
        freed += norm_modules(model, moe_layer) * norm_output_bytes(a, fp8_saved) * d
    if not moe_layer:
        if "mlp" in modules:  # the MLP and the normalized input its fused fc1 kept
            freed += (mlp_bytes_per_token(model, model.ffn_hidden_size, kernels=kernels, act_bytes=a, fp8_saved=fp8_saved)
                      + norm_output_bytes(a, fp8_saved) * d)
        return freed
    moe = model.moe
    if "moe" in modules:
        return freed + moe_saved
    if "moe_act" in modules:
        freed += routed_rows * moe.expert_ffn_hidden_size * act_output_bytes(a, fp8_saved)
    if "shared_experts" in modules and moe.shared_width:
        freed += mlp_bytes_per_token(model, moe.shared_width, kernels=kernels, act_bytes=a, fp8_saved=fp8_saved)
    return freed
