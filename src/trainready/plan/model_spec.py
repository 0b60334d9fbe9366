"""Decoder-only transformer shapes (dense or mixture-of-experts, GQA or multi-head latent
attention) and their exact parameter counts."""

from __future__ import annotations

from collections.abc import Callable, Collection
from functools import cached_property
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from trainready.catalog.schema import Name

MAX_PARAMS = 1e14  # 100x the largest dense model trained so far; a bigger count is a typo
# families whose Hugging Face code projects q, k and v with one module (GPT-2's c_attn, MPT's Wqkv, query_key_value)
FUSED_QKV_FAMILIES = ("gpt", "mpt", "gpt_neox", "bloom", "falcon")


class MoESpec(BaseModel):
    """Mixture-of-experts MLPs: routed experts with top-k routing, optional shared experts.

    Layer i is a MoE layer when i >= first_dense_layers and (i + 1) % layer_freq == 0
    (Hugging Face qwen2_moe/qwen3_moe `decoder_sparse_step`; DeepSeek `first_k_dense_replace`);
    the other layers use the dense MLP of ModelSpec.ffn_hidden_size."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    num_experts: int = Field(gt=0, description="routed experts per MoE layer")
    experts_per_token: int = Field(gt=0, description="top-k: routed experts each token goes to")
    expert_ffn_hidden_size: int = Field(gt=0, description="one routed expert's intermediate size "
                                                          "(per projection for gated MLPs)")
    num_shared_experts: int = Field(0, ge=0, description="experts every token goes through")
    shared_ffn_hidden_size: int | None = Field(None, gt=0, description="width of all shared experts together; "
                                                                      "default num_shared_experts x expert width")
    shared_expert_gate: bool = Field(False, description="qwen2_moe: a sigmoid gate hidden->1 on the shared expert")
    first_dense_layers: int = Field(0, ge=0, description="leading layers with the dense MLP (DeepSeek "
                                                        "first_k_dense_replace)")
    layer_freq: int = Field(1, ge=1, description="every layer_freq-th layer is MoE (qwen2_moe decoder_sparse_step)")
    router_bias: bool = Field(False, description="a per-expert bias in the router (DeepSeek-V3 "
                                                 "e_score_correction_bias)")
    capacity_factor: float | None = Field(None, gt=0, description="None: dropless routing (torchtitan, "
                                                                  "Megatron-Core dropless, MegaBlocks)")
    mtp_layers: int = Field(0, ge=0, description="DeepSeek multi-token-prediction modules: noted, not in "
                                                 "param_count (the published totals exclude them)")

    @model_validator(mode="after")
    def _check(self) -> "MoESpec":
        if self.experts_per_token > self.num_experts:
            raise ValueError(f"experts_per_token {self.experts_per_token} is more than num_experts "
                             f"{self.num_experts}: top-k can be 1..{self.num_experts}")
        if self.num_shared_experts == 0 and (self.shared_ffn_hidden_size is not None or self.shared_expert_gate):
            raise ValueError("shared_ffn_hidden_size and shared_expert_gate need num_shared_experts >= 1")
        return self

    @property
    def shared_width(self) -> int:
        """Intermediate size of all shared experts of one layer together (0: none)."""
        if not self.num_shared_experts:
            return 0
        return self.shared_ffn_hidden_size or self.num_shared_experts * self.expert_ffn_hidden_size


class MLASpec(BaseModel):
    """Multi-head latent attention (DeepSeek-V2/V3): queries and keys/values through low-rank
    projections, with a decoupled RoPE part of each key shared by all heads."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    q_lora_rank: int | None = Field(None, gt=0, description="None: a full-rank q_proj (DeepSeek-V2-Lite)")
    kv_lora_rank: int = Field(gt=0)
    qk_nope_head_dim: int = Field(gt=0)
    qk_rope_head_dim: int = Field(gt=0)
    v_head_dim: int = Field(gt=0)

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


class RopeScaling(BaseModel):
    """How the model stretches its rotary frequencies beyond the trained context (transformers' rope_scaling /
    rope_parameters: "llama3" for Llama 3.1-3.3, "yarn" for DeepSeek-V3, Kimi K2 and gpt-oss, "linear")."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    type: str = Field(pattern=r"^[a-z0-9_]{1,32}$", description="transformers' rope_type: llama3, yarn, linear, "
                                                                  "dynamic, longrope...")
    factor: float = Field(gt=0)
    low_freq_factor: float | None = Field(None, gt=0, description="llama3")
    high_freq_factor: float | None = Field(None, gt=0, description="llama3")
    original_max_position: int | None = Field(None, gt=0, description="the context before scaling")
    beta_fast: float | None = Field(None, gt=0, description="yarn")
    beta_slow: float | None = Field(None, gt=0, description="yarn")
    mscale: float | None = Field(None, ge=0, description="yarn (DeepSeek)")
    mscale_all_dim: float | None = Field(None, ge=0, description="yarn (DeepSeek)")


class ModelSpec(BaseModel):
    """The shape of a decoder-only transformer (dense or mixture-of-experts): enough to count
    parameters exactly and to derive FLOPs, activation memory and communication volume."""

    # strict: `num_layers = true` (a job file's model_spec) is an error, not 1 layer
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    name: Name  # shown in titles and messages: no control characters
    family: str = Field("llama", description="llama | gpt | mpt | falcon | opt | bloom | gpt_neox | mixtral | "
                                             "qwen2_moe | qwen3_moe | deepseek_v3 | generic ...")
    vocab_size: int = Field(gt=0)
    hidden_size: int = Field(gt=0)
    num_layers: int = Field(gt=0)
    num_heads: int = Field(gt=0)
    num_kv_heads: int = Field(gt=0)
    head_dim: int | None = Field(None, gt=0, description="default hidden_size / num_heads "
                                                         "(with MLA: qk_nope_head_dim + qk_rope_head_dim)")
    ffn_hidden_size: int = Field(gt=0, description="dense MLP intermediate size (per projection for gated MLPs); "
                                                   "MoE models: the size of their dense layers")
    mlp: Literal["swiglu", "geglu", "gelu"] = "swiglu"
    activation: Literal["silu", "gelu", "gelu_tanh_composed", "relu", "squared_relu"] | None = None
    """None: the MLP's usual one (silu for SwiGLU, gelu otherwise). gelu_tanh_composed: the
    tanh GELU written as ~8 elementwise ops (Hugging Face `gelu_new`, GPT-2): in eager mode
    each op is a kernel and several save tensors."""
    norm: Literal["rmsnorm", "layernorm", "layernorm-nobias"] = "rmsnorm"
    norms_per_layer: int = Field(2, ge=1, le=4, description="hidden-size norms per block (Gemma 2/3: 4)")
    qk_norm: bool = Field(False, description="per-head RMSNorm on queries and keys (Qwen3, Gemma 3)")
    qkv_bias: bool = False
    out_bias: bool = False
    mlp_bias: bool = False
    tied_embeddings: bool = False
    position: Literal["rope", "alibi", "learned"] = "rope"
    rope_theta: float | None = Field(None, gt=0, description="the rotary base (Hugging Face rope_theta); None: "
                                                           "not stated (recipes that must set it refuse)")
    rope_scaling: RopeScaling | None = None
    rotary_fraction: float = Field(1.0, gt=0, le=1, description="share of each head's dims that rotate "
                                                              "(Nemotron partial_rotary_factor 0.5)")
    max_seq_len: int | None = Field(None, gt=0, description="context the model was built for; learned positions use it")
    final_norm: bool = True
    embedding_dim: int | None = Field(None, gt=0, description="OPT-style word embedding size when it differs from hidden_size")
    extra_params: int = Field(0, ge=0, description="parameters outside the blocks not covered above "
                                                   "(e.g. an embedding LayerNorm)")
    sliding_window: int | None = Field(None, gt=0, description="keys each query attends to on the local "
                                                              "(sliding-window) layers, itself included (Hugging "
                                                              "Face `sliding_window`); None: every layer global")
    full_attention_every: int | None = Field(None, gt=0, description="with sliding_window: block i attends to "
                                                                    "the whole sequence when (i + 1) is a multiple "
                                                                    "of this (gpt-oss and Gemma 2: 2, Gemma 3: 6); "
                                                                    "None: every block local (Mistral v0.1)")
    attention_sinks: bool = Field(False, description="a learned logit per head in every softmax (gpt-oss "
                                                     "`sinks`): num_heads parameters per block")
    moe: MoESpec | None = Field(None, description="mixture-of-experts MLPs; None: dense")
    mla: MLASpec | None = Field(None, description="multi-head latent attention; None: multi-head/grouped-query")
    aliases: list[str] = []
    source: str = ""
    derived: str | None = Field(None, description="how the shape was derived when it is not a published one")

    @model_validator(mode="after")
    def _check(self) -> "ModelSpec":
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        if self.head_dim is None and self.mla is None and self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}; give head_dim")
        if self.activation is not None:
            ok = {"swiglu": ("silu",), "geglu": ("gelu", "gelu_tanh_composed"),
                  "gelu": ("gelu", "gelu_tanh_composed", "relu", "squared_relu")}[self.mlp]
            if self.activation not in ok:
                raise ValueError(f"a {self.mlp} MLP uses {' or '.join(ok)}, not {self.activation}")
        if self.full_attention_every is not None and self.sliding_window is None:
            raise ValueError("full_attention_every needs sliding_window: without a window every block is global")
        if self.position != "rope" and (self.rope_theta is not None or self.rope_scaling is not None):
            raise ValueError(f"rope_theta and rope_scaling need rotary positions; this shape has {self.position}")
        if self.position == "learned" and self.max_seq_len is None:
            raise ValueError("learned positions need max_seq_len")
        if self.mla is not None:
            if self.num_kv_heads != self.num_heads:
                raise ValueError(f"multi-head latent attention expands keys and values for every head: "
                                 f"num_kv_heads {self.num_kv_heads} must equal num_heads {self.num_heads}")
            if self.head_dim is not None and self.head_dim != self.mla.qk_head_dim:
                raise ValueError(f"with multi-head latent attention head_dim is qk_nope_head_dim + qk_rope_head_dim "
                                 f"= {self.mla.qk_head_dim}, not {self.head_dim}")
            if self.qk_norm:
                raise ValueError("qk_norm and multi-head latent attention together are not modelled")
        if self.moe is not None:
            if self.moe.first_dense_layers >= self.num_layers:
                raise ValueError(f"first_dense_layers {self.moe.first_dense_layers} leaves no MoE layer in "
                                 f"{self.num_layers} layers: it can be 0..{self.num_layers - 1}")
            if self.num_moe_layers == 0:
                raise ValueError(f"layer_freq {self.moe.layer_freq} with first_dense_layers "
                                 f"{self.moe.first_dense_layers} leaves no MoE layer in {self.num_layers} layers")
        if (count := self.param_count()) > MAX_PARAMS:  # a float overflows past 1e308: say "over 1e300" then
            shown = f"{count:.3g}" if count < 10**300 else "over 1e300"
            raise ValueError(f"{shown} parameters is more than the {MAX_PARAMS:.0e} this "
                             f"planner models: check the shape's sizes")
        return self

    # --- memo of the counts -----------------------------------------------------------------
    @cached_property
    def _counts(self) -> dict[tuple, int]:
        """Parameter counts already computed for this (frozen) shape: `plan` asks for them tens of
        thousands of times. Lives in the instance's __dict__, outside the fields (pydantic ignores it in
        equality, dumps and schemas); model_copy starts a copy afresh (below)."""
        return {}

    def _memo(self, key: tuple, compute: Callable[[], int]) -> int:
        counts = self._counts
        value = counts.get(key)
        if value is None:
            value = counts[key] = compute()
        return value

    def model_copy(self, *, update: dict[str, Any] | None = None, deep: bool = False) -> "ModelSpec":
        """As BaseModel.model_copy, without the original's memo: an update changes the shape."""
        copied = super().model_copy(update=update, deep=deep)
        copied.__dict__.pop("_counts", None)
        return copied

    # --- shapes -------------------------------------------------------------------------
    @property
    def hd(self) -> int:
        """Query/key head size (MLA: nope + rope part)."""
        if self.head_dim:
            return self.head_dim
        return self.mla.qk_head_dim if self.mla else self.hidden_size // self.num_heads

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.hd

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.hd

    @property
    def kv_ratio(self) -> float:
        return self.num_kv_heads / self.num_heads

    @property
    def gated_mlp(self) -> bool:
        """Gate and up projections (SwiGLU, GeGLU): three matrices."""
        return self.mlp in ("swiglu", "geglu")

    @property
    def mlp_matrices(self) -> int:
        return 3 if self.gated_mlp else 2

    @property
    def is_moe(self) -> bool:
        return self.moe is not None

    def is_moe_layer(self, i: int) -> bool:
        """Whether block i (0-based) has routed experts."""
        if self.moe is None:
            return False
        return i >= self.moe.first_dense_layers and (i + 1) % self.moe.layer_freq == 0

    @property
    def num_moe_layers(self) -> int:
        if self.moe is None:
            return 0
        first, freq = self.moe.first_dense_layers, self.moe.layer_freq
        return self.num_layers // freq - first // freq  # i+1 in (first, num_layers] divisible by freq

    @property
    def num_dense_layers(self) -> int:
        return self.num_layers - self.num_moe_layers

    def is_local_layer(self, i: int) -> bool:
        """Whether block i (0-based) attends only within sliding_window (transformers' layer_types:
        gpt-oss `"sliding_attention" if (i + 1) % 2 else "full_attention"`)."""
        if self.sliding_window is None:
            return False
        return self.full_attention_every is None or (i + 1) % self.full_attention_every != 0

    @property
    def num_local_layers(self) -> int:
        """Blocks with sliding-window attention."""
        if self.sliding_window is None:
            return 0
        every = self.full_attention_every
        return self.num_layers if every is None else self.num_layers - self.num_layers // every

    def _norm_params(self) -> int:
        return self.hidden_size * (2 if self.norm == "layernorm" else 1)

    # --- parameter counts ---------------------------------------------------------------
    def _attention_linear_params(self) -> int:
        """Weights (and biases) of the attention's linear layers: the matmul part."""
        d = self.hidden_size
        if self.mla is not None:
            a, h = self.mla, self.num_heads
            q = d * a.q_lora_rank + a.q_lora_rank * h * a.qk_head_dim if a.q_lora_rank else d * h * a.qk_head_dim
            n = q + d * (a.kv_lora_rank + a.qk_rope_head_dim)  # kv_a_proj_with_mqa
            n += a.kv_lora_rank * h * (a.qk_nope_head_dim + a.v_head_dim)  # kv_b_proj
            n += h * a.v_head_dim * d  # o_proj
            if self.qkv_bias:  # Hugging Face DeepseekV3Attention: attention_bias on q_a_proj and kv_a_proj
                n += (a.q_lora_rank or 0) + a.kv_lora_rank + a.qk_rope_head_dim
            if self.out_bias:
                n += d
            return n
        n = d * self.q_dim + 2 * d * self.kv_dim + self.q_dim * d
        if self.qkv_bias:
            n += self.q_dim + 2 * self.kv_dim
        if self.out_bias:
            n += d
        return n

    def attention_params(self) -> int:
        """One block's attention: linears, MLA's q_a/kv_a RMSNorms, Qwen3-style q/k norms."""
        n = self._attention_linear_params()
        if self.mla is not None:
            n += (self.mla.q_lora_rank or 0) + self.mla.kv_lora_rank
        if self.qk_norm:
            n += 2 * self.hd
        if self.attention_sinks:
            n += self.num_heads
        return n

    def _ffn_params(self, f: int) -> int:
        d = self.hidden_size
        n = self.mlp_matrices * d * f
        if self.mlp_bias:
            n += (self.mlp_matrices - 1) * f + d
        return n

    def dense_mlp_params(self) -> int:
        """The dense MLP (ffn_hidden_size): every layer of a dense model, the dense layers of a MoE one."""
        return self._ffn_params(self.ffn_hidden_size)

    def mlp_params(self) -> int:
        """Alias of dense_mlp_params()."""
        return self.dense_mlp_params()

    def expert_params(self) -> int:
        """One routed expert (0 for a dense model)."""
        return self._ffn_params(self.moe.expert_ffn_hidden_size) if self.moe else 0

    def shared_expert_params(self) -> int:
        """All shared experts of one MoE layer, with their gate (qwen2_moe)."""
        if self.moe is None or not self.moe.num_shared_experts:
            return 0
        return self._ffn_params(self.moe.shared_width) + (self.hidden_size if self.moe.shared_expert_gate else 0)

    def router_params(self) -> int:
        """The router of one MoE layer: hidden x experts, plus DeepSeek-V3's per-expert bias."""
        if self.moe is None:
            return 0
        return self.moe.num_experts * (self.hidden_size + (1 if self.moe.router_bias else 0))

    def moe_mlp_params(self) -> int:
        """One MoE layer's MLP: all routed experts, the shared ones and the router."""
        if self.moe is None:
            return 0
        return self.moe.num_experts * self.expert_params() + self.shared_expert_params() + self.router_params()

    def _active_moe_mlp_params(self) -> int:
        return self.moe.experts_per_token * self.expert_params() + self.shared_expert_params() + self.router_params()

    def _block(self, moe_layer: bool, active: bool = False) -> int:
        return self._memo(("block", moe_layer, active), lambda: self._count_block(moe_layer, active))

    def _count_block(self, moe_layer: bool, active: bool) -> int:
        if not moe_layer:
            mlp = self.dense_mlp_params()
        else:
            mlp = self._active_moe_mlp_params() if active else self.moe_mlp_params()
        return self.attention_params() + mlp + self.norms_per_layer * self._norm_params()

    def layer_params(self, i: int) -> int:
        """Parameters of block i (0-based): attention, its MLP (dense or MoE), norms."""
        return self._block(self.is_moe_layer(i))

    def block_params(self) -> int:
        """Parameters of the largest transformer block (what an FSDP unit usually holds)."""
        sizes = [self._block(True)] if self.num_moe_layers else []
        return max(sizes + ([self._block(False)] if self.num_dense_layers else []))

    def blocks_params(self) -> int:
        """All transformer blocks together."""
        return self.num_dense_layers * self._block(False) + self.num_moe_layers * self._block(True)

    def embedding_params(self) -> int:
        """Token (and learned position) embeddings, OPT projections, output head if untied."""
        d = self.hidden_size
        e = self.embedding_dim or d
        n = self.vocab_size * e
        if self.position == "learned":
            n += (self.max_seq_len or 0) * d
        if e != d:
            n += 2 * e * d  # project_in / project_out
        if not self.tied_embeddings:
            n += self.vocab_size * e
        return n

    def _outside_blocks(self) -> int:
        final = self._norm_params() if self.final_norm else 0
        return self.embedding_params() + final + self.extra_params

    def param_count(self) -> int:
        """Total parameters (the published "total"; DeepSeek's multi-token-prediction modules excluded)."""
        return self._memo(("total",), lambda: self.blocks_params() + self._outside_blocks())

    def active_param_count(self) -> int:
        """Parameters one token uses: experts_per_token routed experts per MoE layer (the published
        "activated" count, embeddings included). Equal to param_count() for a dense model."""
        if self.moe is None:
            return self.param_count()
        blocks = self.num_dense_layers * self._block(False) + self.num_moe_layers * self._block(True, active=True)
        return blocks + self._outside_blocks()

    def mtp_param_count(self) -> int:
        """DeepSeek-V3's multi-token-prediction modules (not in param_count): each is one MoE block,
        the eh_proj projection (2 x hidden -> hidden) and three norms (enorm, hnorm, shared_head.norm);
        embedding and output head are shared with the main model (DeepSeek-V3 README_WEIGHTS.md)."""
        if self.moe is None or not self.moe.mtp_layers:
            return 0
        d = self.hidden_size
        return self.moe.mtp_layers * (self._block(True) + 2 * d * d + 3 * self._norm_params())

    def expert_param_count(self) -> int:
        """All routed-expert parameters of all layers (what expert parallelism shards)."""
        return self.num_moe_layers * (self.moe.num_experts * self.expert_params() if self.moe else 0)

    def matmul_params(self) -> int:
        """Weights that take part in a matmul per token (blocks + output head): the N of 6N.
        MoE layers count the router, the shared experts and experts_per_token routed experts."""
        return self._memo(("matmul",), self._count_matmul_params)

    def _count_matmul_params(self) -> int:
        attn = self._attention_linear_params()
        blocks = self.num_dense_layers * (attn + self.dense_mlp_params())
        if self.moe is not None:
            blocks += self.num_moe_layers * (attn + self._active_moe_mlp_params())
        return blocks + self.vocab_size * (self.embedding_dim or self.hidden_size)

    def linear_layers(self) -> list[tuple[str, int, int]]:
        """(name, in, out) of every linear layer LoRA can adapt in one block: attention (q, k, v, o; one qkv for
        the families whose code fuses them; latent attention: q or q_a and q_b, kv_a, kv_b, o), and the dense MLP
        (dense models) or the shared experts (MoE models; none without shared experts): gate, up, down (up, down
        when not gated). LoRA on routed experts, and on the MLPs of a MoE model's dense layers, is not modelled.
        Names: plan/lora_targets.py."""
        d = self.hidden_size
        if self.mla is not None:
            a, h = self.mla, self.num_heads
            q = ([("q_a", d, a.q_lora_rank), ("q_b", a.q_lora_rank, h * a.qk_head_dim)] if a.q_lora_rank
                 else [("q", d, h * a.qk_head_dim)])
            layers = q + [("kv_a", d, a.kv_lora_rank + a.qk_rope_head_dim),
                          ("kv_b", a.kv_lora_rank, h * (a.qk_nope_head_dim + a.v_head_dim)), ("o", h * a.v_head_dim, d)]
        elif self.family in FUSED_QKV_FAMILIES:  # one module, and one adapter under PEFT (c_attn, Wqkv, ...)
            layers = [("qkv", d, self.q_dim + 2 * self.kv_dim), ("o", self.q_dim, d)]
        else:
            layers = [("q", d, self.q_dim), ("k", d, self.kv_dim), ("v", d, self.kv_dim), ("o", self.q_dim, d)]
        f = self.moe.shared_width if self.moe else self.ffn_hidden_size
        if f:
            layers += ([("gate", d, f), ("up", d, f), ("down", f, d)] if self.gated_mlp
                       else [("up", d, f), ("down", f, d)])
        return layers

    def linear_layer_dims(self, targets: Collection[str] | None = None) -> list[tuple[int, int]]:
        """(in, out) of linear_layers(), only those named in `targets` where given."""
        return [(i, o) for n, i, o in self.linear_layers() if targets is None or n in targets]

    def lora_params_per_layer(self, rank: int, targets: Collection[str] | None = None) -> int:
        """Adapter parameters of one block with rank-`rank` LoRA on the linear layers named in `targets` (None:
        every one)."""
        return sum(rank * (i + o) for i, o in self.linear_layer_dims(targets))
