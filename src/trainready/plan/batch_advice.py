"""Is the global batch large enough for the layout? A pipelined job whose ranks get too few micro-batches per
step idles in the pipeline bubble, (pp - 1) / (v m) of the step for pp stages, v virtual stages per rank and m
micro-batches (Narayanan et al. 2021, Sec. 2.2; Megatron's interleaved 1F1B): the published MoE and large
dense runs use global batches that keep it small (DeepSeek-V3: 15,360 sequences on PP16; Llama 3 405B: 16M
tokens on PP16). We say so, with the batch that brings the bubble to BUBBLE_TARGET; and where a model as large
as the largest published runs trains with a smaller batch than they started from, with theirs."""

from __future__ import annotations

import math

from .setup import Setup

BUBBLE_FLAG = 0.20
"""A bubble above this is flagged."""
BUBBLE_TARGET = 0.10
"""The suggested global batch brings the bubble to this."""


def bubble_fraction(s: Setup) -> float:
    """The bubble's share of the step: every schedule call fills and drains the pipeline (Setup.schedule_calls)."""
    return (s.pp - 1) / (s.pp_virtual * s.schedule_microbatches) if s.pp > 1 else 0.0


PUBLISHED_START_BATCHES: tuple[tuple[float, float, str], ...] = (
    (175e9, 3.2e6, "GPT-3 175B: 3.2M tokens, Brown et al. 2020, Table 2.1"),
    (405e9, 4e6, "Llama 3 405B: 4M tokens, raised to 16M, Llama 3 paper Sec. 3.4.1"),
    (671e9, 3072 * 4096, "DeepSeek-V3: 3,072 x 4,096 tokens, raised to 15,360 x 4,096, DeepSeek-V3 report Sec. 4.2"),
    (1.0e12, 67e6, "Kimi K2: 67M tokens, Kimi K2 report Sec. 2"),
)
"""(total parameters, tokens per step the published pre-training started from, source): the largest published
runs. A full-training job of a model at least this large with a smaller batch is flagged (fine-tuning runs use
smaller batches: the flag says so)."""


def published_scale_advice(s: Setup) -> str | None:
    """A note where a full-training batch is below what published pre-training of a model this size started
    from (PUBLISHED_START_BATCHES), with the batch that matches it; None otherwise."""
    if s.method != "full":
        return None
    params = s.model.param_count()
    known = [row for row in PUBLISHED_START_BATCHES if row[0] <= params * 1.01]
    if not known:
        return None
    _, tokens, source = known[-1]
    if s.tokens_per_step >= tokens:
        return None
    unit = s.dp * s.micro_batch * (s.pp if s.pp_virtual > 1 else 1)  # interleaved: micro-batches in groups of pp
    need = -(-math.ceil(tokens / s.seq_len) // unit) * unit
    return (f"global batch {s.tokens_per_step / 1e6:,.1f}M tokens is below what published pre-training of models "
            f"this size started from ({source}): --global-batch {need:,} ({need * s.seq_len / 1e6:,.1f}M tokens "
            f"per step) for pre-training; fine-tuning runs smaller batches")


def batch_advice(s: Setup) -> str | None:
    """A warning with the global batch to use, or None when the batch suits the layout and the model."""
    bubble = bubble_fraction(s)
    if bubble <= BUBBLE_FLAG:
        return published_scale_advice(s)
    m = math.ceil((s.pp - 1) / (s.pp_virtual * BUBBLE_TARGET))
    if s.pp_virtual > 1:
        m = -(-m // s.pp) * s.pp  # interleaved stages take micro-batches in whole groups of pp
    need = s.dp * s.micro_batch * m
    larger = (f"--global-batch {need:,}"
              + (f" with --pp-local-batch {need // s.dp}" if s.pp_local_batch else "")  # the whole share, one call
              + f" ({need * s.seq_len / 1e6:,.1f}M tokens per step) brings it to {BUBBLE_TARGET:.0%}")
    if s.schedule_calls > 1:  # a fill and drain per schedule call: the whole share in one call first, the batch kept
        whole = (s.pp - 1) / (s.pp_virtual * s.grad_accum)
        ways = [f"--pp-local-batch {s.global_batch // s.dp} (the step's whole share in one call) brings it to "
                f"{whole:.0%}"] + ([larger] if whole > BUBBLE_FLAG else [])
        return (f"--pp-local-batch {s.pp_local_batch} runs {s.schedule_microbatches} micro-batch(es) per pipeline "
                f"schedule call, {s.schedule_calls} calls per step, each filling and draining pp {s.pp}"
                + (f" x {s.pp_virtual} virtual" if s.pp_virtual > 1 else "")
                + f": the bubble (pp-1)/(v m) adds {bubble:.0%} to the compute time; " + "; ".join(ways))
    return (f"global batch {s.global_batch} is small for pp {s.pp}"
            + (f" x {s.pp_virtual} virtual" if s.pp_virtual > 1 else "")
            + f": with {s.grad_accum} micro-batch(es) per step the pipeline bubble (pp-1)/(v m) adds {bubble:.0%} "
            f"to the compute time; {larger}")
