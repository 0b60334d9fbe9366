"""Megatron-Core's vocabulary-parallel cross entropy makes one fp32 copy of the logits and turns it into the softmax
and then the gradient in place (tensor_parallel/cross_entropy.py): its peak is that buffer beside the bf16 logits or
their gradient, 6 bytes a logit, where torch's cross entropy holds 12-14."""

import pytest

from trainready.plan.activations import loss_bytes_per_token
from trainready.plan.job import JobSpec
from trainready.plan.memory import activation_parts
from trainready.plan.presets import preset
from trainready.plan.setup import resolve
from trainready.plan.stacks import get_stack


def test_the_in_place_loss_is_the_fp32_copy_beside_the_logits():
    m = preset("nemotron-4-15b")
    assert loss_bytes_per_token(m, 2, inplace=True) == 6 * m.vocab_size
    assert loss_bytes_per_token(m, 2) == 14 * m.vocab_size  # torch's: logits + log-softmax + two fp32 buffers
    assert get_stack("megatron").inplace_cross_entropy
    assert not any(get_stack(n).inplace_cross_entropy for n in ("torchtitan", "deepspeed", "hf-trainer", "automodel"))


def test_megatrons_loss_memory_per_rank(catalog):
    """Nemotron-4 15B (a 256k vocabulary) at tp 2: the loss of 8,192 tokens a micro-batch is 6 bytes per logit over the
    two TP ranks; the same job under torchtitan's stack holds more."""
    kw = dict(model="nemotron-4-15b", gpu="h100-80gb", gpus=16, gpus_per_node=8, inter_node_gbps=3200, tp=2,
              micro_batch=2, global_batch=64, seq_len=4096)
    mega = resolve(JobSpec(stack="megatron", strategy="zero1", **kw), catalog)
    loss = activation_parts(mega)[2]
    assert loss == pytest.approx(2 * 4096 * (6 * mega.model.vocab_size) / 2, rel=0.02)  # the final norm's few bytes aside
    titan = resolve(JobSpec(stack="torchtitan", strategy="zero3", **kw), catalog)
    assert activation_parts(titan)[2] > 1.5 * loss
