"""Dense models of 2024-2025 (Llama 3.1-3.3, Qwen2.5, Qwen3, Gemma 2/3, Mistral): presets whose counts equal
the published ones, their Hugging Face configs read offline, and hostile configs."""

import json

import pytest

from trainready.errors import UsageError
from trainready.plan.activations import layer_bytes_per_token
from trainready.plan.hf_config import from_dict, load_hf_config
from trainready.plan.job import JobSpec
from trainready.plan.memory import estimate_memory
from trainready.plan.performance import estimate_step
from trainready.plan.presets import preset
from trainready.plan.setup import resolve

# Published totals: the Hugging Face Hub's safetensors parameter count of each checkpoint
# (`safetensors.total`, = the bf16 index's total_size / 2), as listed on the model pages.
PUBLISHED = {
    "llama-3.1-8b": 8_030_261_248, "llama-3.1-70b": 70_553_706_496, "llama-3.3-70b": 70_553_706_496,
    "llama-3.2-1b": 1_235_814_400, "llama-3.2-3b": 3_212_749_824,
    "qwen2.5-0.5b": 494_032_768, "qwen2.5-1.5b": 1_543_714_304, "qwen2.5-3b": 3_085_938_688,
    "qwen2.5-7b": 7_615_616_512, "qwen2.5-14b": 14_770_033_664, "qwen2.5-32b": 32_763_876_352,
    "qwen2.5-72b": 72_706_203_648,
    "qwen3-4b": 4_022_468_096, "qwen3-8b": 8_190_735_360, "qwen3-14b": 14_768_307_200,
    "qwen3-32b": 32_762_123_264,
    "gemma-2-2b": 2_614_341_888, "gemma-2-9b": 9_241_705_984, "gemma-2-27b": 27_227_128_320,
    "gemma-3-1b": 999_885_952,
    "mistral-7b-v0.3": 7_248_023_552, "mistral-nemo-12b": 12_247_782_400, "mistral-small-24b": 23_572_403_200,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_dense_preset_counts_match_published(name):
    assert preset(name).param_count() == PUBLISHED[name]


# Qwen3-0.6B and -1.7B tie their embeddings, but their checkpoints also store lm_head.weight, so the Hub's
# totals (751,632,384 and 2,031,739,904) count the vocab x hidden matrix twice. Model cards: 0.6B with
# 0.44B non-embedding, 1.7B with 1.4B non-embedding.
@pytest.mark.parametrize("name,hub_total,non_embedding_b,digits", [
    ("qwen3-0.6b", 751_632_384, 0.44, 2), ("qwen3-1.7b", 2_031_739_904, 1.4, 1)])
def test_qwen3_small_tied_counts(name, hub_total, non_embedding_b, digits):
    m = preset(name)
    embedding = m.vocab_size * m.hidden_size
    assert m.tied_embeddings and m.param_count() + embedding == hub_total
    assert round((m.param_count() - embedding) / 1e9, digits) == non_embedding_b  # to the card's precision


def _siglip_tower_and_projector(text_hidden: int) -> int:
    """Gemma 3's vision side: SigLIP so400m (config.json vision_config: hidden 1152, 27 layers, MLP 4304,
    patch 14, image 896, no pooling head) and the projector (a 1152 x text-hidden matrix and an RMSNorm)."""
    d, layers, f, patch, image = 1152, 27, 4304, 14, 896
    embeddings = 3 * patch * patch * d + d + (image // patch) ** 2 * d  # patch conv (+bias), positions
    block = 2 * d + 4 * (d * d + d) + 2 * d + (d * f + f) + (f * d + d)  # LN, q/k/v/o with bias, LN, MLP
    return embeddings + layers * block + 2 * d + d * text_hidden + d


# Published: the Hub's totals of the image-text checkpoints google/gemma-3-{4b,12b,27b}-it; the presets model
# the language model, so the vision tower and projector are added back here.
@pytest.mark.parametrize("name,hub_total", [
    ("gemma-3-4b", 4_300_079_472), ("gemma-3-12b", 12_187_325_040), ("gemma-3-27b", 27_432_406_640)])
def test_gemma3_language_model_plus_vision_tower_is_the_checkpoint(name, hub_total):
    m = preset(name)
    assert m.param_count() + _siglip_tower_and_projector(m.hidden_size) == hub_total
    assert "vision tower" in m.derived


def test_mistral_large_2_is_123b():
    # Mistral Large 2 (2407) is published as "123B"; no exact total was found to test against.
    assert round(preset("mistral-large-2").param_count() / 1e9) == 123


def test_llama_3_1_is_a_preset_of_its_own_with_the_llama_3_shape():
    for size in ("8b", "70b"):
        old, new = preset(f"llama-3-{size}"), preset(f"llama-3.1-{size}")
        assert new.name == f"llama-3.1-{size}" and old.name == f"llama-3-{size}"
        assert old.param_count() == new.param_count() and (old.max_seq_len, new.max_seq_len) == (8192, 131072)
    assert preset("meta-llama/Meta-Llama-3.1-8B").name == "llama-3.1-8b"
    assert preset("meta-llama/Llama-3.3-70B-Instruct").name == "llama-3.3-70b"
    assert preset("Qwen/Qwen3-14B-Base").name == "qwen3-14b"
    assert preset("google/gemma-3-27b-it").name == "gemma-3-27b"


# Released config.json files (keys that do not affect the shape dropped), and the preset each one is.
CONFIGS = {
    "llama": ("llama-3.2-1b", {
        "architectures": ["LlamaForCausalLM"], "attention_bias": False, "head_dim": 64, "hidden_act": "silu",
        "hidden_size": 2048, "intermediate_size": 8192, "max_position_embeddings": 131072, "mlp_bias": False,
        "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
        "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "rope_theta": 500000.0, "tie_word_embeddings": True, "vocab_size": 128256}),
    "qwen3": ("qwen3-32b", {
        "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "head_dim": 128, "hidden_act": "silu",
        "hidden_size": 5120, "intermediate_size": 25600, "max_position_embeddings": 40960, "max_window_layers": 64,
        "model_type": "qwen3", "num_attention_heads": 64, "num_hidden_layers": 64, "num_key_value_heads": 8,
        "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None, "tie_word_embeddings": False,
        "use_sliding_window": False, "vocab_size": 151936}),
    "gemma2": ("gemma-2-9b", {
        "architectures": ["Gemma2ForCausalLM"], "attention_bias": False, "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0, "head_dim": 256, "hidden_act": "gelu_pytorch_tanh",
        "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 3584, "intermediate_size": 14336,
        "max_position_embeddings": 8192, "model_type": "gemma2", "num_attention_heads": 16, "num_hidden_layers": 42,
        "num_key_value_heads": 8, "query_pre_attn_scalar": 256, "sliding_window": 4096, "vocab_size": 256000}),
    "gemma3_text": ("gemma-3-1b", {
        "architectures": ["Gemma3ForCausalLM"], "attention_bias": False, "head_dim": 256,
        "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1152, "intermediate_size": 6912,
        "max_position_embeddings": 32768, "model_type": "gemma3_text", "num_attention_heads": 4,
        "num_hidden_layers": 26, "num_key_value_heads": 1, "query_pre_attn_scalar": 256, "rope_scaling": None,
        "sliding_window": 512, "sliding_window_pattern": 6, "vocab_size": 262144}),
    # google/gemma-3-4b-it names only three sizes of its language model: transformers' defaults give the rest
    "gemma3": ("gemma-3-4b", {
        "architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": 255999, "eoi_token_index": 256000,
        "image_token_index": 262144, "mm_tokens_per_image": 256, "model_type": "gemma3",
        "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
                        "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                        "sliding_window": 1024},
        "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
                          "model_type": "siglip_vision_model", "num_attention_heads": 16, "num_hidden_layers": 27,
                          "patch_size": 14, "vision_use_head": False}}),
    "gemma3-27b": ("gemma-3-27b", {
        "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
        "text_config": {"head_dim": 128, "hidden_size": 5376, "intermediate_size": 21504, "model_type": "gemma3_text",
                        "num_attention_heads": 32, "num_hidden_layers": 62, "num_key_value_heads": 16,
                        "query_pre_attn_scalar": 168, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                        "sliding_window": 1024},
        "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
                          "model_type": "siglip_vision_model", "num_attention_heads": 16, "num_hidden_layers": 27,
                          "patch_size": 14, "vision_use_head": False}}),
    "mistral": ("mistral-nemo-12b", {
        "architectures": ["MistralForCausalLM"], "head_dim": 128, "hidden_act": "silu", "hidden_size": 5120,
        "intermediate_size": 14336, "max_position_embeddings": 128000, "model_type": "mistral",
        "num_attention_heads": 32, "num_hidden_layers": 40, "num_key_value_heads": 8, "rope_theta": 1000000.0,
        "sliding_window": None, "tie_word_embeddings": False, "vocab_size": 131072}),
}

_LABELS = {"name", "aliases", "source", "derived", "activation"}


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_released_configs_parse_to_their_presets(tmp_path, kind):
    name, data = CONFIGS[kind]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    parsed, want = load_hf_config(path), preset(name)
    assert parsed.model_dump(exclude=_LABELS) == want.model_dump(exclude=_LABELS)
    assert parsed.param_count() == want.param_count()


def test_gemma_and_qwen3_shapes():
    gemma = from_dict(CONFIGS["gemma3"][1])
    assert (gemma.mlp, gemma.gated_mlp, gemma.norms_per_layer, gemma.qk_norm, gemma.tied_embeddings) == \
        ("geglu", True, 4, True, True)
    assert gemma.activation == "gelu" and "vision tower" in gemma.derived  # gelu_pytorch_tanh: one kernel
    gemma2 = from_dict(CONFIGS["gemma2"][1])
    assert not gemma2.qk_norm and gemma2.q_dim == 4096 != gemma2.hidden_size  # 16 heads of 256
    qwen3 = from_dict(CONFIGS["qwen3"][1])
    assert qwen3.qk_norm and (qwen3.qkv_bias, qwen3.out_bias, qwen3.mlp_bias) == (False, False, False)
    # per-head q/k norms: 2 x head_dim per layer
    assert qwen3.param_count() - qwen3.model_copy(update={"qk_norm": False}).param_count() == 64 * 2 * 128


def test_qwen3_head_dim_defaults_to_128_as_in_transformers():
    data = {k: v for k, v in CONFIGS["qwen3"][1].items() if k != "head_dim"}
    assert from_dict(data).hd == 128  # not 5120 / 64 = 80


def test_gemma_attention_bias_and_untied_head():
    data = {**CONFIGS["gemma2"][1], "attention_bias": True, "tie_word_embeddings": False}
    m, base = from_dict(data), preset("gemma-2-9b")
    d = m.hidden_size
    extra = 42 * (m.q_dim + 2 * m.kv_dim + d) + m.vocab_size * d
    assert m.param_count() - base.param_count() == extra


def _write(tmp_path, data):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("value,shown", [([1, 2], "list"), ("text", '"text"'), (7, "7")])
def test_gemma3_text_config_must_be_an_object(tmp_path, value, shown):
    path = _write(tmp_path, {**CONFIGS["gemma3"][1], "text_config": value})
    with pytest.raises(UsageError) as exc:
        load_hf_config(path)
    assert str(exc.value) == f"{path}: 'text_config' is {shown}; it must be an object (model_type 'gemma3')"


@pytest.mark.parametrize("value", [None, "absent"])
def test_gemma3_without_text_config_is_refused(tmp_path, value):
    data = dict(CONFIGS["gemma3"][1])
    if value == "absent":
        del data["text_config"]
    else:
        data["text_config"] = value
    with pytest.raises(UsageError, match="missing key 'text_config'"):
        load_hf_config(_write(tmp_path, data))


def test_gemma3_text_config_keys_are_named_with_their_object(tmp_path):
    data = json.loads(json.dumps(CONFIGS["gemma3"][1]))
    del data["text_config"]["hidden_size"]
    with pytest.raises(UsageError, match="missing key 'text_config.hidden_size'"):
        load_hf_config(_write(tmp_path, data))
    data["text_config"].update(hidden_size=2560, num_attention_heads=True)
    with pytest.raises(UsageError, match="'text_config.num_attention_heads' is true; it must be a whole number"):
        load_hf_config(_write(tmp_path, data))


@pytest.mark.parametrize("kind", ["qwen3", "gemma2", "gemma3_text", "llama"])
@pytest.mark.parametrize("value,shown", [("128", '"128"'), (0, "0"), (True, "true"), (128.0, "128.0"), (-64, "-64")])
def test_head_dim_must_be_a_count(tmp_path, kind, value, shown):
    path = _write(tmp_path, {**CONFIGS[kind][1], "head_dim": value})
    with pytest.raises(UsageError) as exc:
        load_hf_config(path)
    assert str(exc.value) == f"{path}: 'head_dim' is {shown}; it must be a whole number above 0 (model_type '{kind}')"


def test_gemma3_nested_head_dim_must_be_a_count(tmp_path):
    data = json.loads(json.dumps(CONFIGS["gemma3"][1]))
    data["text_config"]["head_dim"] = "256"
    with pytest.raises(UsageError, match="'text_config.head_dim' is \"256\"; it must be a whole number above 0"):
        load_hf_config(_write(tmp_path, data))


def test_gemma_with_a_relu_mlp_is_an_inconsistent_shape(tmp_path):
    path = _write(tmp_path, {**CONFIGS["gemma2"][1], "hidden_activation": "relu"})
    with pytest.raises(UsageError, match="inconsistent shape"):
        load_hf_config(path)


def test_gemma_head_dim_and_heads_that_do_not_divide(tmp_path):
    path = _write(tmp_path, {**CONFIGS["gemma2"][1], "num_key_value_heads": 5})
    with pytest.raises(UsageError, match="num_heads 16 is not a multiple of num_kv_heads 5"):
        load_hf_config(path)


# GeGLU has SwiGLU's three matrices and saved tensors: memory and speed treat them alike.
def test_geglu_is_modelled_as_a_gated_mlp(catalog):
    gemma = preset("gemma-2-9b")
    twin = gemma.model_copy(update={"mlp": "swiglu"})
    ungated = gemma.model_copy(update={"mlp": "gelu"})
    kw = dict(kernels="fused", residual_bytes=2, act_bytes=2)
    assert layer_bytes_per_token(gemma, **kw) == layer_bytes_per_token(twin, **kw)
    # fused: the gated kernel keeps its input (2 x ffn) and the product (1 x ffn), GELU its input and output
    assert layer_bytes_per_token(gemma, **kw) - layer_bytes_per_token(ungated, **kw) == 1 * 2 * gemma.ffn_hidden_size
    job = JobSpec(model="gemma-2-9b", instance="p5.48xlarge", micro_batch=1, seq_len=4096, tp=2)
    a, b = resolve(job, catalog, model=gemma), resolve(job, catalog, model=twin)
    assert estimate_step(a).tokens_per_s == pytest.approx(estimate_step(b).tokens_per_s, rel=1e-12)
    assert estimate_step(a).hardware_flops_per_token == estimate_step(b).hardware_flops_per_token
    assert estimate_memory(a).peak == pytest.approx(estimate_memory(b).peak, rel=1e-12)


def test_four_norms_per_block_are_counted(catalog):
    gemma = preset("gemma-2-9b")
    two = gemma.model_copy(update={"norms_per_layer": 2})
    assert gemma.param_count() - two.param_count() == 42 * 2 * gemma.hidden_size
    kw = dict(kernels="fused", residual_bytes=2, act_bytes=2)
    assert layer_bytes_per_token(gemma, **kw) > layer_bytes_per_token(two, **kw)
