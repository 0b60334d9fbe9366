"""Mixture-of-experts Hugging Face configs: mixtral, qwen2_moe, qwen3_moe, deepseek_v2/deepseek_v3, gpt_oss.

Each parser takes the config (hf_config._Config) and the dense fields the shared Llama-style
reader made of it, and adds the `moe` (and for DeepSeek the `mla`) sub-shape. Layer layouts
follow the Hugging Face modeling code (transformers 5.x, modeling_<type>.py):

* mixtral: every layer MoE; `num_local_experts` experts of `intermediate_size`, top
  `num_experts_per_tok`; the router is hidden x experts without bias.
* qwen2_moe: layer i is MoE when i is not in `mlp_only_layers` and (i + 1) % `decoder_sparse_step`
  == 0; routed experts of `moe_intermediate_size`, one shared expert of
  `shared_expert_intermediate_size` with a sigmoid gate hidden -> 1; q/k/v biases (`qkv_bias`).
* qwen3_moe: as qwen2_moe without the shared expert, with per-head RMSNorm on q and k.
* deepseek_v2/v3: multi-head latent attention; the first `first_k_dense_replace` layers dense
  (`intermediate_size`), the rest MoE with `n_shared_experts` x `moe_intermediate_size` shared width;
  DeepSeek-V3's router carries `e_score_correction_bias` (one per expert). The
  `num_nextn_predict_layers` multi-token-prediction modules are noted, not counted (the published
  totals, 671B for V3, exclude them).
* gpt_oss: every layer MoE (`num_local_experts`, top `num_experts_per_tok`, experts of
  `intermediate_size` with biases, a biased router); q/k/v/o biases and a sink logit per head;
  `layer_types` alternates a `sliding_window` of 128 and full attention.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainready.errors import UsageError, printable

if TYPE_CHECKING:
    from .hf_config import _Config


def _dense_prefix(c: "_Config") -> int:
    """`mlp_only_layers` as a count of leading dense layers; other layouts are refused."""
    layers = c.get("mlp_only_layers", [], "list")
    if any(type(i) is not int or i < 0 for i in layers):
        raise UsageError(f"{c.path}: '{c.prefix}mlp_only_layers' must be a list of layer numbers (0 or more) "
                         f"(model_type '{printable(c.model_type)}')")
    n = len(set(layers))
    total = c.need("num_hidden_layers")
    if n and max(layers) >= total:
        raise UsageError(f"{c.path}: '{c.prefix}mlp_only_layers' names layer {max(layers)}; "
                         f"'{c.prefix}num_hidden_layers' is {total}: layers are 0..{total - 1} (model_type "
                         f"'{printable(c.model_type)}')")
    if n >= total:
        raise UsageError(f"{c.path}: '{c.prefix}mlp_only_layers' makes all {total} layers dense: a "
                         f"mixture-of-experts model needs a MoE layer (model_type '{printable(c.model_type)}')")
    if sorted(set(layers)) != list(range(n)):
        raise UsageError(f"{c.path}: mlp_only_layers {sorted(set(layers))[:8]} puts dense layers between MoE "
                         f"layers; only leading dense layers (0, 1, ...) are modelled (model_type "
                         f"'{printable(c.model_type)}')")
    return n


def _routing(c: "_Config", experts_key: str) -> tuple[int, int]:
    """(routed experts, top-k), top-k checked against the experts under the config's own key names."""
    experts, k = c.need(experts_key), c.need("num_experts_per_tok")
    if k > experts:
        raise UsageError(f"{c.path}: '{c.prefix}num_experts_per_tok' {k} is more than '{c.prefix}{experts_key}' "
                         f"{experts}: each token goes to 1..{experts} experts (model_type "
                         f"'{printable(c.model_type)}')")
    return experts, k


# What transformers 5.23 builds when config.json leaves a key out (the field defaults of
# configuration_deepseek_v2.py and configuration_deepseek_v3.py; KV heads: hf_config.ABSENT_KV_HEADS). An
# explicit null differs: a null q_lora_rank is a full-rank q_proj (DeepSeek-V2-Lite).
_ABSENT_SHARED_EXPERTS = {"deepseek_v2": 2, "deepseek_v3": 1}
_ABSENT_Q_LORA_RANK = 1536


def mixtral(c: "_Config", base: dict[str, Any]) -> dict:
    experts, k = _routing(c, "num_local_experts")
    return {**base, "moe": dict(num_experts=experts, experts_per_token=k, expert_ffn_hidden_size=base["ffn_hidden_size"])}


def _qwen_moe(c: "_Config", base: dict[str, Any], shared: bool) -> dict:
    step, layers = c.get("decoder_sparse_step", 1), c.need("num_hidden_layers")
    if step > layers:  # layer i is MoE when (i + 1) % step == 0
        raise UsageError(f"{c.path}: '{c.prefix}decoder_sparse_step' {step} leaves no MoE layer in "
                         f"'{c.prefix}num_hidden_layers' {layers}: it can be 1..{layers} (model_type "
                         f"'{printable(c.model_type)}')")
    experts, k = _routing(c, "num_experts")
    moe: dict[str, Any] = dict(num_experts=experts, experts_per_token=k,
                               expert_ffn_hidden_size=c.need("moe_intermediate_size"),
                               layer_freq=step, first_dense_layers=_dense_prefix(c))
    if shared:
        moe.update(num_shared_experts=1, shared_ffn_hidden_size=c.need("shared_expert_intermediate_size"),
                   shared_expert_gate=True)
    return {**base, "moe": moe}


def qwen2_moe(c: "_Config", base: dict[str, Any]) -> dict:
    bias = c.get("qkv_bias", True, "bool")  # Qwen2MoeConfig.qkv_bias, default true; o_proj has none
    return {**_qwen_moe(c, base, shared=True), "qkv_bias": bias, "out_bias": False, "mlp_bias": False}


def qwen3_moe(c: "_Config", base: dict[str, Any]) -> dict:
    return {**_qwen_moe(c, base, shared=False), "qk_norm": True, "mlp_bias": False}


def deepseek(c: "_Config", family: str) -> dict:
    heads = c.need("num_attention_heads")
    freq = c.get("moe_layer_freq", 1)
    if freq != 1:
        raise UsageError(f"{c.path}: moe_layer_freq {freq} (MoE only on every {freq}th layer) is not modelled; "
                         f"DeepSeek-V2/V3 use 1 (model_type '{printable(c.model_type)}')")
    bias = c.get("attention_bias", False, "bool")
    if c.get("mlp_bias", False, "bool"):
        raise UsageError(f"{c.path}: mlp_bias true is not modelled for DeepSeek MoE layers (model_type "
                         f"'{printable(c.model_type)}')")
    shared = c.get("n_shared_experts", _ABSENT_SHARED_EXPERTS[family], "index")
    expert = c.need("moe_intermediate_size")
    experts, k = _routing(c, "n_routed_experts")
    dense, layers = c.need("first_k_dense_replace", kind="index"), c.need("num_hidden_layers")
    if dense >= layers:
        raise UsageError(f"{c.path}: '{c.prefix}first_k_dense_replace' {dense} leaves no MoE layer in "
                         f"'{c.prefix}num_hidden_layers' {layers}: it can be 0..{layers - 1} (model_type "
                         f"'{printable(c.model_type)}')")
    moe = dict(num_experts=experts, experts_per_token=k,
               expert_ffn_hidden_size=expert, num_shared_experts=shared,
               first_dense_layers=dense,
               # DeepSeek-V3's router: weight plus e_score_correction_bias (transformers DeepseekV3TopkRouter)
               router_bias=family == "deepseek_v3",
               mtp_layers=c.get("num_nextn_predict_layers", 0, "index"))
    q_rank = c.get("q_lora_rank", None) if "q_lora_rank" in c.data else _ABSENT_Q_LORA_RANK
    mla = dict(q_lora_rank=q_rank, kv_lora_rank=c.need("kv_lora_rank"),
               qk_nope_head_dim=c.need("qk_nope_head_dim"), qk_rope_head_dim=c.need("qk_rope_head_dim"),
               v_head_dim=c.need("v_head_dim"))
    return dict(family=family, vocab_size=c.need("vocab_size"), hidden_size=c.need("hidden_size"),
                num_layers=c.need("num_hidden_layers"), num_heads=heads, num_kv_heads=heads,
                ffn_hidden_size=c.need("intermediate_size"), tied_embeddings=c.get("tie_word_embeddings", False, "bool"),
                max_seq_len=c.get("max_position_embeddings", None), qkv_bias=bias, out_bias=bias, moe=moe, mla=mla)


def _full_attention_every(c: "_Config", layers: int) -> tuple[int | None, bool]:
    """(full_attention_every, any window) from `layer_types` (transformers' default for gpt_oss: sliding on
    even blocks, full on odd ones). A list must say "sliding_attention" or "full_attention" for every block,
    with the full ones every n-th (i + 1 a multiple of n) or none of them."""
    types = c.get("layer_types", None, "list")
    if types is None:
        return 2, True
    if len(types) != layers or any(t not in ("sliding_attention", "full_attention") for t in types):
        raise UsageError(f"{c.path}: '{c.prefix}layer_types' must name 'sliding_attention' or 'full_attention' for "
                         f"each of the {layers} layers (model_type '{printable(c.model_type)}')")
    full = [i for i, t in enumerate(types) if t == "full_attention"]
    if len(full) == layers:
        return None, False
    if not full:
        return None, True
    every = full[0] + 1
    if full != [i for i in range(layers) if (i + 1) % every == 0]:
        raise UsageError(f"{c.path}: '{c.prefix}layer_types' puts full attention on layers {full[:8]}: only every "
                         f"n-th layer (n, 2n, ... counting from 1) is modelled (model_type "
                         f"'{printable(c.model_type)}')")
    return every, True


def gpt_oss(c: "_Config", base: dict[str, Any]) -> dict:
    """transformers 5.23 modeling_gpt_oss.py: q/k/v/o biases (attention_bias, default true), a sink logit per
    head, GptOssExperts with gate_up and down biases, GptOssTopKRouter with a bias; head_dim defaults to 64."""
    experts, k = _routing(c, "num_local_experts")
    every, windowed = _full_attention_every(c, base["num_layers"])
    bias = c.get("attention_bias", True, "bool")
    return {**base, "head_dim": c.get("head_dim", 64), "qkv_bias": bias, "out_bias": bias, "mlp_bias": True,
            "attention_sinks": True, "sliding_window": c.get("sliding_window", 128) if windowed else None,
            "full_attention_every": every,
            "moe": dict(num_experts=experts, experts_per_token=k, expert_ffn_hidden_size=base["ffn_hidden_size"],
                        router_bias=True)}
