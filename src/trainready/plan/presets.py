"""Model presets (data file), alias lookup, and generic shapes derived from a parameter count."""

from __future__ import annotations

import functools
import tomllib
from importlib import resources

from pydantic import BaseModel

from trainready.errors import UnknownNameError, UsageError, normalize_name

from .model_spec import ModelSpec


class ModelEntry(ModelSpec):
    params: int
    active_params: int  # parameters one token uses (top-k routed experts); equal to params for dense models


class ModelList(BaseModel):
    """`trainready catalog models --json`"""

    schema_version: int = 1
    models: list[ModelEntry]


@functools.lru_cache(maxsize=1)
def presets() -> dict[str, ModelSpec]:
    text = (resources.files("trainready.plan") / "data" / "models.toml").read_text()
    data = tomllib.loads(text)
    out: dict[str, ModelSpec] = {}
    for raw in data["model"]:
        spec = ModelSpec.model_validate(raw)
        if spec.name in out:
            raise ValueError(f"duplicate model preset {spec.name}")
        out[spec.name] = spec
    return out


def preset(name: str) -> ModelSpec:
    """A preset by name or alias (case and separators ignored)."""
    key = normalize_name(name)
    for spec in presets().values():
        if key in (normalize_name(spec.name), *(normalize_name(a) for a in spec.aliases)):
            return spec
    raise UnknownNameError("model", name, presets(),
                           "Or describe it with --model-config config.json or --params 13e9.")


ASPECT_RATIO = 128  # hidden_size / num_layers, as in Llama-2 7B and 13B (4096/32, 5120/40)
HEAD_DIM = 128
GENERIC_VOCAB = 32000


def _shape(layers: int) -> ModelSpec:
    d = ASPECT_RATIO * layers
    heads = d // HEAD_DIM
    ffn = int(round(8 * d / 3 / 256)) * 256  # SwiGLU width 8/3 d, rounded as Llama does
    kv = 8 if heads >= 64 and heads % 8 == 0 else heads  # GQA from 70B-class widths up, as Llama-2/3
    return ModelSpec(name="generic", family="generic", vocab_size=GENERIC_VOCAB, hidden_size=d,
                     num_layers=layers, num_heads=heads, num_kv_heads=kv, ffn_hidden_size=ffn,
                     rope_theta=10000.0)  # a shape to pre-train from scratch: Megatron's and transformers' base


def generic_model(params: float) -> ModelSpec:
    """A Llama-style dense decoder with about `params` parameters.

    Shape by the usual aspect ratios: hidden = 128 x layers, head dim 128, SwiGLU width
    8/3 x hidden (multiple of 256), vocab 32000, untied embeddings; GQA with 8 KV heads
    from 64 heads up. The layer count is the one whose total is nearest to `params`.
    """
    if not params or params <= 0:
        raise UsageError(f"--params must be a positive number of parameters (got {params}), e.g. 13e9")
    if params < 1e6 or params > 1e13:
        raise UsageError(f"--params {params:g} is outside 1e6..1e13; give the count in parameters, e.g. 13e9")
    best = min((_shape(n) for n in range(1, 400)), key=lambda s: abs(s.param_count() - params))
    label = f"generic-{params / 1e9:g}b"
    note = (f"shape derived from --params {params / 1e9:g}B by the usual aspect ratios: {best.num_layers} layers, "
            f"hidden {best.hidden_size}, {best.num_heads} heads (KV {best.num_kv_heads}), SwiGLU "
            f"{best.ffn_hidden_size}, vocab {best.vocab_size}: {best.param_count() / 1e9:.2f}B parameters")
    return best.model_copy(update={"name": label, "derived": note})
