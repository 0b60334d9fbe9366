"""Which linear layers LoRA adapts (`--lora-targets`), as the frameworks name them.

The planner names one block's linear layers q, k, v, o (attention; multi-head latent attention: q or q_a and q_b,
kv_a, kv_b, o) and gate, up, down (the dense MLP, or a MoE model's shared experts: LoRA on routed experts is not
modelled). Users write the names of their framework; each maps onto those:

* Hugging Face PEFT (`LoraConfig.target_modules`): q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj;
  DeepSeek's q_a_proj, q_b_proj, kv_a_proj_with_mqa, kv_b_proj; and its keyword all-linear.
* Megatron-Core PEFT in Megatron-Bridge and NeMo 2 (`LoRA.target_modules`, megatron/bridge/peft/lora.py): linear_qkv
  (the fused q, k and v projection), linear_proj, linear_fc1 (gate and up, fused), linear_fc2; latent attention's
  linear_q_proj, linear_q_down_proj, linear_q_up_proj, linear_kv_down_proj, linear_kv_up_proj. Their default is
  all four of the dense names; the DGX Cloud and Megatron-Bridge performance recipes set ["linear_qkv"].
* torchtune's output_proj (its name for o).
* groups: attention, mlp, all-linear (the default: every linear layer, as before this option existed).

A fused module's adapter (Megatron's linear_qkv: one A of hidden x r, one B of r x (q + 2 kv)) is counted as
adapters on its parts (three A matrices): the difference is r x hidden x 2 parameters per block, and the time and
activation bytes of the adapters follow their outputs, which are the same."""

from __future__ import annotations

from trainready.errors import UsageError, closest, printable

from .model_spec import ModelSpec

ALL_LINEAR = "all-linear"
ATTENTION = ("q", "k", "v", "q_a", "q_b", "kv_a", "kv_b", "o")
MLP = ("gate", "up", "down")

ALIASES: dict[str, tuple[str, ...]] = {
    **{n: (n,) for n in ATTENTION + MLP},
    # Hugging Face PEFT
    "q_proj": ("q",), "k_proj": ("k",), "v_proj": ("v",), "o_proj": ("o",),
    "gate_proj": ("gate",), "up_proj": ("up",), "down_proj": ("down",),
    "q_a_proj": ("q_a",), "q_b_proj": ("q_b",), "kv_a_proj_with_mqa": ("kv_a",), "kv_b_proj": ("kv_b",),
    # Megatron-Core (Megatron-Bridge, NeMo 2)
    "linear_qkv": ("q", "k", "v"), "linear_proj": ("o",), "linear_fc1": ("gate", "up"), "linear_fc2": ("down",),
    "linear_q_proj": ("q",), "linear_q_down_proj": ("q_a",), "linear_q_up_proj": ("q_b",),
    "linear_kv_down_proj": ("kv_a",), "linear_kv_up_proj": ("kv_b",),
    # torchtune
    "output_proj": ("o",),
    # groups
    "attention": ATTENTION, "mlp": MLP, ALL_LINEAR: ATTENTION + MLP,
}


def check_targets(names: list[str] | tuple[str, ...] | None, model: ModelSpec, method: str) -> tuple[str, ...]:
    """The linear layers of one block that LoRA adapts, in the model's order; () where `names` is None (every one,
    Setup.adapted) and for full training. A usage error names the bad value and the valid ones."""
    here = [n for n, _, _ in model.linear_layers()]
    if method == "full":
        if names is not None:
            raise UsageError("--lora-targets applies to --method lora or qlora; this job trains every weight "
                             "(--method full): drop --lora-targets, or add --method lora")
        return ()
    if names is None:
        return ()
    if not names:
        raise UsageError(f"--lora-targets names no module: give one or more of {', '.join(here)}, or {ALL_LINEAR}")
    chosen: set[str] = set()
    for name in names:
        key = name.strip().lower()
        if key not in ALIASES:
            near = closest(key, ALIASES)
            raise UsageError(f"--lora-targets: unknown module {printable(key[:80])}"
                             + (f" (did you mean {', '.join(near)}?)" if near else "")
                             + f"; {printable(model.name)}'s linear layers: {', '.join(here)} (or Hugging Face "
                             f"names such as q_proj, Megatron names such as linear_qkv, or {ALL_LINEAR})")
        found = [n for n in ALIASES[key] if n in here]
        if not found:
            raise UsageError(f"--lora-targets {printable(key)}: {printable(model.name)} has no such linear layer"
                             f"{_why_absent(key, model)}; its linear layers: {', '.join(here)}")
        chosen.update(found)
    return tuple(n for n in here if n in chosen)


def _why_absent(name: str, model: ModelSpec) -> str:
    if model.mla is not None and set(ALIASES[name]) & {"q", "k", "v"} and name not in ("q", "q_proj", "linear_q_proj"):
        return " (multi-head latent attention: q_a, q_b, kv_a, kv_b and o, or q for a full-rank query)"
    if set(ALIASES[name]) <= set(MLP) and model.moe is not None:
        return " (its MLPs are routed experts, and LoRA on routed experts is not modelled)"
    if ALIASES[name] == ("gate",):
        return " (its MLP is not gated: up and down)"
    return ""


# Hugging Face module names of the planner's: Llama-style and DeepSeek code, and the families whose code fuses q, k
# and v in one module (activations.FUSED_QKV_FAMILIES; PEFT matches a name as the suffix of a module's path)
HF_NAMES = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj", "gate": "gate_proj", "up": "up_proj",
            "down": "down_proj", "q_a": "q_a_proj", "q_b": "q_b_proj", "kv_a": "kv_a_proj_with_mqa",
            "kv_b": "kv_b_proj"}
_QKV_DENSE = {"q": "query_key_value", "k": "query_key_value", "v": "query_key_value", "o": "dense",
              "up": "dense_h_to_4h", "down": "dense_4h_to_h"}
FAMILY_NAMES = {"gpt": {"q": "c_attn", "k": "c_attn", "v": "c_attn", "o": "attn.c_proj", "up": "c_fc",
                        "down": "mlp.c_proj"},
                "mpt": {"q": "Wqkv", "k": "Wqkv", "v": "Wqkv", "o": "out_proj", "up": "up_proj", "down": "down_proj"},
                "bloom": _QKV_DENSE, "falcon": _QKV_DENSE, "gpt_neox": _QKV_DENSE}


def peft_target_modules(targets: tuple[str, ...], model: ModelSpec) -> str:
    """`LoraConfig(target_modules=...)` for the adapted layers, as a Python literal ("all-linear": every one)."""
    if not targets:
        return repr(ALL_LINEAR)
    names = FAMILY_NAMES.get(model.family, HF_NAMES)
    return repr(list(dict.fromkeys(names[n] for n in targets)))
