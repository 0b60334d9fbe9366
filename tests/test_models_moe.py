"""Mixture-of-experts and multi-head-latent-attention shapes: presets against the published
total and activated counts, Hugging Face configs read offline, and the errors for bad ones."""

import json
import math

import pytest
from cloud_stubs import cli_run

from trainready.errors import UsageError
from trainready.plan.hf_config import from_dict
from trainready.plan.model_spec import ModelSpec, MoESpec
from trainready.plan.presets import ModelList, preset

# Published (total, activated) in billions as the publisher printed them. The figures are rounded
# by some (Qwen1.5-MoE: 2.69 -> "2.7B") and cut by others (Qwen3-30B-A3B: 3.353 -> "3.3B"), so a
# count passes when it is within one unit of the last printed digit: 46.7B means 46.6..46.8B.
PUBLISHED = {
    # DeepSeek-V3 Technical Report (arXiv 2412.19437), abstract: 671B total, 37B activated per token
    "deepseek-v3": ("671", "37"),
    "deepseek-r1": ("671", "37"),  # DeepSeek-R1 model card: 671B total, 37B activated
    # Mixtral of Experts (arXiv 2401.04088) section 2.1: 47B total (46.7B on the Mistral AI blog),
    # 13B active (12.9B on the blog, "Mixtral of experts", Dec 2023)
    "mixtral-8x7b": ("46.7", "12.9"),
    "mixtral-8x22b": ("141", "39"),  # Mistral AI, "Cheaper, Better, Faster, Stronger", Apr 2024
    "qwen1.5-moe-a2.7b": ("14.3", "2.7"),  # Qwen blog "Qwen1.5-MoE", model card: 14.3B total, 2.7B activated
    "qwen2-57b-a14b": ("57", "14"),  # Qwen/Qwen2-57B-A14B model card, Qwen2 report (arXiv 2407.10671): 57B, 14B active
    "qwen3-30b-a3b": ("30.5", "3.3"),  # Qwen/Qwen3-30B-A3B model card: 30.5B in total, 3.3B activated
    "qwen3-235b-a22b": ("235", "22"),  # Qwen/Qwen3-235B-A22B model card: 235B in total, 22B activated
}

# Exact totals of the released bf16 checkpoints: the Hugging Face Hub API `safetensors.total` (the
# number of elements in the safetensors files, = model.safetensors.index.json total_size / 2).
EXACT = {
    "mixtral-8x7b": 46_702_792_704,  # mistralai/Mixtral-8x7B-v0.1
    "mixtral-8x22b": 140_620_634_112,  # mistral-community/Mixtral-8x22B-v0.1
    "qwen1.5-moe-a2.7b": 14_315_784_192,  # Qwen/Qwen1.5-MoE-A2.7B
    "qwen2-57b-a14b": 57_408_658_944,  # Qwen/Qwen2-57B-A14B
    "qwen3-30b-a3b": 30_532_122_624,  # Qwen/Qwen3-30B-A3B
    "qwen3-235b-a22b": 235_093_634_560,  # Qwen/Qwen3-235B-A22B (index total_size 470,187,269,120 bytes)
}


def _within_printed_digit(count: int, printed: str) -> bool:
    decimals = len(printed.partition(".")[2])
    return abs(count / 1e9 - float(printed)) < 10 ** -decimals


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_total_and_activated_counts_match_the_published_ones(name):
    m = preset(name)
    total, active = PUBLISHED[name]
    assert m.is_moe
    assert _within_printed_digit(m.param_count(), total), (m.param_count(), total)
    assert _within_printed_digit(m.active_param_count(), active), (m.active_param_count(), active)


@pytest.mark.parametrize("name", sorted(EXACT))
def test_totals_equal_the_released_checkpoints(name):
    assert preset(name).param_count() == EXACT[name]


def test_deepseek_v3_equals_its_fp8_checkpoint_tensor_by_tensor_kind():
    """deepseek-ai/DeepSeek-V3 on the Hub: safetensors.parameters = F8_E4M3 680,571,043,840, BF16
    3,918,786,560, F32 41,555,600 (684,531,386,000 in all). The checkpoint holds the 61 layers plus the
    multi-token-prediction layer 61 (README_WEIGHTS.md), which stores its own copy of the embedding and
    of the output head; FP8 weights carry one fp32 scale per 128 x 128 block (config.json
    quantization_config.weight_block_size) and each MoE layer an fp32 e_score_correction_bias."""
    m = preset("deepseek-v3")
    a, d, h, moe = m.mla, m.hidden_size, m.num_heads, m.moe
    attention = [(a.q_lora_rank, d), (h * a.qk_head_dim, a.q_lora_rank), (a.kv_lora_rank + a.qk_rope_head_dim, d),
                 (h * (a.qk_nope_head_dim + a.v_head_dim), a.kv_lora_rank), (d, h * a.v_head_dim)]

    def mlp(f):
        return [(f, d), (f, d), (d, f)]

    moe_layers = m.num_moe_layers + moe.mtp_layers
    fp8 = (attention * (m.num_layers + moe.mtp_layers) + mlp(m.ffn_hidden_size) * m.num_dense_layers
           + mlp(moe.expert_ffn_hidden_size) * (moe.num_experts + moe.num_shared_experts) * moe_layers)
    assert sum(o * i for o, i in fp8) == 680_571_043_840
    scales = sum(math.ceil(o / 128) * math.ceil(i / 128) for o, i in fp8)
    assert scales + moe.num_experts * moe_layers == 41_555_600
    copies = 2 * m.vocab_size * d  # the MTP layer's embed_tokens and shared_head.head
    assert m.param_count() + m.mtp_param_count() + copies == 684_531_386_000 - scales
    # README_WEIGHTS.md: 671B in the main model; 36.6B activated "including 0.9B for the output head",
    # i.e. without the input embedding (a lookup, not a matmul)
    assert _within_printed_digit(m.active_param_count() - m.vocab_size * d, "36.6")
    assert m.matmul_params() < m.active_param_count() - m.vocab_size * d


def test_layer_bookkeeping_adds_up():
    for name in PUBLISHED:
        m = preset(name)
        layers = [m.layer_params(i) for i in range(m.num_layers)]
        assert sum(layers) == m.blocks_params() and max(layers) == m.block_params()
        assert sum(map(m.is_moe_layer, range(m.num_layers))) == m.num_moe_layers
        assert m.num_moe_layers + m.num_dense_layers == m.num_layers
        assert m.expert_param_count() == m.num_moe_layers * m.moe.num_experts * m.expert_params()
        routed_idle = (m.moe.num_experts - m.moe.experts_per_token) * m.expert_params() * m.num_moe_layers
        assert m.param_count() - m.active_param_count() == routed_idle
    ds = preset("deepseek-v3")
    assert [ds.is_moe_layer(i) for i in range(4)] == [False, False, False, True]
    assert ds.layer_params(0) == ds.attention_params() + ds.dense_mlp_params() + 2 * ds.hidden_size
    assert ds.mlp_params() == ds.dense_mlp_params() == 3 * 7168 * 18432


def test_dense_models_are_unchanged_by_the_moe_fields():
    m = preset("llama-3-8b")
    assert not m.is_moe and m.num_moe_layers == 0 and m.num_dense_layers == m.num_layers
    assert m.active_param_count() == m.param_count() == 8_030_261_248
    assert m.expert_params() == m.router_params() == m.shared_expert_params() == m.moe_mlp_params() == 0
    assert m.blocks_params() == m.num_layers * m.block_params()


# --- Hugging Face configs --------------------------------------------------------------------------
# The presets' config.json values (the repos named in each preset's `source`).
CONFIGS = {
    "deepseek-v3": {
        "model_type": "deepseek_v3", "attention_bias": False, "first_k_dense_replace": 3, "hidden_size": 7168,
        "intermediate_size": 18432, "kv_lora_rank": 512, "max_position_embeddings": 163840,
        "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256,
        "n_shared_experts": 1, "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61,
        "num_key_value_heads": 128, "num_nextn_predict_layers": 1, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64, "tie_word_embeddings": False, "topk_method": "noaux_tc", "v_head_dim": 128,
        "vocab_size": 129280},
    "mixtral-8x7b": {
        "model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336, "max_position_embeddings": 32768,
        "num_attention_heads": 32, "num_experts_per_tok": 2, "num_hidden_layers": 32, "num_key_value_heads": 8,
        "num_local_experts": 8, "tie_word_embeddings": False, "vocab_size": 32000},
    "qwen2-57b-a14b": {
        "model_type": "qwen2_moe", "decoder_sparse_step": 1, "hidden_size": 3584, "intermediate_size": 18944,
        "max_position_embeddings": 131072, "moe_intermediate_size": 2560, "num_attention_heads": 28,
        "num_experts": 64, "num_experts_per_tok": 8, "num_hidden_layers": 28, "num_key_value_heads": 4,
        "shared_expert_intermediate_size": 20480, "tie_word_embeddings": False, "vocab_size": 151936},
    "qwen3-30b-a3b": {
        "model_type": "qwen3_moe", "attention_bias": False, "decoder_sparse_step": 1, "head_dim": 128,
        "hidden_size": 2048, "intermediate_size": 6144, "max_position_embeddings": 40960, "mlp_only_layers": [],
        "moe_intermediate_size": 768, "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8,
        "num_hidden_layers": 48, "num_key_value_heads": 4, "tie_word_embeddings": False, "vocab_size": 151936},
}

SHAPE = ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "hd", "ffn_hidden_size", "mlp",
         "qk_norm", "qkv_bias", "out_bias", "tied_embeddings", "moe", "mla", "max_seq_len")


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_hf_configs_give_the_presets(name):
    ours, want = from_dict(CONFIGS[name], f"{name}/config.json"), preset(name)
    assert {k: getattr(ours, k) for k in SHAPE} == {k: getattr(want, k) for k in SHAPE}
    assert ours.param_count() == want.param_count() and ours.active_param_count() == want.active_param_count()
    assert ours.family == want.family


def _cfg(name, **changes):
    data = dict(CONFIGS[name])
    for key, value in changes.items():
        if value is None:
            data.pop(key)
        else:
            data[key] = value
    return data


def test_qwen_moe_layer_layouts():
    # decoder_sparse_step 2: layers 1, 3, 5... are MoE ((i + 1) % 2 == 0), the rest dense
    m = from_dict(_cfg("qwen3-30b-a3b", decoder_sparse_step=2))
    assert m.num_moe_layers == 24 and [m.is_moe_layer(i) for i in range(4)] == [False, True, False, True]
    # leading mlp_only_layers are the dense first layers
    m = from_dict(_cfg("qwen3-30b-a3b", mlp_only_layers=[1, 0]))
    assert m.moe.first_dense_layers == 2 and m.num_moe_layers == 46
    full = preset("qwen3-30b-a3b")
    assert m.param_count() == full.param_count() - 2 * (full.moe_mlp_params() - full.dense_mlp_params())
    # qwen2_moe: q/k/v biases by default, none with qkv_bias false; a gated shared expert
    q2 = from_dict(_cfg("qwen2-57b-a14b", qkv_bias=False))
    assert preset("qwen2-57b-a14b").param_count() - q2.param_count() == 28 * (3584 + 2 * 4 * 128)
    assert q2.shared_expert_params() == 3 * 3584 * 20480 + 3584


def test_deepseek_v2_is_read_with_the_same_shape_family():
    # DeepSeek-V2-Lite (config.json): full-rank q_proj (q_lora_rank null), 64 routed + 2 shared experts
    lite = {"model_type": "deepseek_v2", "first_k_dense_replace": 1, "hidden_size": 2048, "intermediate_size": 10944,
            "kv_lora_rank": 512, "moe_intermediate_size": 1408, "moe_layer_freq": 1, "n_routed_experts": 64,
            "n_shared_experts": 2, "num_attention_heads": 16, "num_experts_per_tok": 6, "num_hidden_layers": 27,
            "num_key_value_heads": 16, "q_lora_rank": None, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
            "v_head_dim": 128, "vocab_size": 102400, "tie_word_embeddings": False}
    m = from_dict(lite)
    assert m.mla.q_lora_rank is None and not m.moe.router_bias and m.moe.shared_width == 2 * 1408
    assert m.param_count() == 15_706_484_224  # deepseek-ai/DeepSeek-V2-Lite, Hub API safetensors.total (bf16)
    # DeepSeek-V2 paper (arXiv 2405.04434) section 5: V2-Lite has 15.7B total, 2.4B activated; DeepSeek
    # counts activated parameters without the input embedding (as V3's README_WEIGHTS.md, above)
    assert _within_printed_digit(m.param_count(), "15.7")
    assert _within_printed_digit(m.active_param_count() - m.vocab_size * m.hidden_size, "2.4")


@pytest.mark.parametrize("name,changes,words", [
    ("mixtral-8x7b", {"num_local_experts": None}, ["missing key 'num_local_experts'", "mixtral"]),
    ("deepseek-v3", {"kv_lora_rank": None}, ["missing key 'kv_lora_rank'", "deepseek_v3"]),
    ("deepseek-v3", {"first_k_dense_replace": None}, ["missing key 'first_k_dense_replace'"]),
    ("qwen2-57b-a14b", {"shared_expert_intermediate_size": None}, ["'shared_expert_intermediate_size'"]),
    ("qwen3-30b-a3b", {"moe_intermediate_size": None}, ["missing key 'moe_intermediate_size'"]),
    ("qwen3-30b-a3b", {"num_experts_per_tok": True}, ["'num_experts_per_tok' is true", "whole number"]),
    ("deepseek-v3", {"first_k_dense_replace": -1}, ["'first_k_dense_replace' is -1", "0 or more"]),
    ("deepseek-v3", {"n_shared_experts": "1"}, ["'n_shared_experts' is \"1\""]),
    ("qwen3-30b-a3b", {"mlp_only_layers": "0"}, ["'mlp_only_layers'", "a list"]),
    ("qwen3-30b-a3b", {"mlp_only_layers": [0, "x"]}, ["'mlp_only_layers'", "layer numbers"]),
    # top-k larger than the experts there are
    ("mixtral-8x7b", {"num_experts_per_tok": 9}, ["'num_experts_per_tok' 9", "'num_local_experts' 8", "1..8"]),
    ("deepseek-v3", {"first_k_dense_replace": 61}, ["'first_k_dense_replace' 61", "0..60"]),
    # layouts not modelled are refused, not guessed
    ("qwen3-30b-a3b", {"mlp_only_layers": [5, 9]}, ["mlp_only_layers [5, 9]", "leading dense layers"]),
    ("deepseek-v3", {"moe_layer_freq": 2}, ["moe_layer_freq 2", "not modelled"]),
    ("deepseek-v3", {"num_key_value_heads": None, "num_attention_heads": 0}, ["'num_attention_heads' is 0"]),
])
def test_bad_moe_configs_are_usage_errors_naming_the_key(name, changes, words):
    with pytest.raises(UsageError) as e:
        from_dict(_cfg(name, **changes), "m/config.json")
    for w in words:
        assert w in str(e.value), str(e.value)
    assert "m/config.json" in str(e.value)


def test_spec_validation_messages():
    base = dict(name="t", vocab_size=100, hidden_size=64, num_layers=4, num_heads=4, num_kv_heads=4,
                ffn_hidden_size=128)
    with pytest.raises(ValueError, match="experts_per_token 3 is more than num_experts 2"):
        MoESpec(num_experts=2, experts_per_token=3, expert_ffn_hidden_size=32)
    with pytest.raises(ValueError, match="need num_shared_experts"):
        MoESpec(num_experts=2, experts_per_token=1, expert_ffn_hidden_size=32, shared_expert_gate=True)
    moe = dict(num_experts=4, experts_per_token=2, expert_ffn_hidden_size=32)
    with pytest.raises(ValueError, match="leaves no MoE layer"):
        ModelSpec(**base, moe={**moe, "layer_freq": 8})
    mla = dict(q_lora_rank=None, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16)
    with pytest.raises(ValueError, match="num_kv_heads 2 must equal num_heads 4"):
        ModelSpec(**{**base, "num_kv_heads": 2}, mla=mla)
    with pytest.raises(ValueError, match="head_dim is qk_nope_head_dim"):
        ModelSpec(**base, head_dim=16, mla=mla)
    with pytest.raises(ValueError, match="a swiglu MLP uses silu"):
        ModelSpec(**base, activation="gelu")
    m = ModelSpec(**base, moe={**moe, "num_shared_experts": 2}, mla=mla)  # shared width 2 x 32
    assert m.hd == 24 and m.moe.shared_width == 64
    assert m.shared_expert_params() == 3 * 64 * 64
    assert m.router_params() == 4 * 64


# --- catalog ---------------------------------------------------------------------------------------
def _cli(*args, columns=200):
    proc = cli_run(*args, columns=columns)  # in this process
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    return proc.stdout


def test_catalog_models_json_round_trips_the_moe_presets():
    listing = ModelList.model_validate_json(_cli("catalog", "models", "--json"))
    entries = {m.name: m for m in listing.models}
    for name in PUBLISHED:
        e, want = entries[name], preset(name)
        assert e.params == want.param_count() and e.active_params == want.active_param_count()
        back = ModelSpec.model_validate(e.model_dump(exclude={"params", "active_params"}))
        assert back == want
    dense = entries["llama-2-7b"]
    assert dense.active_params == dense.params and dense.moe is None and dense.mla is None


def test_catalog_models_table_shows_active_parameters_at_80_columns():
    out = _cli("catalog", "models", columns=80)
    assert max(map(len, out.splitlines())) <= 80 and "…" not in out
    for name in PUBLISHED:
        m = preset(name)
        row = next(ln for ln in out.splitlines() if ln.startswith(name + " "))
        assert f"{m.param_count() / 1e9:,.2f}B" in row and f"{m.active_param_count() / 1e9:,.2f}B" in row
    assert json.loads(_cli("catalog", "models", "--json"))["schema_version"] == 1


def test_kimi_k2_is_deepseek_v3_with_384_experts():
    """moonshotai/Kimi-K2 model card: 1T total, 32B activated (the K2 report, arXiv 2507.20534, prints 1.04T,
    which this shape without a multi-token-prediction layer does not reach: 1.026T)."""
    m = preset("kimi-k2")
    assert m.mla is not None and m.moe.num_experts == 384 and m.moe.first_dense_layers == 1
    assert 1.0e12 < m.param_count() < 1.04e12
    assert _within_printed_digit(m.active_param_count(), "32")
