"""Gradient accumulation's memory traffic: Megatron-Core's weight-gradient GEMMs add into the fp32 gradient buffer
in their epilogue (gradient_accumulation_fusion), so a micro-batch makes no separate pass over the gradients;
other stacks add each micro-batch's gradients in a pass of their own. With few rows per expert the epilogue's
fp32 read and write, not the FLOPs, set a routed expert's weight-gradient time."""

import pytest

from trainready.plan import efficiency as eff
from trainready.plan import moe
from trainready.plan.job import JobSpec
from trainready.plan.memory import param_counts
from trainready.plan.model_spec import ModelSpec, MoESpec
from trainready.plan.performance import _gemm_time, estimate_step
from trainready.plan.setup import resolve
from trainready.plan.stacks import get_stack

TOY = ModelSpec(name="toy-moe", vocab_size=32000, hidden_size=2048, num_layers=8, num_heads=16, num_kv_heads=4,
                ffn_hidden_size=8192, moe=MoESpec(num_experts=64, experts_per_token=2, expert_ffn_hidden_size=1024,
                                                   num_shared_experts=1, first_dense_layers=1))


def setup(catalog, model="llama-3.1-8b", **kw):
    base = dict(gpu="h100-80gb", gpus=8, micro_batch=1, seq_len=4096, strategy="zero1")
    base.update(kw)
    if isinstance(model, str):
        return resolve(JobSpec(model=model, **base), catalog)
    return resolve(JobSpec(**base), catalog, model=model)


def hbm(s):
    return s.gpu.hbm_gbps * 1e9 * eff.arch_efficiency(s.gpu.arch).memory


def test_only_megatron_accumulates_in_its_gemms():
    assert get_stack("megatron").wgrad_accumulates
    assert not any(get_stack(n).wgrad_accumulates for n in ("torchtitan", "deepspeed", "hf-trainer", "automodel"))


@pytest.mark.parametrize("stack", ["megatron", "deepspeed"])
def test_each_micro_batch_after_the_first_adds_what_the_gemms_leave(catalog, stack):
    """Eight micro-batches a step against one: seven adds, of the embedding table alone under Megatron (its
    gradient reaches main_grad through the DDP hook), of every local parameter elsewhere (12 bytes each)."""
    one, eight = (setup(catalog, stack=stack, global_batch=8 * ga) for ga in (1, 8))
    assert (one.grad_accum, eight.grad_accum) == (1, 8)
    pc = param_counts(eight)
    adds = pc.largest_embedding if stack == "megatron" else pc.trainable
    extra = estimate_step(eight).optimizer_s - estimate_step(one).optimizer_s
    assert extra == pytest.approx(7 * adds * 12 / hbm(eight), rel=1e-9)
    if stack == "megatron":  # a few percent of the parameters of an 8B model: the embedding table
        assert adds < 0.1 * pc.trainable


def test_a_routed_experts_weight_gradient_moves_its_fp32_gradient(catalog):
    """With the GEMMs infinitely fast the MoE layer's backward is its bytes: Megatron's epilogue reads and writes
    8 bytes per weight element, a stack that writes bf16 gradients 2; the difference is 6 bytes per weight of every
    GEMM whose gradient is computed (router, shared and routed experts)."""
    free = lambda *a: 0.0  # noqa: E731
    e = eff.arch_efficiency("hopper")
    out = {}
    for stack in ("megatron", "torchtitan"):
        s = setup(catalog, model=TOY, stack=stack, seq_len=256, activation_checkpointing="none", ep=1, strategy="zero1")
        peak = s.gpu.peak_tflops("bf16") * 1e12
        out[stack] = moe._mlp_time(s, e, s.local_tokens, peak, hbm(s), free, 0.0, moe_layer=True)
        weights = sum(g.weights for g in moe._mlp_gemms(s, s.local_tokens, moe_layer=True))
    assert weights == pytest.approx(2048 * 64 + 3 * 2048 * 1024 * (64 + 1))  # router, 64 routed + 1 shared expert
    assert out["megatron"][0] == pytest.approx(out["torchtitan"][0])  # forward: no weight gradient
    assert out["megatron"][1] - out["torchtitan"][1] == pytest.approx(6 * weights / hbm(s), rel=1e-9)


def test_the_floor_leaves_long_rows_to_the_flops(catalog):
    """A dense MLP at 8,192 tokens a micro-batch is compute-bound on either stack: the same backward."""
    e = eff.arch_efficiency("hopper")
    times = []
    for stack in ("megatron", "torchtitan"):
        s = setup(catalog, model=TOY, stack=stack, seq_len=8192, activation_checkpointing="none")
        peak = s.gpu.peak_tflops("bf16") * 1e12
        times.append(moe._mlp_time(s, e, s.local_tokens, peak, hbm(s), _gemm_time, 0.0, moe_layer=False))
    assert times[0] == pytest.approx(times[1])


def test_a_dense_models_weight_gradients_have_the_same_floor(catalog, monkeypatch):
    """The blocks' GEMMs of a dense model take the same floor: with every GEMM infinitely fast, the output bytes of
    the weight gradients (8 per weight under Megatron) are what is left of them in backward."""
    from trainready.plan import performance

    s = setup(catalog, stack="megatron", seq_len=256, activation_checkpointing="none")
    e = eff.arch_efficiency(s.gpu.arch)
    monkeypatch.setattr(performance, "_gemm_time", lambda *a: 0.0)
    with_out = performance._micro_batch_time(s, e).bwd_s
    monkeypatch.setattr(moe, "wgrad_bytes", lambda s: 0.0)
    without = performance._micro_batch_time(s, e).bwd_s
    weights = sum(k * n * c for k, n, c in performance._gemms(s))  # one block's linear weights
    hbm_bps = s.gpu.hbm_gbps * 1e9 * e.memory  # a fused stack's memory efficiency
    assert with_out - without == pytest.approx(s.stage_layers * weights * 8 / hbm_bps, rel=1e-9)
