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
    return _MODULES[fw].recipe(s)
