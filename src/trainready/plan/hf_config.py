"""Read a Hugging Face `config.json` offline into a ModelSpec with the exact parameter count.

Supported `model_type`s: llama, mistral, qwen2, qwen3, gemma2, gemma3_text, gemma3 (its text_config),
gpt2, gpt_neox, mpt, falcon, opt, bloom;
mixture-of-experts (hf_moe.py): mixtral, qwen2_moe, qwen3_moe, deepseek_v2, deepseek_v3, gpt_oss.
A missing key is an error naming the key and the file.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from trainready.catalog.textfile import read_user_text
from trainready.errors import UsageError, printable, pydantic_message
from trainready.io import parse_json

from . import hf_moe
from .model_spec import MAX_PARAMS, ModelSpec

SUPPORTED = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text", "gemma3",
             "gpt2", "gpt_neox", "mpt", "falcon", "opt", "bloom",
             "mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3", "gpt_oss")


# No size or count in a model of at most MAX_PARAMS parameters is larger than MAX_PARAMS; a bigger one is a
# typo, and 10**400 would overflow the float arithmetic downstream.
_MAX = int(MAX_PARAMS)
_KINDS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "count": ("a whole number above 0", lambda v: type(v) is int and v > 0),
    # an int past a float's range (a 400-digit literal) is no number either: math.isfinite would overflow on it
    "number": ("a number above 0", lambda v: v > 0 if type(v) is float and math.isfinite(v)
               else type(v) is int and 0 < v < 2**1023),
    "bool": ("true or false", lambda v: type(v) is bool),
    "str": ("a string", lambda v: isinstance(v, str)),
    "dict": ("an object", lambda v: isinstance(v, dict)),
    "index": ("a whole number (0 or more)", lambda v: type(v) is int and v >= 0),
    "list": ("a list", lambda v: isinstance(v, list)),
}


def _shown(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, (bool, int, float, str, type(None))) else type(value).__name__
    return printable(text if len(text) <= 40 else text[:40] + "...")


class _Config:
    """Key access that fails with the key and the file named, and with the value's type checked
    (booleans are not counts: `"num_hidden_layers": true` is an error, not 1 layer)."""

    def __init__(self, data: dict[str, Any], path: str, prefix: str = "", model_type: Any = None,
                 sizes: dict[str, int] | None = None):
        self.data, self.path, self.prefix = data, path, prefix
        self.model_type = data.get("model_type") if model_type is None else model_type
        self.sizes: dict[str, int] = {} if sizes is None else sizes  # counts read, by key (shared with sub())

    def _checked(self, key: str, value: Any, kind: str) -> Any:
        want, ok = _KINDS[kind]
        if kind in ("count", "index") and ok(value) and value > _MAX:
            want, ok = f"{want}, at most {MAX_PARAMS:.0e}", lambda v: False
        if not ok(value):
            raise UsageError(f"{self.path}: '{self.prefix}{key}' is {_shown(value)}; it must be {want} "
                             f"(model_type '{printable(self.model_type)}')")
        if kind == "count":
            self.sizes[self.prefix + key] = value
        return value

    def need(self, *keys: str, kind: str = "count") -> Any:
        for key in keys:
            if key in self.data and self.data[key] is not None:
                return self._checked(key, self.data[key], kind)
        names = " or ".join(f"'{self.prefix}{k}'" for k in keys)
        raise UsageError(f"{self.path}: missing key {names} (model_type '{printable(self.model_type)}')")

    def get(self, key: str, default: Any, kind: str = "count") -> Any:
        value = self.data.get(key, default)
        return default if value is None else self._checked(key, value, kind)

    def sub(self, key: str) -> "_Config":
        """A nested object (MPT's attn_config), its keys named as attn_config.key."""
        return _Config(self.get(key, {}, kind="dict"), self.path, f"{self.prefix}{key}.", self.model_type, self.sizes)


def _gelu_kind(name: str) -> str:
    """How the MLP activation runs in eager PyTorch (Hugging Face ACT2FN names)."""
    if name in ("gelu_new", "gelu_fast", "gelu_pytorch_tanh_composed"):
        return "gelu_tanh_composed"  # written out as elementwise ops in transformers
    if name == "relu":
        return "relu"
    return "gelu"  # gelu, gelu_pytorch_tanh, quick_gelu...: one kernel


# KV heads transformers 5.23 builds when config.json leaves num_key_value_heads out (the config classes'
# field defaults: configuration_qwen2.py, qwen3, mistral, mixtral, qwen2_moe, qwen3_moe); an explicit null,
# and a llama config without it, mean num_attention_heads (their __post_init__).
ABSENT_KV_HEADS = {"qwen2": 32, "qwen3": 32, "mistral": 8, "mixtral": 8, "qwen2_moe": 16, "qwen3_moe": 4,
                   "gpt_oss": 8}


# What transformers 5.23 builds when config.json states no rotary base (the config classes' defaults, read with
# AutoConfig.for_model(model_type).rope_parameters): gemma3_text's global layers; gpt_oss's yarn; gpt_neox's 25%.
ABSENT_ROPE: dict[str, dict[str, Any]] = {
    "mixtral": {"rope_theta": 1000000.0}, "gemma3_text": {"rope_theta": 1000000.0},
    "gemma3": {"rope_theta": 1000000.0}, "gpt_neox": {"rope_theta": 10000.0, "partial_rotary_factor": 0.25},
    "gpt_oss": {"rope_theta": 150000.0, "rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                "original_max_position_embeddings": 4096},
}
ABSENT_ROPE_THETA = 10000.0  # llama, mistral, qwen2/3, qwen2_moe, qwen3_moe, deepseek_v2/v3, gemma2, falcon


def _rope(c: _Config, model_type: str) -> dict:
    """rope_theta, rope_scaling and the rotary fraction as config.json states them: transformers 5's
    `rope_parameters` object (Gemma 3's per layer type: the full-attention layers'), or the older `rope_theta`
    and `rope_scaling` keys (GPT-NeoX: rotary_emb_base and rotary_pct; Nemotron: partial_rotary_factor); what the
    file leaves out is what transformers' config class builds (ABSENT_ROPE)."""
    rope = None
    if c.get("rope_parameters", None, "dict") is not None:
        rope = c.sub("rope_parameters")
        if rope.get("full_attention", None, "dict") is not None:
            rope = rope.sub("full_attention")
    top_theta = c.get("rope_theta", None, "number") or c.get("rotary_emb_base", None, "number")
    if rope is not None:  # transformers 5 fills rope_parameters' gaps from the top-level keys
        theta, scaling = rope.get("rope_theta", None, "number") or top_theta, rope
    else:
        theta = top_theta
        scaling = c.sub("rope_scaling") if c.get("rope_scaling", None, "dict") is not None else None
    absent = ABSENT_ROPE.get(model_type, {})
    if theta is None:
        theta = absent.get("rope_theta", ABSENT_ROPE_THETA)
    no_type = scaling is None or (scaling.get("rope_type", None, "str") or scaling.get("type", None, "str")) is None
    if no_type and "rope_type" in absent:  # gpt_oss: its config class builds yarn whatever the file says of theta
        scaling = _Config({**absent, **(scaling.data if scaling is not None else {})}, c.path,
                          f"{c.prefix}(default) ", c.model_type)
    fraction = ((rope.get("partial_rotary_factor", None, "number") if rope is not None else None)
                or c.get("partial_rotary_factor", None, "number") or c.get("rotary_pct", None, "number")
                or absent.get("partial_rotary_factor", 1.0))
    out: dict[str, Any] = {"rope_theta": float(theta), "rotary_fraction": float(fraction)}
    kind = None
    if scaling is not None:
        kind = scaling.get("rope_type", None, "str") or scaling.get("type", "default", "str")
    if kind not in (None, "default"):
        if not re.fullmatch(r"[a-z0-9_]{1,32}", kind):
            raise UsageError(f"{c.path}: rope type {printable(kind)!r} is not a rope type name (model_type "
                             f"'{printable(c.model_type)}')")
        out["rope_scaling"] = dict(type=kind, factor=float(scaling.need("factor", kind="number")),
                                   low_freq_factor=scaling.get("low_freq_factor", None, "number"),
                                   high_freq_factor=scaling.get("high_freq_factor", None, "number"),
                                   original_max_position=scaling.get("original_max_position_embeddings", None),
                                   beta_fast=scaling.get("beta_fast", None, "number"),
                                   beta_slow=scaling.get("beta_slow", None, "number"),
                                   mscale=scaling.get("mscale", None, "number"),
                                   mscale_all_dim=scaling.get("mscale_all_dim", None, "number"))
    return out


def _llama_like(c: _Config, family: str) -> dict:
    heads = c.need("num_attention_heads")
    absent = "num_key_value_heads" not in c.data
    if absent and heads % ABSENT_KV_HEADS.get(family, heads):
        raise UsageError(f"{c.path}: missing key '{c.prefix}num_key_value_heads': transformers builds "
                         f"{ABSENT_KV_HEADS[family]} KV heads without it (model_type '{printable(c.model_type)}'), "
                         f"which do not divide 'num_attention_heads' {heads}")
    spec = dict(
        family=family, vocab_size=c.need("vocab_size"), hidden_size=c.need("hidden_size"),
        num_layers=c.need("num_hidden_layers"), num_heads=heads,
        num_kv_heads=ABSENT_KV_HEADS.get(family, heads) if absent else c.get("num_key_value_heads", heads),
        ffn_hidden_size=c.need("intermediate_size"),
        head_dim=c.get("head_dim", None), tied_embeddings=c.get("tie_word_embeddings", False, "bool"),
        max_seq_len=c.get("max_position_embeddings", None),
    )
    if family == "qwen2":
        spec["qkv_bias"] = True  # Qwen2 attention: bias on q/k/v, none on o
    else:
        bias = c.get("attention_bias", False, "bool")
        spec["qkv_bias"] = spec["out_bias"] = bias
        spec["mlp_bias"] = c.get("mlp_bias", False, "bool")
    return spec


def _qwen3(c: _Config) -> dict:
    # transformers Qwen3Config/Qwen3Attention: head_dim defaults to 128, not hidden_size / heads (Qwen3-32B:
    # 64 x 128 > 5120); RMSNorm on each query and key head; attention_bias on q, k, v and o; no MLP bias
    return {**_llama_like(c, "qwen3"), "head_dim": c.get("head_dim", 128), "qk_norm": True, "mlp_bias": False}


# transformers' class defaults (v5.24 configuration_gemma2.py Gemma2Config, configuration_gemma3.py
# Gemma3TextConfig) for the keys a released config leaves out: google/gemma-3-4b's text_config names only
# hidden_size, intermediate_size and num_hidden_layers of the shape, so transformers builds the rest from these.
_GEMMA_DEFAULTS = {
    "gemma2": {"vocab_size": 256000, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
               "max_position_embeddings": 8192},
    "gemma3": {"vocab_size": 262208, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
               "max_position_embeddings": 131072},
}


def _gemma(c: _Config, family: str, tied: bool = True) -> dict:
    """Gemma 2 and Gemma 3's language model: GeGLU MLP (gate, up, down), RMSNorm before and after both
    attention and MLP (4 per block), tied embeddings; Gemma 3 adds RMSNorm on each query and key head.
    The sqrt(hidden_size) embedding scale is a constant, not a parameter."""
    shape = {key: c.get(key, value) for key, value in _GEMMA_DEFAULTS[family].items()}
    bias = c.get("attention_bias", False, "bool")
    return dict(family=family, vocab_size=shape["vocab_size"], hidden_size=c.need("hidden_size"),
                num_layers=c.need("num_hidden_layers"), num_heads=shape["num_attention_heads"],
                num_kv_heads=shape["num_key_value_heads"], head_dim=shape["head_dim"],
                ffn_hidden_size=c.need("intermediate_size"), mlp="geglu",
                activation=_gelu_kind(c.get("hidden_activation", "gelu_pytorch_tanh", "str")), norms_per_layer=4,
                qk_norm=family == "gemma3", tied_embeddings=c.get("tie_word_embeddings", tied, "bool"),
                qkv_bias=bias, out_bias=bias, max_seq_len=shape["max_position_embeddings"])


def _gemma3(c: _Config) -> dict:
    """An image-text Gemma 3 config (4B, 12B, 27B): its language model, from text_config."""
    c.need("text_config", kind="dict")
    spec = _gemma(c.sub("text_config"), "gemma3", tied=c.get("tie_word_embeddings", True, "bool"))
    return {**spec, "derived": "the language model of an image-text config (text_config): the vision tower "
                               "(vision_config) and its projector are excluded"}


def _gpt2(c: _Config) -> dict:
    d = c.need("n_embd", "hidden_size")
    heads = c.need("n_head", "num_attention_heads")
    return dict(family="gpt", vocab_size=c.need("vocab_size"), hidden_size=d,
                num_layers=c.need("n_layer", "num_hidden_layers"), num_heads=heads, num_kv_heads=heads,
                ffn_hidden_size=c.get("n_inner", 4 * d), mlp="gelu", norm="layernorm", position="learned",
                activation=_gelu_kind(c.get("activation_function", "gelu_new", "str")),
                max_seq_len=c.need("n_positions", "max_position_embeddings"), tied_embeddings=True,
                qkv_bias=True, out_bias=True, mlp_bias=True)


def _gpt_neox(c: _Config) -> dict:
    heads = c.need("num_attention_heads")
    bias = c.get("attention_bias", True, "bool")
    return dict(family="gpt_neox", vocab_size=c.need("vocab_size"), hidden_size=c.need("hidden_size"),
                num_layers=c.need("num_hidden_layers"), num_heads=heads, num_kv_heads=heads,
                ffn_hidden_size=c.need("intermediate_size"), mlp="gelu", norm="layernorm",
                activation=_gelu_kind(c.get("hidden_act", "gelu", "str")),
                tied_embeddings=c.get("tie_word_embeddings", False, "bool"), qkv_bias=bias, out_bias=bias,
                mlp_bias=True, max_seq_len=c.get("max_position_embeddings", None))


def _mpt(c: _Config) -> dict:
    d = c.need("d_model")
    heads = c.need("n_heads")
    no_bias = c.get("no_bias", False, "bool")
    attn = c.sub("attn_config")
    alibi = attn.get("alibi", False, "bool")
    learned = c.get("learned_pos_emb", True, "bool") and not alibi
    attn_type = attn.get("attn_type", "multihead_attention", "str")
    kv = attn.get("kv_n_heads", heads) if attn_type == "grouped_query_attention" else heads
    if attn_type == "multiquery_attention":
        kv = 1
    ffn_cfg = c.sub("ffn_config")
    mlp = "swiglu" if ffn_cfg.get("ffn_type", "mptmlp", "str") == "mptglu" else "gelu"
    ffn = ffn_cfg.get("ffn_hidden_size", None)
    if ffn is None:
        ratio = c.need("expansion_ratio", kind="number")
        if not 1 <= ratio * d <= _MAX:  # 1e308 x d is inf: int() of it would overflow
            raise UsageError(f"{c.path}: 'expansion_ratio' {_shown(ratio)} x 'd_model' {d} is not an MLP width "
                             f"from 1 to {MAX_PARAMS:.0e} (model_type 'mpt')")
        ffn = int(ratio * d)
    return dict(family="mpt", vocab_size=c.need("vocab_size"), hidden_size=d, num_layers=c.need("n_layers"),
                num_heads=heads, num_kv_heads=kv, ffn_hidden_size=ffn, mlp=mlp,
                norm="layernorm-nobias" if no_bias else "layernorm",
                position="learned" if learned else ("alibi" if alibi else "rope"),
                max_seq_len=c.need("max_seq_len"), tied_embeddings=c.get("tie_word_embeddings", True, "bool"),
                qkv_bias=not no_bias, out_bias=not no_bias, mlp_bias=not no_bias)


def _falcon(c: _Config) -> dict:
    d = c.need("hidden_size")
    heads = c.need("num_attention_heads", "n_head")
    new_arch = c.get("new_decoder_architecture", False, "bool")
    if new_arch:
        kv = c.need("num_kv_heads", "n_head_kv")
        norms = c.get("num_ln_in_parallel_attn", 2)
    else:
        kv = 1 if c.get("multi_query", True, "bool") else heads
        norms = 1 if c.get("parallel_attn", True, "bool") else 2
    bias = c.get("bias", False, "bool")
    return dict(family="falcon", vocab_size=c.need("vocab_size"), hidden_size=d,
                num_layers=c.need("num_hidden_layers", "n_layer"), num_heads=heads, num_kv_heads=kv,
                ffn_hidden_size=c.get("ffn_hidden_size", 4 * d), mlp="gelu",
                norm="layernorm", norms_per_layer=norms, position="alibi" if c.get("alibi", False, "bool") else "rope",
                tied_embeddings=c.get("tie_word_embeddings", True, "bool"), qkv_bias=bias, out_bias=bias,
                mlp_bias=bias, max_seq_len=c.get("max_position_embeddings", None))


def _opt(c: _Config) -> dict:
    d = c.need("hidden_size")
    heads = c.need("num_attention_heads")
    bias = c.get("enable_bias", True, "bool")
    pre_ln = c.get("do_layer_norm_before", True, "bool")
    final = pre_ln and not c.get("_remove_final_layer_norm", False, "bool")
    wep = c.get("word_embed_proj_dim", d)
    # OPT's learned positions carry an offset of 2 rows
    return dict(family="opt", vocab_size=c.need("vocab_size"), hidden_size=d,
                num_layers=c.need("num_hidden_layers"), num_heads=heads, num_kv_heads=heads,
                ffn_hidden_size=c.need("ffn_dim"), mlp="gelu", norm="layernorm", position="learned",
                activation=_gelu_kind(c.get("activation_function", "relu", "str")),
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
    "qwen3": _qwen3, "gemma2": lambda c: _gemma(c, "gemma2"), "gemma3_text": lambda c: _gemma(c, "gemma3"),
    "gemma3": _gemma3,
    "gpt2": _gpt2, "gpt_neox": _gpt_neox, "mpt": _mpt, "falcon": _falcon, "opt": _opt, "bloom": _bloom,
    "mixtral": lambda c: hf_moe.mixtral(c, _llama_like(c, "mixtral")),
    "qwen2_moe": lambda c: hf_moe.qwen2_moe(c, _llama_like(c, "qwen2_moe")),
    "qwen3_moe": lambda c: hf_moe.qwen3_moe(c, _llama_like(c, "qwen3_moe")),
    "deepseek_v2": lambda c: hf_moe.deepseek(c, "deepseek_v2"),
    "deepseek_v3": lambda c: hf_moe.deepseek(c, "deepseek_v3"),
    "gpt_oss": lambda c: hf_moe.gpt_oss(c, _llama_like(c, "gpt_oss")),
}


def from_dict(data: dict[str, Any], path: str = "<config>") -> ModelSpec:
    path = printable(path)  # named in every message below
    c = _Config(data, path)
    model_type = c.need("model_type", kind="str")
    parser = PARSERS.get(model_type)
    if parser is None:
        raise UsageError(f"{path}: model_type {model_type!r} is not supported; supported: {', '.join(SUPPORTED)}")
    fields = parser(c)
    if fields.get("position", "rope") == "rope":  # rotary models: base, scaling and fraction as the file says
        fields.update(_rope(c.sub("text_config") if model_type == "gemma3" else c, model_type))
    name = data.get("_name_or_path")
    name = name if isinstance(name, str) and name.strip() else (Path(path).parent.name or model_type)
    try:  # the name goes into titles and messages: control characters as \xNN
        return ModelSpec(name=printable(name), source=f"Hugging Face config {path}", **fields)
    except ValidationError as exc:
        errors = exc.errors()
        msg = "; ".join(f"{e['loc'][0]}: {pydantic_message(e['msg'])}" if e["loc"] else pydantic_message(e["msg"])
                        for e in errors)
        too_big = any("parameters is more than" in e["msg"] for e in errors)
        raise UsageError(f"{path}: inconsistent shape: {msg}{_largest(c) if too_big else ''}") from None


_NOT_SIZES = ("max_position_embeddings", "n_positions", "max_seq_len", "num_nextn_predict_layers",
              "first_k_dense_replace", "decoder_sparse_step", "moe_layer_freq")


def _largest(c: _Config) -> str:
    """For a shape too big to model: the largest sizes the file gave (the typo is among them)."""
    sizes = {k: v for k, v in c.sizes.items() if k.rsplit(".", 1)[-1] not in _NOT_SIZES}
    top = sorted(sizes.items(), key=lambda kv: -kv[1])[:3]
    return ("; largest sizes in the file: " + ", ".join(f"'{k}' {_shown(v)}" for k, v in top)) if top else ""


def load_hf_config(path: str | Path) -> ModelSpec:
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    text = read_user_text(p, "model config")
    shown = printable(p)
    try:
        data = parse_json(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{shown}: not valid JSON: {exc}") from None
    except ValueError as exc:  # an integer of more than 4300 digits (sys.get_int_max_str_digits)
        raise UsageError(f"{shown}: not a config.json: {printable(str(exc).split(';')[0])}") from None
    except RecursionError:
        raise UsageError(f"{shown}: not valid JSON: nested too deeply") from None
    if not isinstance(data, dict):
        raise UsageError(f"{shown}: expected a JSON object (a Hugging Face config.json)")
    return from_dict(data, str(p))
