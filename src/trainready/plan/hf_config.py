"""Read a Hugging Face `config.json` offline into a ModelSpec with the exact parameter count.

Supported `model_type`s: llama, mistral, qwen2, gpt2, gpt_neox, mpt, falcon, opt, bloom.
A missing key is an error naming the key and the file.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from trainready.catalog.textfile import read_user_text
from trainready.errors import UsageError

from .model_spec import ModelSpec

SUPPORTED = ("llama", "mistral", "qwen2", "gpt2", "gpt_neox", "mpt", "falcon", "opt", "bloom")


class _Config:
    """Key access that fails with the key and the file named."""

    def __init__(self, data: dict[str, Any], path: str):
        self.data, self.path = data, path

    def need(self, *keys: str) -> Any:
        for key in keys:
            if key in self.data and self.data[key] is not None:
                return self.data[key]
        names = " or ".join(f"'{k}'" for k in keys)
        raise UsageError(f"{self.path}: missing key {names} (model_type '{self.data.get('model_type')}')")

    def get(self, key: str, default: Any) -> Any:
        value = self.data.get(key, default)
        return default if value is None else value


def _gelu_kind(name: str) -> str:
    """How the MLP activation runs in eager PyTorch (Hugging Face ACT2FN names)."""
    if name in ("gelu_new", "gelu_fast", "gelu_pytorch_tanh_composed"):
        return "gelu_tanh_composed"  # written out as elementwise ops in transformers
    if name == "relu":
        return "relu"
    return "gelu"  # gelu, gelu_pytorch_tanh, quick_gelu...: one kernel


def _llama_like(c: _Config, family: str) -> dict:
    heads = c.need("num_attention_heads")
    spec = dict(
        family=family, vocab_size=c.need("vocab_size"), hidden_size=c.need("hidden_size"),
        num_layers=c.need("num_hidden_layers"), num_heads=heads,
        num_kv_heads=c.get("num_key_value_heads", heads), ffn_hidden_size=c.need("intermediate_size"),
        head_dim=c.get("head_dim", None), tied_embeddings=c.get("tie_word_embeddings", False),
        max_seq_len=c.get("max_position_embeddings", None),
    )
    if family == "qwen2":
        spec["qkv_bias"] = True  # Qwen2 attention: bias on q/k/v, none on o
    else:
        bias = bool(c.get("attention_bias", False))
        spec["qkv_bias"] = spec["out_bias"] = bias
        spec["mlp_bias"] = bool(c.get("mlp_bias", False))
    return spec


def _gpt2(c: _Config) -> dict:
    d = c.need("n_embd", "hidden_size")
    heads = c.need("n_head", "num_attention_heads")
    return dict(family="gpt", vocab_size=c.need("vocab_size"), hidden_size=d,
                num_layers=c.need("n_layer", "num_hidden_layers"), num_heads=heads, num_kv_heads=heads,
                ffn_hidden_size=c.get("n_inner", 4 * d), mlp="gelu", norm="layernorm", position="learned",
                activation=_gelu_kind(c.get("activation_function", "gelu_new")),
                max_seq_len=c.need("n_positions", "max_position_embeddings"), tied_embeddings=True,
                qkv_bias=True, out_bias=True, mlp_bias=True)


def _gpt_neox(c: _Config) -> dict:
    heads = c.need("num_attention_heads")
    bias = bool(c.get("attention_bias", True))
    return dict(family="gpt_neox", vocab_size=c.need("vocab_size"), hidden_size=c.need("hidden_size"),
                num_layers=c.need("num_hidden_layers"), num_heads=heads, num_kv_heads=heads,
                ffn_hidden_size=c.need("intermediate_size"), mlp="gelu", norm="layernorm",
                activation=_gelu_kind(c.get("hidden_act", "gelu")),
                tied_embeddings=c.get("tie_word_embeddings", False), qkv_bias=bias, out_bias=bias,
                mlp_bias=True, max_seq_len=c.get("max_position_embeddings", None))


def _mpt(c: _Config) -> dict:
    d = c.need("d_model")
    heads = c.need("n_heads")
    no_bias = bool(c.get("no_bias", False))
    attn = c.get("attn_config", {}) or {}
    alibi = bool(attn.get("alibi", False))
    learned = bool(c.get("learned_pos_emb", True)) and not alibi
    kv = attn.get("kv_n_heads", heads) if attn.get("attn_type") == "grouped_query_attention" else heads
    if attn.get("attn_type") == "multiquery_attention":
        kv = 1
    ffn_cfg = c.get("ffn_config", {}) or {}
    mlp = "swiglu" if ffn_cfg.get("ffn_type") == "mptglu" else "gelu"
    ffn = ffn_cfg.get("ffn_hidden_size") or int(c.need("expansion_ratio") * d)
    return dict(family="mpt", vocab_size=c.need("vocab_size"), hidden_size=d, num_layers=c.need("n_layers"),
                num_heads=heads, num_kv_heads=kv, ffn_hidden_size=ffn, mlp=mlp,
                norm="layernorm-nobias" if no_bias else "layernorm",
                position="learned" if learned else ("alibi" if alibi else "rope"),
                max_seq_len=c.need("max_seq_len"), tied_embeddings=c.get("tie_word_embeddings", True),
                qkv_bias=not no_bias, out_bias=not no_bias, mlp_bias=not no_bias)


def _falcon(c: _Config) -> dict:
    d = c.need("hidden_size")
    heads = c.need("num_attention_heads", "n_head")
    new_arch = bool(c.get("new_decoder_architecture", False))
    if new_arch:
        kv = c.need("num_kv_heads", "n_head_kv")
        norms = c.get("num_ln_in_parallel_attn", 2)
    else:
        kv = 1 if c.get("multi_query", True) else heads
        norms = 1 if c.get("parallel_attn", True) else 2
    bias = bool(c.get("bias", False))
    return dict(family="falcon", vocab_size=c.need("vocab_size"), hidden_size=d,
                num_layers=c.need("num_hidden_layers", "n_layer"), num_heads=heads, num_kv_heads=kv,
                ffn_hidden_size=c.get("ffn_hidden_size", 4 * d), mlp="gelu",
                norm="layernorm", norms_per_layer=norms, position="alibi" if c.get("alibi", False) else "rope",
                tied_embeddings=c.get("tie_word_embeddings", True), qkv_bias=bias, out_bias=bias,
                mlp_bias=bias, max_seq_len=c.get("max_position_embeddings", None))


def _opt(c: _Config) -> dict:
    d = c.need("hidden_size")
    heads = c.need("num_attention_heads")
    bias = bool(c.get("enable_bias", True))
    pre_ln = bool(c.get("do_layer_norm_before", True))
    final = pre_ln and not bool(c.get("_remove_final_layer_norm", False))
    wep = c.get("word_embed_proj_dim", d)
    # OPT's learned positions carry an offset of 2 rows
    return dict(family="opt", vocab_size=c.need("vocab_size"), hidden_size=d,
                num_layers=c.need("num_hidden_layers"), num_heads=heads, num_kv_heads=heads,
                ffn_hidden_size=c.need("ffn_dim"), mlp="gelu", norm="layernorm", position="learned",
                activation=_gelu_kind(c.get("activation_function", "relu")),
                max_seq_len=c.need("max_position_embeddings") + 2, tied_embeddings=True,
                embedding_dim=wep if wep != d else None, qkv_bias=bias, out_bias=bias, mlp_bias=bias,
                final_norm=final)


def _bloom(c: _Config) -> dict:
    d = c.need("hidden_size", "n_embed")
    heads = c.need("n_head", "num_attention_heads")
    return dict(family="bloom", vocab_size=c.need("vocab_size"), hidden_size=d,
                num_layers=c.need("n_layer", "num_hidden_layers"), num_heads=heads, num_kv_heads=heads,
                ffn_hidden_size=4 * d, mlp="gelu", norm="layernorm", position="alibi",
                tied_embeddings=True, qkv_bias=True, out_bias=True, mlp_bias=True,
                extra_params=2 * d)  # word_embeddings_layernorm


PARSERS: dict[str, Callable[[_Config], dict]] = {
    "llama": lambda c: _llama_like(c, "llama"),
    "mistral": lambda c: _llama_like(c, "mistral"),
    "qwen2": lambda c: _llama_like(c, "qwen2"),
    "gpt2": _gpt2, "gpt_neox": _gpt_neox, "mpt": _mpt, "falcon": _falcon, "opt": _opt, "bloom": _bloom,
}


def from_dict(data: dict[str, Any], path: str = "<config>") -> ModelSpec:
    c = _Config(data, path)
    model_type = c.need("model_type")
    parser = PARSERS.get(model_type) if isinstance(model_type, str) else None
    if parser is None:
        raise UsageError(f"{path}: model_type {model_type!r} is not supported; supported: {', '.join(SUPPORTED)}")
    fields = parser(c)
    name = data.get("_name_or_path") or Path(path).parent.name or model_type
    try:
        return ModelSpec(name=str(name), source=f"Hugging Face config {path}", **fields)
    except ValidationError as exc:
        msg = "; ".join(e["msg"] for e in exc.errors())
        raise UsageError(f"{path}: inconsistent shape: {msg}") from None


def load_hf_config(path: str | Path) -> ModelSpec:
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    text = read_user_text(p, "model config")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{p}: not valid JSON: {exc}") from None
    except RecursionError:
        raise UsageError(f"{p}: not valid JSON: nested too deeply") from None
    if not isinstance(data, dict):
        raise UsageError(f"{p}: expected a JSON object (a Hugging Face config.json)")
    return from_dict(data, str(p))
