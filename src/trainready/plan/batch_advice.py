"""Is the global batch large enough for the layout? A pipelined job whose ranks get too few micro-batches per
step idles in the pipeline bubble, (pp - 1) / (v m) of the step for pp stages, v virtual stages per rank and m
micro-batches (Narayanan et al. 2021, Sec. 2.2; Megatron's interleaved 1F1B): the published MoE and large
dense runs use global batches that keep it small (DeepSeek-V3: 15,360 sequences on PP16; Llama 3 405B: 16M
tokens on PP16). We say so, with the batch that brings the bubble to BUBBLE_TARGET."""

from __future__ import annotations

import math

from .setup import Setup

BUBBLE_FLAG = 0.20
"""A bubble above this is flagged."""
BUBBLE_TARGET = 0.10
"""The suggested global batch brings the bubble to this."""


def bubble_fraction(s: Setup) -> float:
    return (s.pp - 1) / (s.pp_virtual * s.grad_accum) if s.pp > 1 else 0.0


def batch_advice(s: Setup) -> str | None:
    """A warning with the global batch to use, or None when the batch suits the layout."""
    bubble = bubble_fraction(s)
    if bubble <= BUBBLE_FLAG:
        return None
    m = math.ceil((s.pp - 1) / (s.pp_virtual * BUBBLE_TARGET))
    if s.pp_virtual > 1:
        m = -(-m // s.pp) * s.pp  # interleaved stages take micro-batches in whole groups of pp
    need = s.dp * s.micro_batch * m
    return (f"global batch {s.global_batch} is small for pp {s.pp}"
            + (f" x {s.pp_virtual} virtual" if s.pp_virtual > 1 else "")
            + f": with {s.grad_accum} micro-batch(es) per step the pipeline bubble (pp-1)/(v m) adds {bubble:.0%} "
            f"to the compute time; --global-batch {need:,} ({need * s.seq_len / 1e6:,.1f}M tokens per step) "
            f"brings it to {BUBBLE_TARGET:.0%}")
