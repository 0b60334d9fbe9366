"""Which LoRA adapters copy their input to fp32 (Setup.lora_fp32_copies): PEFT's fp32 adapters do, unless DeepSpeed
casts them to bf16 (not a ZeRO-Init model's), QLoRA's 4-bit layers run under autocast, or the model is fp32."""

from __future__ import annotations

import pytest

from trainready.plan import efficiency as eff
from trainready.plan.job import JobSpec
from trainready.plan.memory import estimate_memory
from trainready.plan.moe import op_sac_kept_per_token
from trainready.plan.performance import _adapter_time, estimate_step
from trainready.plan.presets import preset
from trainready.plan.setup import resolve
from trainready.plan.stacks import DEEPSPEED_CASTS, get_stack

LLAMA = preset("llama-3-8b")
D, Q, F = 4096, 4096, 14336  # Llama 3 8B: hidden, q and MLP widths
INPUTS = 3 * D + Q + 2 * D + F  # q, k, v, o, gate, up, down: each adapter's input, one per module
TOKENS = 4096
GIB = 2**30


def lora(catalog, stack, **kw):
    base = dict(model="llama-3-8b", gpu="h100-80gb", gpus=8, method="lora", micro_batch=1, global_batch=32,
                seq_len=TOKENS, precision="bf16", activation_checkpointing="none", strategy="ddp", stack=stack)
    base.update(kw)
    return resolve(JobSpec(**base), catalog)


def acts(s) -> float:
    return estimate_memory(s).activations


def test_who_copies(catalog):
    assert DEEPSPEED_CASTS in get_stack("deepspeed").lora_source and "is_zero_init_model" in DEEPSPEED_CASTS
    assert lora(catalog, "hf-trainer").lora_fp32_copies  # PEFT's fp32 adapters, nothing recasts them
    assert not lora(catalog, "deepspeed").lora_fp32_copies  # the engine casts them to bf16
    assert lora(catalog, "deepspeed", strategy="zero3").lora_fp32_copies  # ZeRO-Init: left fp32
    assert not lora(catalog, "deepspeed", strategy="zero3", method="qlora").lora_fp32_copies  # 4-bit: no ZeRO-Init
    assert not lora(catalog, "hf-trainer", method="qlora").lora_fp32_copies  # autocast: bnb casts nothing
    assert not lora(catalog, "hf-trainer", precision="fp32").lora_fp32_copies  # fp32 input: nothing to cast
    assert not lora(catalog, "megatron").lora_fp32_copies and not lora(catalog, "hf-trainer", method="full").lora_fp32_copies
    # the default stack's row that DeepSpeed runs (plan, estimate --framework deepspeed) is DeepSpeed's
    on_ds = lora(catalog, "hf-trainer").with_(runs_on="deepspeed")
    assert on_ds.on_deepspeed and not on_ds.lora_fp32_copies
    assert acts(on_ds) == pytest.approx(acts(lora(catalog, "deepspeed")), rel=1e-12)


def test_deepspeed_saves_no_fp32_copy_of_the_adapters_inputs(catalog):
    delta = acts(lora(catalog, "hf-trainer", autocast=False)) - acts(lora(catalog, "deepspeed"))
    # PEFT's fp32 copies, less what its frozen linears do not save (the two norm outputs, the eager copy before
    # o_proj, down's input): the adapters in the model's dtype read those very tensors, kept as full training keeps them
    assert delta == pytest.approx((4 * INPUTS - 2 * (2 * D + Q + F)) * LLAMA.num_layers * TOKENS, rel=1e-9)
    assert acts(lora(catalog, "deepspeed", strategy="zero3")) == pytest.approx(acts(lora(catalog, "hf-trainer",
                                                                                         autocast=False)))


def test_bf16_adapters_on_some_linears_keep_only_what_they_read(catalog):
    qv, every = lora(catalog, "deepspeed", lora_targets=["q", "v"]), lora(catalog, "deepspeed")
    # q and v read the attention norm's output; the MLP norm's output, the copy before o_proj and down's input
    # are read only by frozen linears, which save nothing for their weights
    assert acts(every) - acts(qv) == pytest.approx(2 * (D + Q + F) * LLAMA.num_layers * TOKENS, rel=1e-9)
    assert acts(qv) < acts(lora(catalog, "hf-trainer", lora_targets=["q", "v"]))
    mlp = lora(catalog, "deepspeed", lora_targets=["gate"])  # the MLP norm's output and nothing else of those
    assert acts(every) - acts(mlp) == pytest.approx(2 * (D + Q + F) * LLAMA.num_layers * TOKENS, rel=1e-9)


@pytest.mark.parametrize("model, targets", [("llama-3-8b", ["q", "v"]), ("llama-3-8b", None),
                                            ("mixtral-8x7b", None), ("qwen3-30b-a3b", ["q", "v"])])
@pytest.mark.parametrize("checkpointing", ["none", "selective-op"])
def test_qlora_never_holds_more_than_lora(catalog, model, targets, checkpointing):
    kw = dict(model=model, lora_targets=targets, activation_checkpointing=checkpointing)
    for stack in ("hf-trainer", "deepspeed"):
        assert acts(lora(catalog, stack, method="qlora", **kw)) <= acts(lora(catalog, stack, **kw)) + 1, stack


def test_moe_op_policy_memory_follows_the_copies(catalog):
    """The op policy keeps every other adapter matmul's output, in fp32 where the adapters run on an fp32 copy of
    their input (moe.op_sac_kept_per_token reads Setup.lora_copy_bytes): under autocast, LoRA's (bf16 casts) and
    QLoRA's (no copy) keep them in bf16."""
    kw = dict(model="qwen3-30b-a3b", activation_checkpointing="selective-op")
    fp32, bf16 = (op_sac_kept_per_token(lora(catalog, "hf-trainer", method=m, autocast=m == "qlora", **kw), 2, 2)
                  for m in ("lora", "qlora"))
    assert fp32[0] > bf16[0] and fp32[1] > bf16[1]
    assert op_sac_kept_per_token(lora(catalog, "hf-trainer", method="lora", **kw), 2, 2) == pytest.approx(bf16)
    ds = op_sac_kept_per_token(lora(catalog, "deepspeed", method="lora", **kw), 2, 2)
    assert ds == pytest.approx(bf16)


def test_deepspeed_adapters_run_bf16_matmuls_and_move_only_their_outputs(catalog):
    peft, ds = lora(catalog, "hf-trainer", autocast=False), lora(catalog, "deepspeed")
    e = eff.arch_efficiency(ds.gpu.arch)
    peak = ds.gpu.peak_tflops("bf16") * 1e12
    fwd, bwd, flops = _adapter_time(ds, TOKENS, peak, e)
    fwd32, bwd32, flops32 = _adapter_time(peft, TOKENS, peak, e)
    assert flops == flops32 and fwd < fwd32 and bwd < bwd32
    outputs = sum(o for _, o in LLAMA.linear_layer_dims(None))
    matmul = flops / 3 / (peak * e.gemm * 0.5)  # the forward's rank-r matmuls
    assert fwd == pytest.approx(matmul + TOKENS * 10 * outputs / (ds.gpu.hbm_gbps * 1e9 * e.memory))
    assert estimate_step(ds).step_s < estimate_step(peft).step_s


def test_qlora_under_autocast_drops_a_bf16_copy(catalog):
    """PEFT's 4-bit layers under the Trainer's autocast hand the adapters the bf16 input: dropout drops that (2 bytes
    an element read and written, a mask) where plain LoRA drops its fp32 copy (4 bytes)."""
    e = eff.arch_efficiency("hopper")
    for method, c in (("qlora", 2), ("lora", 4)):
        s, none = lora(catalog, "hf-trainer", method=method, lora_dropout=0.1), lora(catalog, "hf-trainer", method=method)
        peak = s.gpu.peak_tflops("bf16") * 1e12
        moved = TOKENS * (2 * c + 1) * INPUTS / (s.gpu.hbm_gbps * 1e9 * e.memory)
        assert _adapter_time(s, TOKENS, peak, e)[0] - _adapter_time(none, TOKENS, peak, e)[0] == pytest.approx(moved)
        extra = acts(s) - acts(none)
        assert extra == pytest.approx((1 if method == "lora" else 3) * INPUTS * LLAMA.num_layers * TOKENS, rel=1e-9)
