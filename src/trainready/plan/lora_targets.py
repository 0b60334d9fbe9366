"""Which linear layers LoRA adapts (`--lora-targets`), as the frameworks name them.

The planner names one block's linear layers q, k, v, o (attention; qkv where the model's Hugging Face code fuses
them, GPT-2, MPT, BLOOM, Falcon, GPT-NeoX: one module, one adapter; multi-head latent attention: q or q_a and q_b,
kv_a, kv_b, o) and gate, up, down (the dense MLP, or a MoE model's shared experts: LoRA on routed experts is not
modelled). Users write the names of their framework; each maps onto those:

* Hugging Face PEFT (`LoraConfig.target_modules`): q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj;
  DeepSeek's q_a_proj, q_b_proj, kv_a_proj_with_mqa, kv_b_proj; and its keyword all-linear.
* Megatron-Core PEFT in Megatron-Bridge and NeMo 2 (`LoRA.target_modules`, megatron/bridge/peft/lora.py): linear_qkv
  (the fused q, k and v projection), linear_proj, linear_fc1 (gate and up, fused), linear_fc2; latent attention's
  linear_q_proj, linear_q_down_proj, linear_q_up_proj, linear_kv_down_proj, linear_kv_up_proj. Their default is
  all four of the dense names; the DGX Cloud and Megatron-Bridge performance recipes set ["linear_qkv"].
* the fused families' and OPT's own names (c_attn, Wqkv, query_key_value, out_proj, fc1, fc2, ...), and torchtune's
  output_proj.
* groups: attention, mlp, all-linear (the default: every linear layer, as before this option existed).

A fused module's adapter (Megatron's linear_qkv: one A of hidden x r, one B of r x (q + 2 kv)) is counted as
adapters on its parts (three A matrices): the difference is r x hidden x 2 parameters per block, and the time and
activation bytes of the adapters follow their outputs, which are the same.

`check_dropout` holds `--lora-dropout` to LoRA and QLoRA; where the dropout sits is the stack's
(Stack.lora_dropout_position), what it costs activations.lora_dropout_bytes and performance._adapter_time."""

from __future__ import annotations

from trainready.errors import UsageError, closest, printable

from .model_spec import ModelSpec
from .stacks import STACKS, Stack

ALL_LINEAR = "all-linear"
QKV = ("q", "k", "v", "qkv")  # a name for any of q, k, v adapts the fused module where the model has one
ATTENTION = ("q", "k", "v", "qkv", "q_a", "q_b", "kv_a", "kv_b", "o")
MLP = ("gate", "up", "down")
FC1 = ("gate", "up")  # Megatron's linear_fc1 and its kin: gate and up fused, or up alone where not gated

ALIASES: dict[str, tuple[str, ...]] = {
    **{n: (n,) for n in ATTENTION + MLP}, "q": ("q", "qkv"), "k": ("k", "qkv"), "v": ("v", "qkv"), "qkv": QKV,
    # Hugging Face PEFT (Llama-style and DeepSeek code)
    "q_proj": ("q", "qkv"), "k_proj": ("k", "qkv"), "v_proj": ("v", "qkv"), "o_proj": ("o",),
    "gate_proj": ("gate",), "up_proj": ("up",), "down_proj": ("down",),
    "q_a_proj": ("q_a",), "q_b_proj": ("q_b",), "kv_a_proj_with_mqa": ("kv_a",), "kv_b_proj": ("kv_b",),
    # Hugging Face's fused families and OPT
    "c_attn": QKV, "wqkv": QKV, "query_key_value": QKV, "out_proj": ("o",), "dense": ("o",), "attn.c_proj": ("o",),
    "c_fc": FC1, "fc1": FC1, "dense_h_to_4h": FC1, "mlp.c_proj": ("down",), "fc2": ("down",),
    "dense_4h_to_h": ("down",),
    # Megatron-Core (Megatron-Bridge, NeMo 2)
    "linear_qkv": QKV, "linear_proj": ("o",), "linear_fc1": FC1, "linear_fc2": ("down",),
    "linear_q_proj": ("q",), "linear_q_down_proj": ("q_a",), "linear_q_up_proj": ("q_b",),
    "linear_kv_down_proj": ("kv_a",), "linear_kv_up_proj": ("kv_b",),
    # torchtune
    "output_proj": ("o",),
    # groups
    "attention": ATTENTION, "mlp": MLP, ALL_LINEAR: ATTENTION + MLP,
}


_SAID = "--lora-targets (or lora_targets in a job file)"  # where a bad name came from: either


def check_dropout(p: float, method: str) -> float:
    """The adapters' dropout probability (Setup.lora_dropout); any above 0 with full training is a usage error."""
    if p and method == "full":
        raise UsageError(f"LoRA dropout (--lora-dropout, or lora_dropout in a job file) {p!r} applies to --method "
                         "lora or qlora; this job trains every weight (method full): drop it, or --method lora")
    return p


def check_autocast(asked: bool | None, method: str, stack: Stack, precision: str) -> bool | None:
    """The job's --autocast/--no-autocast (Setup.autocast_asked), a usage error where it can change nothing: full
    training (its mixed precision is --optimizer-dtype), a stack whose adapters are in the model's dtype (nothing for
    autocast to cast), the deepspeed stack asked to autocast (its engine runs none) or an fp32 job asked to."""
    if asked is None:
        return None
    flag = "--autocast" if asked else "--no-autocast"
    if method == "full":
        why = ("for full training, mixed precision is --optimizer-dtype (fp32: autocast over fp32 parameters; bf16: "
               "pure bf16): drop it, or --method lora")
    elif not stack.lora_fp32_adapters:
        why = (f"stack {stack.name} keeps its LoRA adapters in the model's dtype, which autocast leaves as they are; "
               f"stacks with PEFT's fp32 adapters: {', '.join(n for n, s in STACKS.items() if s.lora_fp32_adapters)}")
    elif asked and stack.deepspeed_zero_memory:
        why = ("DeepSpeed runs no autocast (accelerate sets native_amp only outside DeepSpeed, whose engine casts the "
               "model itself): drop it, or --stack hf-trainer")
    elif asked and precision == "fp32":
        why = "an fp32 job has no lower precision to autocast to: drop it, or --precision bf16"
    else:
        return asked
    raise UsageError(f"{flag} (or autocast in a job file) is modelled for PEFT's fp32 LoRA adapters (what they save "
                     f"and run in): {why}")


def check_targets(names: list[str] | tuple[str, ...] | None, model: ModelSpec,
                  method: str) -> tuple[str, ...] | None:
    """The linear layers of one block that LoRA adapts, in the model's order; None where `names` is None or names
    every one (Setup.lora_targets), and for full training. A usage error names the bad value and the valid ones."""
    if method == "full":
        if names is not None:
            raise UsageError("LoRA targets (--lora-targets, or lora_targets in a job file) apply to --method lora or "
                             "qlora; this job trains every weight (method full): drop them, or --method lora")
        return None
    if names is None:
        return None
    here = [n for n, _, _ in model.linear_layers()]
    keys = [n.strip().lower() for n in names if n.strip()]
    if not keys:
        raise UsageError(f"{_SAID} names no module: give one or more of {', '.join(here)}, or {ALL_LINEAR}")
    chosen: set[str] = set()
    for key in keys:
        if key not in ALIASES:
            near = closest(key, ALIASES)
            raise UsageError(f"{_SAID}: unknown module {printable(key[:80])}"
                             + (f" (did you mean {', '.join(near)}?)" if near else "")
                             + f"; {printable(model.name)}'s linear layers: {', '.join(here)} (or Hugging Face "
                             f"names such as q_proj, Megatron names such as linear_qkv, or {ALL_LINEAR})")
        found = [n for n in ALIASES[key] if n in here]
        if not found:
            raise UsageError(f"{_SAID} {printable(key[:80])}: {printable(model.name)} has no such linear layer"
                             f"{_why_absent(key, model)}; its linear layers: {', '.join(here)}")
        chosen.update(found)
    if chosen == set(here):
        return None  # every linear layer: the default, said as such (JSON null, PEFT's "all-linear")
    return tuple(n for n in here if n in chosen)


def _why_absent(name: str, model: ModelSpec) -> str:
    if model.mla is not None and set(ALIASES[name]) & set(QKV):
        return " (multi-head latent attention)"
    if set(ALIASES[name]) <= set(MLP) and model.moe is not None:
        return " (its MLPs are routed experts, and LoRA on routed experts is not modelled)"
    if ALIASES[name] == ("gate",):
        return " (its MLP is not gated: up and down)"
    return ""


# Hugging Face module names of the planner's, per family (default: Llama-style and DeepSeek code). PEFT matches a name
# as the suffix of a module's path: a MoE model's shared-expert MLP is named with its parent, which keeps the routed
# experts (transformers 5 fuses them into 3D parameters that a bare gate_proj would match) and the dense layers' MLPs
# out, as the estimate leaves them out
HF_NAMES = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj", "gate": "gate_proj", "up": "up_proj",
            "down": "down_proj", "q_a": "q_a_proj", "q_b": "q_b_proj", "kv_a": "kv_a_proj_with_mqa",
            "kv_b": "kv_b_proj"}
_QKV_DENSE = {"qkv": "query_key_value", "o": "dense", "up": "dense_h_to_4h", "down": "dense_4h_to_h"}
FAMILY_NAMES = {"gpt": {"qkv": "c_attn", "o": "attn.c_proj", "up": "c_fc", "down": "mlp.c_proj"},
                "mpt": {"qkv": "Wqkv", "o": "out_proj", "up": "up_proj", "down": "down_proj"},
                "bloom": _QKV_DENSE, "falcon": _QKV_DENSE, "gpt_neox": _QKV_DENSE,
                "opt": {**HF_NAMES, "o": "out_proj", "up": "fc1", "down": "fc2"}}
SHARED_EXPERT = {"qwen2_moe": "shared_expert."}  # others (DeepSeek V2/V3, Kimi K2): shared_experts.


def peft_target_modules(targets: tuple[str, ...] | None, model: ModelSpec) -> str:
    """`LoraConfig(target_modules=...)` for the adapted layers, as a Python literal ("all-linear": every one)."""
    if not targets:
        return repr(ALL_LINEAR)
    names = FAMILY_NAMES.get(model.family, HF_NAMES)
    shared = SHARED_EXPERT.get(model.family, "shared_experts.") if model.moe is not None else ""
    return repr([(shared if n in MLP else "") + names[n] for n in targets])
