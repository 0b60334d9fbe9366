"""Decoder-only transformer shapes and their exact parameter counts."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from trainready.catalog.schema import Name

MAX_PARAMS = 1e14  # 100x the largest dense model trained so far; a bigger count is a typo


class ModelSpec(BaseModel):
    """The shape of a dense decoder-only transformer: enough to count parameters exactly
    and to derive FLOPs, activation memory and communication volume."""

    # strict: `num_layers = true` (a job file's model_spec) is an error, not 1 layer
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    name: Name  # shown in titles and messages: no control characters
    family: str = Field("llama", description="llama | gpt | mpt | falcon | opt | bloom | gpt_neox | generic")
    vocab_size: int = Field(gt=0)
    hidden_size: int = Field(gt=0)
    num_layers: int = Field(gt=0)
    num_heads: int = Field(gt=0)
    num_kv_heads: int = Field(gt=0)
    head_dim: int | None = Field(None, gt=0, description="default hidden_size / num_heads")
    ffn_hidden_size: int = Field(gt=0, description="MLP intermediate size (per projection for SwiGLU)")
    mlp: Literal["swiglu", "gelu"] = "swiglu"
    activation: Literal["silu", "gelu", "gelu_tanh_composed", "relu"] | None = None
    """None: the MLP's usual one (silu for SwiGLU, gelu otherwise). gelu_tanh_composed: the
    tanh GELU written as ~8 elementwise ops (Hugging Face `gelu_new`, GPT-2): in eager mode
    each op is a kernel and several save tensors."""
    norm: Literal["rmsnorm", "layernorm", "layernorm-nobias"] = "rmsnorm"
    norms_per_layer: int = Field(2, ge=1, le=2)
    qkv_bias: bool = False
    out_bias: bool = False
    mlp_bias: bool = False
    tied_embeddings: bool = False
    position: Literal["rope", "alibi", "learned"] = "rope"
    max_seq_len: int | None = Field(None, gt=0, description="context the model was built for; learned positions use it")
    final_norm: bool = True
    embedding_dim: int | None = Field(None, gt=0, description="OPT-style word embedding size when it differs from hidden_size")
    extra_params: int = Field(0, ge=0, description="parameters outside the blocks not covered above "
                                                   "(e.g. an embedding LayerNorm)")
    aliases: list[str] = []
    source: str = ""
    derived: str | None = Field(None, description="how the shape was derived when it is not a published one")

    @model_validator(mode="after")
    def _check(self) -> "ModelSpec":
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        if self.head_dim is None and self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}; give head_dim")
        if self.activation is not None and (self.mlp == "swiglu") != (self.activation == "silu"):
            raise ValueError("SwiGLU MLPs use silu; GELU-style MLPs use gelu, gelu_tanh_composed or relu")
        if self.position == "learned" and self.max_seq_len is None:
            raise ValueError("learned positions need max_seq_len")
        if self.param_count() > MAX_PARAMS:
            raise ValueError(f"{self.param_count():.3g} parameters is more than the {MAX_PARAMS:.0e} this "
                             f"planner models: check the shape's sizes")
        return self

    # --- shapes -------------------------------------------------------------------------
    @property
    def hd(self) -> int:
        return self.head_dim or self.hidden_size // self.num_heads

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
    def mlp_matrices(self) -> int:
        return 3 if self.mlp == "swiglu" else 2

    def _norm_params(self) -> int:
        return self.hidden_size * (2 if self.norm == "layernorm" else 1)

    # --- parameter counts ---------------------------------------------------------------
    def attention_params(self) -> int:
        d = self.hidden_size
        n = d * self.q_dim + 2 * d * self.kv_dim + self.q_dim * d
        if self.qkv_bias:
            n += self.q_dim + 2 * self.kv_dim
        if self.out_bias:
            n += d
        return n

    def mlp_params(self) -> int:
        d, f = self.hidden_size, self.ffn_hidden_size
        n = self.mlp_matrices * d * f
        if self.mlp_bias:
            n += (self.mlp_matrices - 1) * f + d
        return n

    def block_params(self) -> int:
        """Parameters of one transformer block (what an FSDP unit usually holds)."""
        return self.attention_params() + self.mlp_params() + self.norms_per_layer * self._norm_params()

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

    def param_count(self) -> int:
        final = self._norm_params() if self.final_norm else 0
        return self.num_layers * self.block_params() + self.embedding_params() + final + self.extra_params

    def matmul_params(self) -> int:
        """Weights that take part in a matmul per token (blocks + output head): the N of 6N."""
        blocks = self.num_layers * (self.attention_params() + self.mlp_params())
        return blocks + self.vocab_size * (self.embedding_dim or self.hidden_size)

    def linear_layer_dims(self) -> list[tuple[int, int]]:
        """(in, out) of every linear layer in one block, for LoRA adapter sizes."""
        d, f = self.hidden_size, self.ffn_hidden_size
        dims = [(d, self.q_dim), (d, self.kv_dim), (d, self.kv_dim), (self.q_dim, d)]
        if self.mlp == "swiglu":
            dims += [(d, f), (d, f), (f, d)]
        else:
            dims += [(d, f), (f, d)]
        return dims

    def lora_params_per_layer(self, rank: int) -> int:
        """Adapter parameters of one block with rank-`rank` LoRA on every linear layer."""
        return sum(rank * (i + o) for i, o in self.linear_layer_dims())
