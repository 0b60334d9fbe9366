"""How much attention work one token costs: causal spans with sliding windows, and what a kernel executes.

A causal forward costs 2 x span x attention_dim FLOPs per token and layer (QK and PV, 2 FLOPs a
multiply-add), where span is twice the mean number of keys a query sees: the sequence length for full
causal attention (seq/2 keys on average, the half that FlashAttention's causal mask computes). A
sliding-window layer (gpt-oss: 128 keys on every other block) sees at most `window` keys, itself
included (transformers' sliding-window mask: kv_idx > q_idx - window).

What runs depends on how the stack reaches the kernel (Stack.window_attention, Stack.sink_attention):

* "tiles": the kernel skips the key tiles the window masks out (FlashAttention's local attention,
  FlexAttention's block mask, Transformer Engine's window_size): a query tile of FLASH_TILE rows reads
  its window plus the tile itself, window + FLASH_TILE keys per query;
* "masks": the window reaches torch's SDPA as an explicit mask (transformers' sdpa path), which rules out
  the flash backend: the memory-efficient kernel computes every key of the sequence, twice the causal span;
* "eager": transformers' eager attention (gpt-oss under transformers 5.23 has `_supports_sdpa = False`):
  both matmuls over the whole seq x seq score matrix at GEMM speed, the s x s scores kept for backward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .model_spec import ModelSpec
from .stacks import Resolved, Stack, attention_assumption

FLASH_TILE = 128
"""Query rows per tile of FlashAttention-2's forward kernel at head dims up to 128 (flash-attention
csrc/flash_attn/src/flash_fwd_launch_template.h, kBlockM 128): a window is read in whole tiles."""

AttentionPath = Literal["tiles", "masks", "eager"]


def useful_keys(seq_len: float, window: int | None) -> float:
    """Mean keys per query of causal attention over `seq_len` tokens, within `window` when given."""
    if window is None or seq_len <= window:
        return seq_len / 2  # (s + 1)/2 exactly; the planner's causal convention has always been s/2
    return window - window * (window - 1) / (2 * seq_len)


@dataclass(frozen=True, slots=True)
class LayerAttention:
    """Attention of the average block: forward FLOPs per token are 2 x span x attention_dim."""

    span: float  # useful: what MFU counts
    parts: tuple[tuple[float, float, float], ...]
    """(share of the blocks, executed span, kernel length) per kind of block: the kernel length is the
    sequence length of a full causal call with the same key loop, which sets the kernel's rate."""
    path: AttentionPath

    @property
    def executed(self) -> float:
        """Mean executed span over the blocks."""
        return sum(share * span for share, span, _ in self.parts)


def layer_attention(m: ModelSpec, seq_len: float, path: AttentionPath = "tiles") -> LayerAttention:
    """The blocks' attention over a sequence of `seq_len` tokens (a context-parallel chunk's length is the
    caller's choice). `path` says what a windowed block executes; full blocks run causal, except under
    "eager", which computes every score."""
    local, n = m.num_local_layers, m.num_layers
    local_span = 2 * useful_keys(seq_len, m.sliding_window) if local else 0.0
    span = ((n - local) * seq_len + local * local_span) / n
    if path == "eager":
        return LayerAttention(span, ((1.0, 2 * seq_len, seq_len),), path)
    if not local:
        return LayerAttention(span, ((1.0, seq_len, seq_len),), path)
    if path == "masks":
        local_part = (local / n, 2 * seq_len, seq_len)
    else:
        executed = min(seq_len, 2 * (m.sliding_window + FLASH_TILE))
        local_part = (local / n, executed, executed)
    parts = ((1 - local / n, seq_len, seq_len), local_part) if local < n else (local_part,)
    return LayerAttention(span, parts, path)


def attention_path(m: ModelSpec, stack: Stack, attention_kernel: str) -> AttentionPath:
    """What a block of `m` runs under `stack`: the stack's own attention ("eager" for sinks and "masks" for
    windows under transformers), or "tiles" where the job named another kernel (--attention-kernel), which
    takes the window and sinks itself."""
    if attention_kernel != stack.attention_kernel:
        return "tiles"
    if m.attention_sinks and stack.sink_attention == "eager":
        return "eager"
    if m.sliding_window is not None and stack.window_attention == "masks":
        return "masks"
    return "tiles"


def attention_note(m: ModelSpec, r: Resolved, arch: str) -> str | None:
    """What the attention figure assumes: transformers' eager or masked path for this model where the stack
    takes it, else what "sdpa" means on this GPU (stacks.attention_assumption)."""
    path = attention_path(m, r.stack, r.attention_kernel)
    if path == "eager":
        return (f"attention: {m.name} has learned sinks, which torch SDPA lacks: transformers runs its eager "
                f"attention (both matmuls over every score, the seq x seq scores kept for backward); if the model "
                f"loads with attn_implementation='kernels-community/vllm-flash-attn3' (FlashAttention-3 with "
                f"sinks) or 'flex_attention', give --attention-kernel flash2")
    said = attention_assumption(r, arch)
    if path == "masks":
        masked = (f"attention: {m.name}'s sliding-window blocks reach torch SDPA with an explicit mask, "
                  f"which computes every key (no tile skipped); with attn_implementation='flash_attention_2' "
                  f"give --attention-kernel flash2")
        return f"{masked}; {said}" if said else masked
    return said
