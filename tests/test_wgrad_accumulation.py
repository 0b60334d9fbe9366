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


def test_the_floor_counts_inputs_at_their_bytes_and_the_gradient_as_kept(catalog):
    """wgrad_floor_s: inputs rows x (k + n) at 1 byte in FP8, 2 in bf16; the output at wgrad_bytes."""
    e = eff.arch_efficiency("hopper")
    bw = lambda s: s.gpu.hbm_gbps * 1e9 * e.memory  # noqa: E731
    bf16 = setup(catalog, stack="megatron")
    fp8 = setup(catalog, stack="megatron", precision="fp8")
    w, r, k, n = 1e6, 300.0, 2048.0, 1024.0
    assert moe.wgrad_floor_s(bf16, e, w, r, k, n, False) == pytest.approx((w * 8 + r * (k + n) * 2) / bw(bf16))
    assert moe.wgrad_floor_s(fp8, e, w, r, k, n, True) == pytest.approx((w * 8 + r * (k + n) * 1) / bw(fp8))


@pytest.mark.parametrize("kw, grad_bytes, adds", [
    (dict(), 8, "embedding"),  # fp32 main_grad, read and written in the epilogue
    (dict(reduce_dtype="bf16"), 4, "embedding"),  # --grad-reduce-in-bf16: a bf16 main_grad buffer
    (dict(strategy="zero3"), 2, "shard"),  # sharded gradients: no in-place accumulation, a pass over the shard
    (dict(method="lora"), 2, "adapters"),  # frozen base: only the adapters accumulate
])
def test_megatrons_gradient_bytes_follow_its_buffer(catalog, kw, grad_bytes, adds):
    one, eight = (setup(catalog, stack="megatron", global_batch=8 * ga, **kw) for ga in (1, 8))
    assert moe.wgrad_bytes(eight) == grad_bytes
    pc = param_counts(eight)
    count = {"embedding": pc.largest_embedding, "shard": pc.trainable / 8, "adapters": pc.trainable}[adds]
    elem = {8: 4, 4: 2}.get(grad_bytes, 4)  # the accumulated element: fp32, bf16 buffer, or fp32 (sharded, adapters)
    extra = estimate_step(eight).optimizer_s - estimate_step(one).optimizer_s
    assert extra == pytest.approx(7 * count * 3 * elem / hbm(eight), rel=1e-9)


def test_each_gemm_counts_the_weights_on_its_rank(catalog):
    """Routed experts: num_experts / ep of them, each split etp ways; the router replicated on every TP rank (its
    rows the rank's tokens / tp); shared experts split over tp."""
    d, f, E = 2048, 1024, 64
    for tp, ep, etp in ((1, 8, 1), (2, 8, 1), (2, 4, 2)):
        s = setup(catalog, model=TOY, stack="megatron", gpus=16, gpus_per_node=16, tp=tp, ep=ep, etp=etp)
        router, shared_up, shared_down, up, down = moe._mlp_gemms(s, s.local_tokens, moe_layer=True)
        assert router.weights == d * E and router.rows == pytest.approx(s.local_tokens / tp)
        assert (shared_up.weights, shared_down.weights) == (d * 2 * f / tp, f / tp * d)
        assert (up.weights, down.weights) == (E / ep * d * 2 * f / etp, E / ep * f / etp * d)


def test_a_grouped_gemms_floor_reads_every_row_on_the_rank(catalog, monkeypatch):
    """The inputs a routed experts' weight gradient reads are all the rows the rank holds (every local expert's),
    not one expert's share."""
    free = lambda *a: 0.0  # noqa: E731
    e = eff.arch_efficiency("hopper")
    s = setup(catalog, model=TOY, stack="megatron", seq_len=256, activation_checkpointing="none", ep=1)
    peak, bw = s.gpu.peak_tflops("bf16") * 1e12, hbm(s)
    gemms = moe._mlp_gemms(s, s.local_tokens, moe_layer=True)
    expected = sum((g.weights * 8 + g.flops / (2 * g.k * g.n) * (g.k + g.n) * 2) / bw for g in gemms)
    with_floor = moe._mlp_time(s, e, s.local_tokens, peak, bw, free, 0.0, moe_layer=True)[1]
    monkeypatch.setattr(moe, "wgrad_floor_s", lambda *a: 0.0)
    without = moe._mlp_time(s, e, s.local_tokens, peak, bw, free, 0.0, moe_layer=True)[1]
    assert with_floor - without == pytest.approx(expected, rel=1e-9)
    assert gemms[-1].rows * 64 == pytest.approx(gemms[-1].flops / (2 * gemms[-1].k * gemms[-1].n))  # 64 experts
