"""LoRA under DeepSpeed: the engine casts PEFT's adapters to bf16, so no adapter keeps an fp32 copy of its input."""

from __future__ import annotations

import pytest

from trainready.plan import efficiency as eff
from trainready.plan.job import JobSpec
from trainready.plan.memory import estimate_memory
from trainready.plan.performance import _adapter_time, estimate_step
from trainready.plan.presets import preset
from trainready.plan.setup import resolve
from trainready.plan.stacks import get_stack

LLAMA = preset("llama-3-8b")
D, Q, F = 4096, 4096, 14336  # Llama 3 8B: hidden, q and MLP widths
INPUTS = 3 * D + Q + 2 * D + F  # q, k, v, o, gate, up, down: each adapter's input, one per module
TOKENS = 4096


def lora(catalog, stack, **kw):
    base = dict(model="llama-3-8b", gpu="h100-80gb", gpus=8, method="lora", micro_batch=1, global_batch=32,
                seq_len=TOKENS, precision="bf16", activation_checkpointing="none", strategy="zero2", stack=stack)
    base.update(kw)
    return resolve(JobSpec(**base), catalog)


def test_the_stack_says_why_its_adapters_are_bf16():
    stack = get_stack("deepspeed")
    assert not stack.lora_fp32_adapters
    assert "_cast_module_mixed_precision" in stack.lora_source and "native_amp" in stack.lora_source
    assert get_stack("hf-trainer").lora_fp32_adapters  # PEFT's own fp32 adapters, where nothing recasts them


def test_deepspeed_saves_no_fp32_copy_of_the_adapters_inputs(catalog):
    peft, ds = lora(catalog, "hf-trainer"), lora(catalog, "deepspeed")
    delta = estimate_memory(peft).activations - estimate_memory(ds).activations
    # PEFT's fp32 copies, less what its frozen linears do not save (the two norm outputs, the eager copy before
    # o_proj, down's input): the adapters in the model's dtype read those very tensors, kept as full training keeps them
    assert delta == pytest.approx((4 * INPUTS - 2 * (2 * D + Q + F)) * LLAMA.num_layers * TOKENS, rel=1e-9)


def test_dropout_under_deepspeed_keeps_a_bf16_dropped_copy_and_its_mask(catalog):
    with_, without = lora(catalog, "deepspeed", lora_dropout=0.1), lora(catalog, "deepspeed")
    delta = estimate_memory(with_).activations - estimate_memory(without).activations
    assert delta == pytest.approx((2 + 1) * INPUTS * LLAMA.num_layers * TOKENS, rel=1e-9)


def test_deepspeed_adapters_run_bf16_matmuls_and_move_only_their_outputs(catalog):
    peft, ds = lora(catalog, "hf-trainer"), lora(catalog, "deepspeed")
    e = eff.arch_efficiency(ds.gpu.arch)
    peak = ds.gpu.peak_tflops("bf16") * 1e12
    fwd, bwd, flops = _adapter_time(ds, TOKENS, peak, e)
    fwd32, bwd32, flops32 = _adapter_time(peft, TOKENS, peak, e)
    assert flops == flops32 and fwd < fwd32 and bwd < bwd32
    outputs = sum(o for _, o in LLAMA.linear_layer_dims(None))
    matmul = flops / 3 / (peak * e.gemm * 0.5)  # the forward's rank-r matmuls
    assert fwd == pytest.approx(matmul + TOKENS * 10 * outputs / (ds.gpu.hbm_gbps * 1e9 * e.memory))
    assert estimate_step(ds).step_s < estimate_step(peft).step_s


def test_qlora_under_the_trainers_autocast_copies_nothing(catalog):
    """PEFT's 4-bit layers cast the adapters' input only outside autocast (bnb.py Linear4bit.forward), and the
    Trainer's bf16=True runs autocast: QLoRA keeps what DeepSpeed's bf16 adapters keep, plain LoRA its fp32 copies."""
    assert get_stack("hf-trainer").autocast and not get_stack("deepspeed").autocast
    hf_q, ds_q = lora(catalog, "hf-trainer", method="qlora"), lora(catalog, "deepspeed", method="qlora")
    assert not hf_q.lora_fp32_copies and lora(catalog, "hf-trainer").lora_fp32_copies
    assert estimate_memory(hf_q).activations == pytest.approx(estimate_memory(ds_q).activations, rel=1e-12)
    e = eff.arch_efficiency(hf_q.gpu.arch)
    peak = hf_q.gpu.peak_tflops("bf16") * 1e12
    assert _adapter_time(hf_q, TOKENS, peak, e) == pytest.approx(_adapter_time(ds_q, TOKENS, peak, e))
    hf_l = lora(catalog, "hf-trainer")
    assert estimate_memory(hf_l).activations > estimate_memory(hf_q).activations
