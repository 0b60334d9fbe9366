"""Launch recipes: for a chosen setup, what to run in one framework that implements exactly
that setup (its sharding, tensor/pipeline/expert parallelism, offload, recompute, precision).

`framework_reason(setup, name)` is None when the framework runs the setup as planned, else one
line saying what it lacks and which framework has it; `recipe_for(setup, name)` emits the
commands and the framework's config. "auto" takes, per setup, the first framework of AUTO_ORDER
that runs it; with a stack that is one framework's (torchtitan, megatron, deepspeed), that
framework alone: the row's speed was computed with that stack's kernels and recompute kind.
"""

from __future__ import annotations

import re

from ..setup import Setup
from . import deepspeed, hf_tp, megatron, torchtitan
from .common import Recipe

_MODULES = {m.NAME: m for m in (torchtitan, deepspeed, megatron, hf_tp)}
FRAMEWORKS: tuple[str, ...] = tuple(_MODULES)
CHOICES: tuple[str, ...] = ("auto", *FRAMEWORKS)
# DeepSpeed first: it runs any Hugging Face model from the user's script (ZeRO 0-3, offload, AutoTP,
# PEFT); torchtitan for what it alone has here (op-level selective recompute, pure bf16, tp x pp
# with FSDP); Megatron for its attention recompute and fp8; transformers' plans last.
AUTO_ORDER: tuple[str, ...] = ("deepspeed", "torchtitan", "megatron", "hf-tp")
_STACK_FRAMEWORK = {"torchtitan": "torchtitan", "megatron": "megatron", "deepspeed": "deepspeed"}
_OWN_STACK = {"torchtitan": "torchtitan", "megatron": "megatron", "deepspeed": "deepspeed", "hf-tp": "hf-trainer"}

__all__ = ["AUTO_ORDER", "CHOICES", "FRAMEWORKS", "Recipe", "framework_for", "framework_reason", "recipe_for"]


def _check(name: str) -> None:
    if name not in CHOICES:
        raise ValueError(f"unknown framework {name!r}: one of {', '.join(CHOICES)}")


def _order(s: Setup) -> tuple[str, ...]:
    own = _STACK_FRAMEWORK.get(s.stack)
    return (own,) if own else AUTO_ORDER


def framework_for(s: Setup, name: str = "auto") -> tuple[str | None, str | None]:
    """(the framework that runs `s`, None) or (None, why not): for "auto" the first in order."""
    _check(name)
    own = _STACK_FRAMEWORK.get(s.stack)
    if name != "auto" and own and own != name:  # the row's speed assumes the stack's framework, not this one
        return None, (f"--stack {s.stack} is {own}'s kernels, reduce dtype and recompute, which the row's speed "
                      f"assumes; --framework {name} runs its own: use --framework {own} or --stack "
                      f"{_OWN_STACK[name]}")
    if name != "auto":
        why = _MODULES[name].reason(s)
        return (None, why) if why else (name, None)
    whys = []
    for fw in _order(s):
        why = _MODULES[fw].reason(s)
        if why is None:
            return fw, None
        whys.append((fw, why))
    tried = set(_order(s))
    # a "use --framework Y" naming only frameworks that refused too would send the user in a circle: dropped
    return None, "no framework runs it (" + "; ".join(f"{fw}: {_no_loop(why, tried)}" for fw, why in whys) + ")"


def _no_loop(why: str, tried: set[str]) -> str:
    m = _POINTER.search(why)
    if m is None or not set(re.findall(rf"\b({_NAMES})\b", m.group(0))) <= tried:
        return why
    rest = why[m.end():]
    if rest.startswith(" or "):  # a non-framework alternative ("or --activation-checkpointing ...") stays whole
        rest = "; use " + rest[4:]
    return why[:m.start()] + rest


_NAMES = "|".join(map(re.escape, FRAMEWORKS))
_FW = rf"(?:{_NAMES})(?: \([^)]*\))?"
_POINTER = re.compile(rf"[;:] (?:use )?--framework {_FW}(?: or (?:--framework )?{_FW})*")


def framework_reason(s: Setup, name: str = "auto") -> str | None:
    """None when `name` (or, for "auto", some framework) runs exactly this setup; else why not."""
    return framework_for(s, name)[1]


def recipe_for(s: Setup, name: str = "auto") -> Recipe:
    fw, why = framework_for(s, name)
    if fw is None:
        raise ValueError(why)
    recipe = _MODULES[fw].recipe(s)
    if s.doc_len:  # the data pipeline and the attention kernel decide it, not the launch line: said where to set
        kernel = ("attn_implementation='kernels-community/vllm-flash-attn3' or 'flex_attention' (kernels that "
                  "take gpt-oss's sinks)" if s.model.attention_sinks else "attn_implementation=\"flash_attention_2\"")
        split = (f"; with --context-parallel-size {s.cp} each document is split into {2 * s.cp} zigzag chunks, two a "
                 f"rank, and padded to a multiple of {2 * s.cp} (Megatron-Core utils.py "
                 f"_get_batch_on_this_cp_rank_per_document_balancing)" if s.cp > 1 else "")
        recipe.notes.append(PACKED_DOCUMENTS[fw].format(doc_len=s.doc_len, kernel=kernel) + split)
    return recipe


_HF_FLATTENED = ("packed documents (--doc-len {doc_len}): flatten each micro-batch's documents with transformers' "
                 "DataCollatorWithFlattening (position_ids restart at each document) and load the model with "
                 "{kernel}, which runs them apart; under SDPA transformers builds a dense mask from those "
                 "position_ids (masking_utils.find_packed_sequence_indices) and every key is computed")
PACKED_DOCUMENTS = {
    "torchtitan": ("packed documents (--doc-len {doc_len}): a model flavor whose attention masks documents "
                   "apart at each EOS, mask type \"block_causal\" with FlashAttention varlen or FlexAttention as "
                   "the inner attention (llama3's 8B_varlen and 8B_flex; for other sizes the same two settings in "
                   "the model's Python config), which this command line cannot set; the estimate takes either at "
                   "the stack's attention speed (not measured)"),
    "megatron": ("packed documents (--doc-len {doc_len}): add --dataloader-inter-document-masking (the dataset "
                 "passes cu_seqlens and attention runs per document), which needs a Megatron-LM from core_v0.19.0 "
                 "(f88b85f8c6) on, not the Core this recipe is checked against; --reset-attention-mask builds a "
                 "dense mask instead, which computes every key"),
    "deepspeed": _HF_FLATTENED,
    "hf-tp": _HF_FLATTENED,
}
"""How each framework masks packed documents apart, as `estimate --doc-len` assumes (a recipe note)."""
