"""Model shapes: presets, Hugging Face configs read offline, generic shapes from a count."""

import json

import pytest

from trainready.errors import UnknownNameError, UsageError
from trainready.plan.hf_config import load_hf_config
from trainready.plan.presets import generic_model, preset, presets

# Published parameter counts (model cards / `sum(p.numel())` of the released checkpoints).
PUBLISHED = {
    "llama-2-7b": 6_738_415_616, "llama-2-13b": 13_015_864_320, "llama-2-70b": 68_976_648_192,
    "llama-3-8b": 8_030_261_248, "llama-3-70b": 70_553_706_496, "llama-3.1-405b": 405_853_388_800,
    "mistral-7b": 7_241_732_096, "qwen2-7b": 7_615_616_512, "qwen2-72b": 72_706_203_648,
    "mpt-7b": 6_649_286_656,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_preset_counts_match_published(name):
    assert preset(name).param_count() == PUBLISHED[name]


def test_all_required_presets_exist():
    names = set(presets())
    for n in ("llama-2-7b", "llama-2-13b", "llama-2-70b", "llama-3-8b", "llama-3-70b", "llama-3.1-405b",
              "mistral-7b", "qwen2-7b", "qwen2-72b", "mpt-7b", "mpt-30b", "gpt3-125m", "gpt3-350m", "gpt3-760m",
              "gpt3-1.3b", "gpt3-2.7b", "gpt3-6.7b", "gpt3-13b", "gpt3-175b"):
        assert n in names


def test_gpt3_sizes_are_close_to_their_names():
    for name, n in (("gpt3-125m", 125e6), ("gpt3-1.3b", 1.3e9), ("gpt3-6.7b", 6.7e9), ("gpt3-175b", 175e9)):
        assert abs(preset(name).param_count() / n - 1) < 0.02


def test_preset_aliases_and_unknown_names():
    assert preset("meta-llama/Llama-2-7b-hf").name == "llama-2-7b"
    assert preset("LLAMA_2_13B").name == "llama-2-13b"
    with pytest.raises(UnknownNameError) as exc:
        preset("llama-2-14b")
    assert "llama-2-13b" in exc.value.suggestions


CONFIGS = {
    # model_type-specific key names, as in the released config.json files
    "llama": ({"model_type": "llama", "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008,
               "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
               "tie_word_embeddings": False}, 6_738_415_616),
    "mistral": ({"model_type": "mistral", "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336,
                 "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8}, 7_241_732_096),
    "qwen2": ({"model_type": "qwen2", "vocab_size": 152064, "hidden_size": 3584, "intermediate_size": 18944,
               "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
               "tie_word_embeddings": False}, 7_615_616_512),
    "gpt2": ({"model_type": "gpt2", "vocab_size": 50257, "n_embd": 768, "n_layer": 12, "n_head": 12,
              "n_positions": 1024}, 124_439_808),
    "gpt2-medium": ({"model_type": "gpt2", "vocab_size": 50257, "n_embd": 1024, "n_layer": 24, "n_head": 16,
                     "n_positions": 1024}, 354_823_168),
    "gpt_neox": ({"model_type": "gpt_neox", "vocab_size": 50304, "hidden_size": 768, "intermediate_size": 3072,
                  "num_hidden_layers": 12, "num_attention_heads": 12, "tie_word_embeddings": False,
                  "max_position_embeddings": 2048}, 162_322_944),  # pythia-160m
    "mpt": ({"model_type": "mpt", "d_model": 4096, "n_heads": 32, "n_layers": 32, "expansion_ratio": 4,
             "max_seq_len": 2048, "vocab_size": 50432, "no_bias": True, "learned_pos_emb": True,
             "attn_config": {"alibi": True}}, 6_649_286_656),
    "falcon": ({"model_type": "falcon", "vocab_size": 65024, "hidden_size": 4544, "num_hidden_layers": 32,
                "num_attention_heads": 71, "multi_query": True, "parallel_attn": True, "bias": False,
                "new_decoder_architecture": False, "alibi": False}, 6_921_720_704),
    "opt": ({"model_type": "opt", "vocab_size": 50272, "hidden_size": 768, "ffn_dim": 3072,
             "num_hidden_layers": 12, "num_attention_heads": 12, "max_position_embeddings": 2048,
             "word_embed_proj_dim": 768, "do_layer_norm_before": True}, 125_239_296),
    "opt-350m": ({"model_type": "opt", "vocab_size": 50272, "hidden_size": 1024, "ffn_dim": 4096,
                  "num_hidden_layers": 24, "num_attention_heads": 16, "max_position_embeddings": 2048,
                  "word_embed_proj_dim": 512, "do_layer_norm_before": False}, 331_196_416),
    "bloom": ({"model_type": "bloom", "vocab_size": 250880, "hidden_size": 1024, "n_layer": 24, "n_head": 16},
              559_214_592),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_hf_configs_give_exact_counts(tmp_path, name):
    data, count = CONFIGS[name]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    assert load_hf_config(path).param_count() == count
    assert load_hf_config(tmp_path).param_count() == count  # a directory works too


def test_hf_gqa_and_untied_shapes(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(CONFIGS["mistral"][0]))
    spec = load_hf_config(path)
    assert (spec.num_kv_heads, spec.kv_dim, spec.mlp, spec.tied_embeddings) == (8, 1024, "swiglu", False)


def test_hf_missing_key_names_key_and_file(tmp_path):
    data = dict(CONFIGS["llama"][0])
    del data["intermediate_size"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    with pytest.raises(UsageError) as exc:
        load_hf_config(path)
    assert "'intermediate_size'" in str(exc.value) and str(path) in str(exc.value)


def test_hf_bad_inputs(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "t5"}))
    with pytest.raises(UsageError, match="not supported"):
        load_hf_config(path)
    path.write_text("{not json")
    with pytest.raises(UsageError, match="not valid JSON"):
        load_hf_config(path)
    with pytest.raises(UsageError, match="cannot read"):
        load_hf_config(tmp_path / "missing.json")


def test_generic_model_from_params():
    spec = generic_model(13e9)
    assert abs(spec.param_count() / 13e9 - 1) < 0.05
    assert spec.hidden_size == 128 * spec.num_layers and "aspect ratio" in spec.derived
    with pytest.raises(UsageError):
        generic_model(-5)
    with pytest.raises(UsageError):
        generic_model(13)  # a count in billions by mistake


@pytest.mark.parametrize("key,value,words", [
    ("num_hidden_layers", -3, "'num_hidden_layers' is -3; it must be a whole number above 0"),
    ("num_hidden_layers", True, "'num_hidden_layers' is true; it must be a whole number above 0"),  # not 1 layer
    ("hidden_size", "4096", "'hidden_size' is \"4096\"; it must be a whole number above 0"),
    ("hidden_size", 4096.5, "'hidden_size' is 4096.5; it must be a whole number above 0"),
    ("tie_word_embeddings", 1, "'tie_word_embeddings' is 1; it must be true or false"),
    ("num_key_value_heads", 0, "'num_key_value_heads' is 0; it must be a whole number above 0"),
])
def test_hf_config_values_of_the_wrong_kind_name_the_key(tmp_path, key, value, words):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**CONFIGS["llama"][0], key: value}))
    with pytest.raises(UsageError) as exc:
        load_hf_config(path)
    assert str(exc.value) == f"{path}: {words} (model_type 'llama')"


def test_hf_config_nested_keys_are_named_with_their_object(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**CONFIGS["mpt"][0], "attn_config": {"alibi": "yes"}}))
    with pytest.raises(UsageError, match="'attn_config.alibi' is \"yes\"; it must be true or false"):
        load_hf_config(path)


def test_hf_config_name_with_control_characters_is_escaped(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**CONFIGS["llama"][0], "_name_or_path": "evil\x1b]0;owned\x07\nmodel"}))
    assert load_hf_config(path).name == "evil\\x1b]0;owned\\x07\\x0amodel"


def test_nemotron_4_presets_match_their_reports():
    """Nemotron-4 340B Technical Report (arXiv 2406.11704), Sec. 2.1: 9.4 billion embedding and 331.6 billion
    non-embedding parameters; Nemotron-4 15B Technical Report (arXiv 2402.16819), Sec. 2: 12.5 billion
    non-embedding parameters (its 3.2B embedding figure is 256,000 x 6,144 x 2 = 3.15B rounded up)."""
    big, small = preset("nemotron-4-340b"), preset("nemotron-4-15b")
    assert round(big.embedding_params() / 1e9, 1) == 9.4
    assert round((big.param_count() - big.embedding_params()) / 1e9, 1) == 331.6
    assert round((small.param_count() - small.embedding_params()) / 1e9, 1) == 12.5
    assert 3.1e9 < small.embedding_params() < 3.2e9
    # squared ReLU, not gated: two matrices per MLP, and LayerNorm
    assert not big.gated_mlp and big.norm == "layernorm"
