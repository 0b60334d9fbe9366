"""Bytes autograd saves per token and layer in a transformers Llama with PEFT's fp32 LoRA adapters, on CPU.
tests/test_lora_autocast.py imports the model (peft_llama) and the count (per_token_layer), and runs this file as a
script for FSDP2 (fully_shard, MixedPrecisionPolicy(param_dtype=bf16), as accelerate's FSDP plugin and torchtitan
set it), which needs a process group: one gloo rank on an in-memory store, made and destroyed here. The script prints
one JSON object: {"plain": [no autocast, autocast], "fsdp": [...], "hidden": ..., "ffn": ..., "rank": ...}, for
adapters on every linear layer."""

from __future__ import annotations

import json

import torch
import torch.distributed as dist
from peft import LoraConfig, get_peft_model
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from transformers import LlamaConfig, LlamaForCausalLM

H, F, LAYERS, RANK = 256, 640, 2, 4


def per_token_layer(model, autocast: bool) -> float:
    """The slope of saved bytes over two sequence lengths, per layer (weights and their casts drop out; the head's
    logits are the same in every variant)."""
    def saved(seq: int) -> int:
        seen = {}

        def pack(t):
            seen[(t.data_ptr(), t.dtype, tuple(t.shape))] = t.numel() * t.element_size()
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                model(input_ids=torch.randint(0, 128, (1, seq)))
        return sum(seen.values())
    return (saved(192) - saved(64)) / 128 / LAYERS


def peft_llama(targets: str | list[str] = "all-linear"):
    """A bf16 transformers Llama (H wide, LAYERS deep) with PEFT's LoRA adapters (fp32, PEFT's default) on `targets`:
    the causal LM under PEFT's wrapper, its embedding taking a gradient so every layer's input needs one."""
    config = LlamaConfig(vocab_size=128, hidden_size=H, intermediate_size=F, num_hidden_layers=LAYERS,
                         num_attention_heads=8, num_key_value_heads=2, head_dim=32, attn_implementation="sdpa")
    torch.manual_seed(0)
    peft = get_peft_model(LlamaForCausalLM(config).to(torch.bfloat16),
                          LoraConfig(r=RANK, lora_alpha=8, target_modules=targets)).train()
    model = peft.base_model.model
    model.model.embed_tokens.weight.requires_grad_(True)
    return model


def main() -> None:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        out = {"hidden": H, "ffn": F, "rank": RANK}
        for name in ("plain", "fsdp"):
            model = peft_llama()
            if name == "fsdp":
                policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
                for layer in model.model.layers:
                    fully_shard(layer, mp_policy=policy, reshard_after_forward=False)
                fully_shard(model, mp_policy=policy, reshard_after_forward=False)
            out[name] = [per_token_layer(model, autocast) for autocast in (False, True)]
        print(json.dumps(out))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
