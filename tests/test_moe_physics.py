"""Mixture-of-experts physics: expert parallelism in memory, all-to-alls, active-parameter
FLOPs, the --ep option and the plan's EP degrees."""

import dataclasses
import json
import math

import pytest
from cloud_stubs import cli_run

from trainready.errors import UsageError
from trainready.plan import efficiency as eff
from trainready.plan import moe
from trainready.plan.job import JobSpec
from trainready.plan.memory import activation_parts, estimate_memory, param_counts
from trainready.plan.model_spec import ModelSpec, MoESpec
from trainready.plan.performance import dp_layout, estimate_step, links, model_flops_per_token
from trainready.plan.search import PlanRequest, plan
from trainready.plan.setup import in_flight_micro_batches, pipeline_ranks, pipeline_split, resolve

# A small DeepSeek-like shape: a dense first layer, then MoE layers with a shared expert.
TOY = ModelSpec(name="toy-moe", vocab_size=32000, hidden_size=2048, num_layers=8, num_heads=16, num_kv_heads=4,
                ffn_hidden_size=8192, moe=MoESpec(num_experts=16, experts_per_token=4, expert_ffn_hidden_size=1024,
                                                   num_shared_experts=1, first_dense_layers=1))


def setup(catalog, model=TOY, **kw):
    base = dict(gpu="h100-80gb", gpus=8, micro_batch=1, seq_len=2048)
    base.update(kw)
    if isinstance(model, str):
        return resolve(JobSpec(model=model, **base), catalog)
    return resolve(JobSpec(**base), catalog, model=model)


def cli(*args):
    proc = cli_run(*args)  # in this process
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    return proc


def test_stage_params_count_every_block_once(catalog):
    s = setup(catalog, pp=1, ep=1)
    pc = param_counts(s)
    assert pc.local - pc.embed == pytest.approx(TOY.blocks_params())
    assert pc.expert == pytest.approx(TOY.expert_param_count())
    assert pc.block == TOY.block_params()  # the largest block: one FSDP unit
    # ep 8: one GPU holds 2 of the 16 experts of each MoE layer
    pc8 = param_counts(setup(catalog, ep=8))
    assert pc8.expert == pytest.approx(TOY.expert_param_count() / 8)
    assert pc.local - pc8.local == pytest.approx(TOY.expert_param_count() * 7 / 8)
    # two pipeline stages: the worst holds 4 MoE layers, the other the dense one and 3 MoE layers
    assert moe.stage_mix(TOY, 2) == [(1, 3), (0, 4)]
    pc2 = param_counts(setup(catalog, pp=2, strategy="zero1"))
    moe_layer = TOY.layer_params(1)
    assert pc2.local - pc2.embed == pytest.approx(4 * moe_layer)


@pytest.mark.parametrize("strategy, bytes_unsharded", [("ddp", 18), ("zero1", 6)])
def test_memory_falls_with_ep_by_the_expert_share(catalog, strategy, bytes_unsharded):
    """DDP keeps 18 bytes per parameter on every GPU, ZeRO-1 the bf16 weights and fp32 grads (6):
    EP shards exactly the routed experts' share of those; sharded states do not change."""
    experts = TOY.expert_param_count()
    base = estimate_memory(setup(catalog, strategy=strategy, ep=1)).states_full
    for ep in (2, 4, 8):
        states = estimate_memory(setup(catalog, strategy=strategy, ep=ep)).states_full
        assert base - states == pytest.approx(bytes_unsharded * experts * (1 - 1 / ep), rel=1e-9)


def test_fsdp_units_shrink_with_ep_but_shards_do_not(catalog):
    one, eight = (estimate_memory(setup(catalog, strategy="zero3", ep=ep)) for ep in (1, 8))
    assert eight.optimizer == pytest.approx(one.optimizer)  # 8/dp per param either way
    assert eight.weights < one.weights  # the gathered blocks hold 1/8 of the experts


def test_routed_activations_and_capacity_buffers(catalog):
    act = lambda model: estimate_memory(setup(catalog, model=model, strategy="zero3")).activations  # noqa: E731
    k1 = ModelSpec(**{**TOY.model_dump(), "moe": {**TOY.moe.model_dump(), "experts_per_token": 1}})
    assert act(TOY) > act(k1)  # each token's hidden state goes to k experts
    capped = ModelSpec(**{**TOY.model_dump(), "moe": {**TOY.moe.model_dump(), "capacity_factor": 1.5}})
    assert act(capped) > act(TOY)  # buffers padded to capacity


def test_all_to_all_across_nodes_is_slower_than_inside(catalog):
    tokens = 2048
    inside = setup(catalog, ep=8, gpus=8, gpus_per_node=8)
    across = setup(catalog, ep=8, gpus=8, gpus_per_node=4, inter_node_gbps=400)
    t_in, t_out = (moe.a2a_call_s(s, tokens, dp_layout(s)[0], links(s).intra_gbps) for s in (inside, across))
    assert t_out > 3 * t_in  # half the traffic over a 400 Gb/s NIC shared by 4 GPUs vs NVLink
    # dispatch + combine, forward and backward, every MoE layer; full recompute reruns the forward two
    calls = moe.a2a_s(inside, tokens, 8, links(inside).intra_gbps) / t_in
    assert calls == pytest.approx(4 * TOY.num_moe_layers)
    full = setup(catalog, ep=8, activation_checkpointing="full")
    assert moe.a2a_s(full, tokens, 8, links(full).intra_gbps) / t_in == pytest.approx(6 * TOY.num_moe_layers)
    assert moe.a2a_s(setup(catalog, ep=1), tokens, 8, links(inside).intra_gbps) == 0.0


def test_flops_come_from_active_parameters(catalog):
    s = setup(catalog, ep=8)
    m = s.model
    attention = m.num_layers * m.q_dim * s.seq_len
    assert model_flops_per_token(s) == 6 * m.matmul_params() + 12 * attention
    assert m.matmul_params() < 0.5 * m.param_count()  # 4 of 16 experts per token
    # FLOPs counted GEMM by GEMM (routers, shared and routed experts, attention linears, head) are
    # 6 x the active matmul weights, plus causal attention (forward 2sq, backward 2.5x that); the
    # load imbalance slows the busiest rank but adds no FLOPs
    assert estimate_step(s).hardware_flops_per_token == pytest.approx(6 * m.matmul_params() + 7 * attention, rel=1e-9)


def test_load_imbalance_and_grouped_gemms_cost_time(catalog, monkeypatch):
    s = setup(catalog, ep=8, micro_batch=8, kernels="fused")  # GPU-bound, not the CPU launch floor
    slow = estimate_step(s)
    monkeypatch.setattr(eff, "LOAD_IMBALANCE", 1.0)
    balanced = estimate_step(s)
    monkeypatch.setattr(eff, "GROUPED_GEMM_M0", 0.0)
    ideal = estimate_step(s)
    assert slow.compute_s > balanced.compute_s > ideal.compute_s  # busiest rank's experts; small GEMMs
    assert slow.comm_s > balanced.comm_s  # and its all-to-alls
    assert slow.hardware_flops_per_token == balanced.hardware_flops_per_token



def test_grouped_gemm_ramp_follows_the_precision(catalog, monkeypatch):
    """BF16 grouped GEMMs ramp with torch._grouped_mm's figure, FP8 ones with DeepGEMM's: each
    constant moves only its own precision."""
    bf16 = setup(catalog, ep=8, micro_batch=8, kernels="fused")
    fp8 = setup(catalog, ep=8, micro_batch=8, kernels="fused", precision="fp8")
    assert moe.grouped_gemm_m0(bf16) == eff.GROUPED_GEMM_M0 != moe.grouped_gemm_m0(fp8) == eff.FP8_GROUPED_GEMM_M0
    before = estimate_step(bf16).compute_s, estimate_step(fp8).compute_s
    monkeypatch.setattr(eff, "FP8_GROUPED_GEMM_M0", 0.0)
    assert estimate_step(bf16).compute_s == before[0]
    assert estimate_step(fp8).compute_s < before[1]


def test_mixtral_ep8_inside_a_node_beats_ep1(catalog):
    kw = dict(instance="p5.48xlarge", gpus=16, strategy="zero1", micro_batch=1, global_batch=256, seq_len=4096,
              activation_checkpointing="full")
    one, eight = (resolve(JobSpec(model="mixtral-8x7b", ep=ep, **kw), catalog) for ep in (1, 8))
    assert estimate_memory(eight).peak < estimate_memory(one).peak
    assert estimate_step(eight).tokens_per_s > estimate_step(one).tokens_per_s


def test_ep_validation(catalog):
    with pytest.raises(UsageError, match=r"--ep 3 must divide the 16 experts .* valid: 1, 2, 4, 8 \(with --etp 1\)"):
        setup(catalog, ep=3)
    # expert TP = TP: ep x etp = 16 exceeds the stage's 8 GPUs (tp 2 x dp 4)
    with pytest.raises(UsageError, match=r"--ep x --etp = 8 x 2 the 8 GPUs .* \(tp 2 x dp 4.*valid: 1, 2, 4 "
                                         r"\(with --etp 2\); or --etp 1"):
        setup(catalog, ep=8, tp=2, etp=2)
    assert setup(catalog, ep=8, tp=2, etp=1).expert_dp == 1  # folded: EP over TP and data-parallel ranks
    with pytest.raises(UsageError, match="dense"):
        setup(catalog, model="llama-2-7b", ep=2)


def test_cli_estimate_json_for_a_moe_model():
    out = cli("estimate", "--model", "mixtral-8x7b", "--instance", "p5.48xlarge", "--gpus", "16", "--ep", "8",
              "--strategy", "zero1", "--activation-checkpointing", "full", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["setup"]["ep"] == 8
    assert data["model"]["params"] > 46e9 and 12.8e9 < data["model"]["active_params"] < 13e9
    assert any(a.startswith("MoE:") for a in data["assumptions"])
    text = cli("estimate", "--model", "mixtral-8x7b", "--instance", "p5.48xlarge", "--gpus", "16", "--ep", "8")
    assert text.returncode == 0 and "B active" in text.stdout and "ep 8" in text.stdout


@pytest.mark.parametrize("args, message", [
    (("--model", "mixtral-8x7b", "--ep", "3"), "valid: 1, 2, 4, 8"),
    (("--model", "llama-2-7b", "--ep", "2"), "dense"),
    (("--model", "mixtral-8x7b", "--ep", "0"), "--ep"),
])
def test_cli_ep_errors_exit_2(args, message):
    out = cli("estimate", *args, "--gpu", "h100-80gb", "--gpus", "8")
    assert out.returncode == 2 and message in out.stderr


def test_plan_chooses_expert_parallelism_for_mixtral(catalog):
    r = plan(PlanRequest(job=JobSpec(model="mixtral-8x7b", tokens=2e9), instances=["p5en.48xlarge"], max_nodes=2),
             catalog)
    best = r.rows[0].estimate.setup
    assert best.ep > 1
    # and it helps: the same configuration without EP is slower (or does not fit)
    job = JobSpec(model="mixtral-8x7b", instance="p5en.48xlarge", gpus=best.gpus, strategy=best.strategy, tp=best.tp,
                  pp=best.pp, micro_batch=best.micro_batch, global_batch=best.global_batch,
                  activation_checkpointing=best.activation_checkpointing)
    no_ep = resolve(job, catalog)
    assert (estimate_step(no_ep).tokens_per_s < r.rows[0].estimate.throughput.tokens_per_s
            or estimate_memory(no_ep).peak > estimate_memory(resolve(job.model_copy(update={"ep": best.ep}),
                                                                     catalog)).peak)


# --- uneven pipeline stages ----------------------------------------------------------------
def dense(layers: int) -> ModelSpec:
    return ModelSpec(name=f"dense-{layers}", vocab_size=32000, hidden_size=2048, num_layers=layers, num_heads=16,
                     num_kv_heads=16, ffn_hidden_size=5504)


def test_pipeline_split_puts_the_extra_layers_first():
    assert pipeline_split(61, 4) == (16, 15, 15, 15)  # DeepSeek-V3
    assert pipeline_split(94, 8) == (12,) * 6 + (11, 11)  # Qwen3-235B
    assert pipeline_split(32, 4) == (8, 8, 8, 8)
    assert sum(pipeline_split(61, 16)) == 61 and max(pipeline_split(61, 16)) == 4


def test_uneven_stages_cost_as_their_largest_stage(catalog):
    """10 layers on 4 stages (3, 3, 2, 2) pace and fill memory like 12 layers (3 each): the first stage
    is the largest and holds the most micro-batches in flight."""
    kw = dict(gpu="h100-80gb", gpus=8, strategy="zero1", pp=4, micro_batch=1, global_batch=16, seq_len=2048)
    ten, twelve = (resolve(JobSpec(**kw), catalog, model=dense(n)) for n in (10, 12))
    assert ten.stage_layers == twelve.stage_layers == 3
    assert estimate_step(ten).step_s == pytest.approx(estimate_step(twelve).step_s, rel=1e-12)
    assert estimate_memory(ten).peak == pytest.approx(estimate_memory(twelve).peak, rel=1e-12)
    nine = resolve(JobSpec(**kw), catalog, model=dense(9))  # 3, 2, 2, 2: still 3 on the first stage
    assert estimate_step(nine).step_s == pytest.approx(estimate_step(ten).step_s, rel=1e-12)
    eight = resolve(JobSpec(**kw), catalog, model=dense(8))  # 2 each: faster
    assert estimate_step(eight).step_s < estimate_step(ten).step_s


def test_uneven_moe_stages_take_the_worst_mix(catalog):
    # TOY: a dense first layer, then 7 MoE layers; 3 stages of 3, 3, 2 layers
    assert moe.stage_mix(TOY, 3) == [(1, 2), (0, 3), (0, 2)]
    pc = param_counts(setup(catalog, pp=3, gpus=3, gpus_per_node=3, strategy="zero1"))
    assert pc.local - pc.embed == pytest.approx(3 * TOY.layer_params(1))  # the all-MoE middle stage
    dsv3 = setup(catalog, model="deepseek-v3", gpus=256, pp=4, ep=64, strategy="zero1", global_batch=512,
                 inter_node_gbps=3200)
    assert moe.stage_mix(dsv3.model, 4) == [(3, 13), (0, 15), (0, 15), (0, 15)]
    assert estimate_step(dsv3).tokens_per_s > 0


def test_pp_may_not_exceed_the_layers(catalog):
    with pytest.raises(UsageError, match=r"--pp 16 is more than the 8 layers .*\(--pp 1\.\.8\)"):
        setup(catalog, pp=16, gpus=16, strategy="zero1")


def test_plan_offers_uneven_stages_beyond_the_largest_even_split(catalog):
    from trainready.plan.search import _parallel_options
    s = setup(catalog, model="deepseek-v3", gpus=8)
    assert {p for _, p, *_ in _parallel_options(s, 64)} == {1, 2, 4, 8}  # 61 layers: none divides, all uneven
    s = setup(catalog, model="llama-2-70b", gpus=8)
    assert {p for _, p, *_ in _parallel_options(s, 4)} == {1, 2, 4, 8}  # 80 layers: all divide
    s = setup(catalog, model="qwen3-235b-a22b", gpus=8)
    assert {p for _, p, *_ in _parallel_options(s, 4)} == {1, 2, 4, 8}  # 94: 2 divides; 4 and 8 uneven
    s = setup(catalog, model="mixtral-8x7b", gpus=8)
    assert {p for _, p, *_ in _parallel_options(s, 4)} == {1, 2, 4, 8}  # 32: all divide, none uneven


def test_recipes_split_the_layers_as_the_estimate_does():
    from trainready.plan.recipes.megatron import pipeline_layout
    assert pipeline_layout(61, 4) == "Et*16|(t*15|)*2t*15L"
    layout_mod = pytest.importorskip("megatron.core.transformer.pipeline_parallel_layer_layout")
    for layers, pp in ((61, 4), (94, 8), (61, 16), (10, 3)):
        layout = layout_mod.PipelineParallelLayerLayout.from_str(layout=pipeline_layout(layers, pp),
                                                                 pipeline_model_parallel_size=pp)
        layout.validate_layer_layout(num_layers=layers, mtp_num_layers=None)  # Megatron-Core's own check
        per_stage = [sum(1 for x in row[0] if x.name == "decoder") for row in layout.layout]
        assert tuple(per_stage) == pipeline_split(layers, pp)
    pp_mod = pytest.importorskip("torchtitan.distributed.pipeline_parallel")
    # the torchtitan recipe sets first/last_stage_less_layers to 0: its split is then ours
    split = getattr(pp_mod, "_generate_llm_fqn_per_model_part", None) or pp_mod.generate_llm_fqn_per_model_part
    parts = split(4, 61, 0, 0)
    assert tuple(sum(n.startswith("layers.") for n in part) for part in parts) == pipeline_split(61, 4)


# --- load imbalance, dispatch, overlap, FP8 dispatch ----------------------------------------
def test_stated_load_imbalance_replaces_the_assumption(catalog, monkeypatch):
    stated = estimate_step(setup(catalog, ep=8, micro_batch=8, kernels="fused", expert_load_imbalance=1.0))
    monkeypatch.setattr(eff, "LOAD_IMBALANCE", 1.0)
    assumed_one = estimate_step(setup(catalog, ep=8, micro_batch=8, kernels="fused"))
    assert stated.step_s == assumed_one.step_s
    monkeypatch.undo()
    s = setup(catalog, ep=8, expert_load_imbalance=1.3)
    assert moe.busy_rows(s) == pytest.approx(1.3 * TOY.moe.experts_per_token)
    assert "1.3x the mean load (given)" in moe.assumptions(s)[0]
    assert "(assumed)" in moe.assumptions(setup(catalog, ep=8))[0]
    with pytest.raises(UsageError, match="dense"):
        setup(catalog, model="llama-2-7b", expert_load_imbalance=1.0)
    with pytest.raises(ValueError):
        JobSpec(model="mixtral-8x7b", expert_load_imbalance=0.9)  # below balanced


def test_cli_expert_load_imbalance():
    args = ("estimate", "--model", "mixtral-8x7b", "--gpu", "h100-80gb", "--gpus", "8", "--ep", "8", "--json")
    out = cli(*args, "--expert-load-imbalance", "1.0")
    assert out.returncode == 0, out.stderr
    assert any("1x the mean load (given)" in a for a in json.loads(out.stdout)["assumptions"])
    bad = cli(*args, "--expert-load-imbalance", "0.5")
    assert bad.returncode == 2 and "--expert-load-imbalance" in bad.stderr


def test_deepep_sends_a_token_once_per_gpu_and_node(catalog):
    """16 experts, top-4, 2 experts per GPU (ep 8): a GPU holds one of a token's experts with chance
    1 - C(14,4)/C(16,4); a node of 4 GPUs (8 experts) with 1 - C(8,4)/C(16,4)."""
    p_gpu, p_node = 1 - 1001 / 1820, 1 - 70 / 1820
    one_node = setup(catalog, ep=8, expert_load_imbalance=1.0)
    assert moe.a2a_rows(one_node, 8) == pytest.approx((4 * 7 / 8, 0.0))  # alltoall: a row per routed expert
    deep = setup(catalog, ep=8, expert_load_imbalance=1.0, ep_dispatcher="deepep")
    assert moe.a2a_rows(deep, 8) == pytest.approx((p_gpu * 7, 0.0))
    assert moe.a2a_rows(deep, 4) == pytest.approx((p_gpu * 3 * 2, p_node * 1))  # 2 nodes of 4
    assert moe.a2a_rows(one_node, 4) == pytest.approx((4 * 3 / 8, 4 * 4 / 8))
    across = dict(gpus=8, gpus_per_node=4, inter_node_gbps=400, ep=8)
    t = [moe.a2a_call_s(s, 2048, 4, links(s).intra_gbps)
         for s in (setup(catalog, **across), setup(catalog, ep_dispatcher="deepep", **across))]
    assert t[1] < t[0] / 1.5  # the network carries ~1 copy per token instead of 2 rows


def test_overlapped_all_to_alls_leave_only_what_outlasts_compute(catalog):
    kw = dict(ep=8, gpus=16, gpus_per_node=8, inter_node_gbps=400, micro_batch=2, kernels="fused")
    plain, hidden = estimate_step(setup(catalog, **kw)), estimate_step(setup(catalog, ep_overlap=True, **kw))
    s = setup(catalog, **kw)
    a2a = moe.a2a_s(s, 2 * 2048, dp_layout(s)[0], links(s).intra_gbps)
    assert a2a > 0 and hidden.exposed_comm_s < plain.exposed_comm_s
    assert hidden.step_s < plain.step_s
    assert hidden.comm_s == pytest.approx(plain.comm_s)  # the same traffic, moved off the critical path


def test_fp8_dispatch_halves_the_dispatch_bytes(catalog):
    kw = dict(ep=8, precision="fp8")
    bf16, fp8 = setup(catalog, **kw), setup(catalog, fp8_dispatch=True, **kw)
    intra = links(bf16).intra_gbps
    base = moe.a2a_call_s(bf16, 2048, 8, intra, 2.0)
    latency = eff.COLLECTIVE_LATENCY_S + eff.RING_STEP_LATENCY_S * 8
    expect = (base - latency) * (2 + moe.FP8_DISPATCH_BYTES) / 4 + latency  # dispatches FP8, combines BF16
    assert moe.a2a_s(fp8, 2048, 8, intra) / moe.a2a_s(bf16, 2048, 8, intra) == pytest.approx(
        expect / base, rel=1e-9)
    assert not setup(catalog, ep=8).fp8_dispatch  # stacks default to BF16 (Megatron, torchtitan)
    with pytest.raises(UsageError, match="--precision fp8"):
        setup(catalog, ep=8, precision="bf16", fp8_dispatch=True)


def test_stacks_state_their_moe_communication():
    from trainready.plan.stacks import STACKS
    for st in STACKS.values():
        assert st.ep_dispatcher in ("alltoall", "deepep") and len(st.ep_source) > 40, st.name
        assert not st.ep_overlap and not st.fp8_dispatch  # none of today's presets does either by default


# --- op-level selective checkpointing and MLA activations --------------------------------------
def test_op_policy_keeps_the_all_to_all_outputs_and_recomputes_the_experts(catalog):
    kw = dict(strategy="zero3", activation_checkpointing="selective-op")
    s1, s8 = setup(catalog, ep=1, **kw), setup(catalog, ep=8, expert_load_imbalance=1.0, **kw)
    d1, m1 = moe.op_sac_kept_per_token(s1, 2, 2)
    d8, m8 = moe.op_sac_kept_per_token(s8, 2, 2)
    assert d1 == d8 and m8 - m1 == 2 * 4 * TOY.hidden_size * 2  # dispatch and combine outputs, k rows
    # a MoE layer keeps less than everything it would save, more than its input
    none = estimate_memory(setup(catalog, ep=8, strategy="zero3"))
    op = estimate_memory(s8)
    assert op.activations < none.activations
    # recompute: the routed experts' grouped GEMMs and the router run again in backward
    step_none = estimate_step(setup(catalog, ep=8, strategy="zero3", expert_load_imbalance=1.0))
    step_op = estimate_step(s8)
    routed = 2 * TOY.num_moe_layers * 4 * 3 * TOY.hidden_size * TOY.moe.expert_ffn_hidden_size
    assert step_op.hfu_flops_per_token - step_op.model_flops_per_token > routed
    assert step_op.compute_s > step_none.compute_s


def test_mla_activations_use_the_mla_widths():
    from trainready.plan.activations import layer_bytes_per_token, op_sac_bytes_per_token
    from trainready.plan.presets import preset
    m = preset("deepseek-v3")
    a, h = m.mla, m.num_heads
    dense = m.model_copy(update={"moe": None})
    attn = 2 * (2 * h * a.qk_head_dim + h * a.v_head_dim + 2 * (a.q_lora_rank + a.kv_lora_rank)) + 2 * h * a.v_head_dim
    norms = m.norms_per_layer * (2 + 2) * m.hidden_size
    assert layer_bytes_per_token(dense, kernels="fused", residual_bytes=2, act_bytes=2) == \
        norms + attn + 3 * 2 * m.ffn_hidden_size  # fused SwiGLU: its input (gate, up) and the product
    # the op policy keeps the input, the 1st, 3rd and 5th matmul outputs (q_a, kv_a, o_proj) and the
    # attention output, heads x v_head_dim, with its log-sum-exp
    d = m.hidden_size
    kept = op_sac_bytes_per_token(dense, residual_bytes=2, act_bytes=2, ffn=0)
    assert kept == 2 * d + 2 * (a.q_lora_rank + a.kv_lora_rank + a.qk_rope_head_dim + d) + 2 * h * a.v_head_dim + 4 * h


# --- memo of the parameter counts ------------------------------------------------------------
def test_parameter_counts_are_memoized_per_shape():
    from trainready.plan.presets import preset
    m = preset("deepseek-v3")
    total = m.param_count()
    assert m.param_count() == total == 671_026_419_200
    smaller = m.model_copy(update={"num_layers": 31})  # a copy with another shape: counted afresh
    assert smaller.param_count() < total and m.param_count() == total
    assert smaller == ModelSpec.model_validate(smaller.model_dump())  # the memo is not a field
    assert "_counts" not in m.model_dump()


# --- interleaved (virtual) pipeline stages ----------------------------------------------------
def _interleaved(catalog, v, **kw):
    base = dict(model="llama-2-13b", gpu="h100-80gb", gpus=8, pp=4, strategy="zero1", micro_batch=1,
                global_batch=16, seq_len=4096, kernels="fused")
    base.update(kw)
    return resolve(JobSpec(pp_virtual=v, **base), catalog)


def test_interleaved_bubble_shrinks_by_v(catalog):
    """Narayanan et al. 2021: the 1F1B bubble (pp - 1) micro-batch times becomes (pp - 1)/v; each rank
    sends v activations and v gradients per micro-batch instead of one."""
    steps = {v: estimate_step(_interleaved(catalog, v)) for v in (1, 2, 5)}
    for v in (2, 5):
        assert steps[v].other_s == pytest.approx(steps[1].other_s / v, rel=0.03)
        assert steps[v].step_s < steps[1].step_s
    # v times the point-to-point sends, run beside compute (Megatron's overlap_p2p_comm)
    assert steps[5].comm_s > steps[1].comm_s and steps[5].exposed_comm_s < steps[1].exposed_comm_s
    assert estimate_step(_interleaved(catalog, 1, pp=1)).other_s == 0.0


def test_interleaved_memory_holds_more_micro_batches(catalog):
    """The first rank holds pp (1 + (pp - 1)/(pp v)) micro-batches of its activations (Korthikanti et
    al. 2022, Megatron's interleaved_schedule_memory_penalty), at most all v x m of its stage-chunks."""
    assert in_flight_micro_batches(4, 1, 8) == 4 and in_flight_micro_batches(4, 1, 2) == 2
    assert in_flight_micro_batches(4, 2, 8) == pytest.approx(4 * (1 + 3 / 8))
    assert in_flight_micro_batches(4, 5, 40) == pytest.approx(4 * (1 + 3 / 20))
    assert in_flight_micro_batches(4, 2, 1) == 1  # one micro-batch: both its chunks, no more
    assert in_flight_micro_batches(4, 2, 8, rank=3) == pytest.approx((4 + 1) / 2)  # the last rank
    saved = {v: activation_parts(_interleaved(catalog, v))[0] for v in (1, 2, 5)}
    assert saved[2] / saved[1] == pytest.approx(1 + 3 / 8, rel=0.01)
    assert saved[5] / saved[1] == pytest.approx(1 + 3 / 20, rel=0.01)
    assert estimate_memory(_interleaved(catalog, 2)).peak > estimate_memory(_interleaved(catalog, 1)).peak


def test_interleaved_ranks_take_every_pp_th_virtual_stage(catalog):
    ranks = pipeline_ranks(61, 4, 8)  # DeepSeek-V3: 32 virtual stages of 2 (the first 29) or 1 layers
    assert [len(r) for r in ranks] == [16, 15, 15, 15]
    assert ranks[0][:4] == (0, 1, 8, 9) and ranks[1][:2] == (2, 3)
    assert sorted(i for r in ranks for i in r) == list(range(61))
    assert pipeline_ranks(61, 4) == tuple(tuple(range(a, a + n)) for a, n in zip((0, 16, 31, 46), (16, 15, 15, 15), strict=True))
    dsv3 = setup(catalog, model="deepseek-v3", gpus=256, gpus_per_node=8, inter_node_gbps=3200, pp=4,
                 pp_virtual=8, ep=64, strategy="zero1", global_batch=512)
    assert dsv3.stage_layers == 16
    assert moe.stage_mix(dsv3.model, 4, 8) == [(2, 14), (1, 14), (0, 15), (0, 15)]  # dense layers 0-2 spread
    # torchtitan: pp x v stages split as ours, stage i on rank i % pp ("loop" style stage_ids_this_rank)
    pp_mod = pytest.importorskip("torchtitan.distributed.pipeline_parallel")
    split = getattr(pp_mod, "_generate_llm_fqn_per_model_part", None) or pp_mod.generate_llm_fqn_per_model_part
    parts = split(32, 61, 0, 0)
    layer_ids = [[int(n.split(".")[1]) for n in part if n.startswith("layers.")] for part in parts]
    titan = [tuple(i for st in range(r, 32, 4) for i in layer_ids[st]) for r in range(4)]
    assert tuple(titan) == ranks


@pytest.mark.parametrize("kw, message", [
    (dict(pp=1, pp_virtual=2), "needs pipeline stages"),
    (dict(pp=8, pp_virtual=6), "--pp-virtual 1..5"),  # 48 virtual stages for 40 layers
    (dict(pp=4, pp_virtual=2, global_batch=12), "nearest valid: 8 or 16"),  # 6 micro-batches, groups of 4
])
def test_interleaved_validation(catalog, kw, message):
    with pytest.raises(UsageError, match=message):
        _interleaved(catalog, **{"v": kw.pop("pp_virtual"), **kw})


def test_interleaved_default_batch_is_whole_groups(catalog):
    s = resolve(JobSpec(model="llama-2-13b", gpu="h100-80gb", gpus=24, inter_node_gbps=3200, pp=4, pp_virtual=2,
                        strategy="zero1"), catalog)
    assert s.grad_accum % 4 == 0 and s.pp_virtual == 2


def test_cli_pp_virtual():
    args = ("estimate", "--model", "llama-2-13b", "--gpu", "h100-80gb", "--gpus", "8", "--pp", "4",
            "--strategy", "zero1", "--micro-batch", "1", "--global-batch", "16")
    out = cli(*args, "--pp-virtual", "2", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["setup"]["pp_virtual"] == 2
    text = cli(*args, "--pp-virtual", "2")
    assert text.returncode == 0 and "2 virtual stages per rank" in text.stdout
    for bad, message in ((("--pp-virtual", "0"), "--pp-virtual"), (("--pp-virtual", "3", "--global-batch", "12"),
                                                                   "multiple of --pp 4")):
        out = cli(*args, *bad)
        assert out.returncode == 2 and message in out.stderr, out.stderr


def test_cli_plan_expert_load_imbalance():
    args = ("plan", "--model", "qwen3-30b-a3b", "--instances", "p5.48xlarge", "--max-nodes", "1", "--top", "1",
            "--tokens", "1e9", "--json")
    out = cli(*args, "--expert-load-imbalance", "1.0")
    assert out.returncode == 0, out.stderr
    assumptions = json.loads(out.stdout)["rows"][0]["estimate"]["assumptions"]
    assert any("1x the mean load (given)" in a for a in assumptions)
    for bad in (("--expert-load-imbalance", "0.5"), ("--model", "llama-2-7b", "--expert-load-imbalance", "1.2")):
        out = cli(*args, *bad)
        assert out.returncode == 2, (bad, out.stderr)


# --- routing pattern, hierarchical dispatch, FP8 --------------------------------------------
def test_contiguous_routing_reaches_fewer_gpus_and_nodes(catalog):
    """Automodel's fake_balanced_gate sends token t to experts t*k..t*k+k-1: with 16 experts per GPU
    (Qwen3-30B-A3B, ep 8) one GPU; with 4 (DeepSeek-V3, ep 64) two GPUs of one node."""
    qwen = dict(model="qwen3-30b-a3b", ep=8, expert_load_imbalance=1.0, ep_dispatcher="deepep")
    rand, cont = setup(catalog, **qwen), setup(catalog, expert_routing="contiguous", **qwen)
    assert moe.a2a_rows(cont, 8) == pytest.approx((7 / 8, 0.0))
    p_gpu = 1 - math.comb(112, 8) / math.comb(128, 8)
    assert moe.a2a_rows(rand, 8) == pytest.approx((8 * p_gpu * 7 / 8, 0.0))
    dsv3 = dict(model="deepseek-v3", gpus=512, gpus_per_node=8, inter_node_gbps=3200, ep=64, pp=8,
                strategy="zero1", expert_load_imbalance=1.0, ep_dispatcher="deepep", global_batch=64)
    assert moe.a2a_rows(setup(catalog, expert_routing="contiguous", **dsv3), 8) == pytest.approx((2 * 7 / 8, 7 / 8))
    assert "routing contiguous" in moe.assumptions(cont)[0]
    alltoall = dict(qwen, ep_dispatcher="alltoall")  # a row per routed expert either way
    assert moe.a2a_rows(setup(catalog, **alltoall), 8) == moe.a2a_rows(
        setup(catalog, expert_routing="contiguous", **alltoall), 8)
    with pytest.raises(UsageError, match="dense"):
        setup(catalog, model="llama-2-7b", expert_routing="contiguous")


@pytest.mark.parametrize("ranks, published_ms", [(16, (2.15, 2.19)), (32, (4.48, 4.04)), (64, (7.51, 6.65))])
def test_hierarchical_dispatch_matches_hybridep_on_h100(catalog, ranks, published_ms):
    """DeepEP docs/README_Hybrid-EP.md, H100: 4096 tokens x 7168 per rank, top-8 of 8 experts per rank,
    uniform router, torch API, 16 SMs: BF16 dispatch and combine at 54.47/53.35 (16 ranks), 47.36/52.53
    (32), 41.24/46.57 (64) GB/s counted as tokens x nodes reached (own node included) x 14336 bytes."""
    m = ModelSpec(name="hybridep-bench", vocab_size=32000, hidden_size=7168, num_layers=4, num_heads=56,
                  num_kv_heads=8, ffn_hidden_size=2048,
                  moe=MoESpec(num_experts=8 * ranks, experts_per_token=8, expert_ffn_hidden_size=2048))
    s = resolve(JobSpec(gpu="h100-80gb", gpus=ranks, gpus_per_node=8, inter_node_gbps=3200, ep=ranks,
                        strategy="zero1", micro_batch=1, global_batch=ranks, seq_len=4096,
                        expert_load_imbalance=1.0, ep_dispatcher="deepep"), catalog, model=m)
    t = moe.a2a_call_s(s, 4096, dp_layout(s)[0], links(s).intra_gbps) * 1e3
    assert min(published_ms) * 0.9 < t < max(published_ms) * 1.1


def test_fp8_gemms_follow_deepgemm_and_pay_for_their_casts(catalog, monkeypatch):
    """DeepGEMM's H800 FP8 table (dense M=4096, grouped contiguous): 0.69 x K/(K + 650) of 1979 TFLOP/s
    within 8%; an FP8 step is faster than bf16 but far from 2x for small-K MoE GEMMs."""
    e = eff.fp8_gemm(eff.arch_efficiency("hopper"))
    for k, tflops in ((512, 590), (1536, 990), (2048, 1025), (7168, 1304), (16384, 1358), (2048, 1099)):
        assert 1979 * e.gemm * k / (k + e.gemm_k0) == pytest.approx(tflops, rel=0.08)
    kw = dict(model="qwen3-30b-a3b", ep=8, expert_load_imbalance=1.0, kernels="fused", micro_batch=2)
    bf16, fp8 = estimate_step(setup(catalog, **kw)), estimate_step(setup(catalog, precision="fp8", **kw))
    assert bf16.compute_s / 2 < fp8.compute_s < bf16.compute_s
    free = dataclasses.replace(eff.FP8_RECIPES["tensorwise"], cast_bytes=0)
    monkeypatch.setitem(eff.FP8_RECIPES, "tensorwise", free)
    assert estimate_step(setup(catalog, precision="fp8", **kw)).compute_s < fp8.compute_s


# --- expert tensor parallelism and MoE parallel folding ----------------------------------------
def qwen235(catalog, **kw):
    """Qwen3-235B-A22B on 256 H100 as Megatron-Bridge lays it out: tp 2, pp 8 (v 4), ep 32, expert TP 1
    (dp 16: the 32-rank EP group spans TP ranks), forced balance."""
    base = dict(model="qwen3-235b-a22b", gpu="h100-80gb", gpus=256, gpus_per_node=8, inter_node_gbps=3200, tp=2,
                pp=8, pp_virtual=4, ep=32, etp=1, strategy="zero1", micro_batch=1, global_batch=2048, seq_len=4096,
                stack="megatron", expert_load_imbalance=1.0)
    base.update(kw)
    return resolve(JobSpec(**base), catalog)


def test_folded_layout_memory(catalog):
    s = qwen235(catalog)
    assert (s.dp, s.expert_tp, s.expert_dp) == (16, 1, 1)  # edp = tp x dp / (etp x ep) = 32 / 32
    pc = param_counts(s)
    # rank 0 holds 4 virtual stages of 3 layers (94 layers in 32 stages: 30 of 3, 2 of 2), every one MoE;
    # per layer 128 experts x 3 x 4096 x 1536 weights, 4 of them whole on each of the 32 EP ranks
    assert pc.expert == 12 * 128 * 3 * 4096 * 1536 / 32 == 905_969_664
    # ep 16 x etp 2 holds as many expert weights per GPU (8 experts, half width each) ...
    assert param_counts(qwen235(catalog, ep=16, etp=2)).expert == pc.expert
    # ... and expert TP = TP, EP out of dp (ep 8 x etp 2 = 16 of the stage's 32 GPUs): twice as many
    assert param_counts(qwen235(catalog, ep=8, etp=2)).expert == 2 * pc.expert
    # ZeRO-1 shards Adam's 8 bytes over dp 16 for attention and routers, over edp 1 (not at all) for the experts
    mem = estimate_memory(s)
    assert mem.optimizer == pytest.approx(8 * (pc.local - pc.expert) / 16 + 8 * pc.expert)
    # ep 8 x etp 1: edp 4 copies of each expert, which share its optimizer states
    s8 = qwen235(catalog, ep=8)
    pc8 = param_counts(s8)
    assert s8.expert_dp == 4 and pc8.expert == 4 * pc.expert
    assert estimate_memory(s8).optimizer == pytest.approx(8 * (pc8.local - pc8.expert) / 16 + 8 * pc8.expert / 4)


def test_folded_layout_grouped_gemms_and_activations(catalog):
    tokens = 4096  # one micro-batch
    fold, etp2 = qwen235(catalog), qwen235(catalog, ep=16, etp=2)
    d, f = 4096, 1536
    # etp 1: a rank routes its 2048 tokens (sequence parallel), its 4 experts take 4096 x 8 / 2 = 16384 rows,
    # 4096 per expert, full width: up/gate N = 2 x 1536, down K = 1536
    up, down = moe._mlp_gemms(fold, tokens, True)[-2:]
    assert (up.k, up.n, up.rows, down.k, down.n) == (d, 2 * f, 4096, f, d)
    assert up.flops == 2 * 16384 * d * 2 * f
    # etp 2, ep 16: the expert TP pair gathers 2 x 8192 = 32768 rows for 8 experts (4096 each), half width:
    # the same FLOPs per GPU, N halved
    up2, down2 = moe._mlp_gemms(etp2, tokens, True)[-2:]
    assert (up2.k, up2.n, up2.rows, down2.k, down2.n) == (d, f, 4096, f / 2, d)
    assert up2.flops == up.flops
    # the gathered rows are saved for backward: 8 rows x etp x (the experts' bf16 input + an int64 index) per token;
    # Megatron's experts apply the routing weights in their activation, so the combine keeps no expert output
    one = lambda s: moe.moe_layer_bytes_per_token(s, lambda shape: 0.0, 2)  # noqa: E731
    assert one(qwen235(catalog, ep=16, etp=2)) - one(qwen235(catalog, ep=16, etp=1)) == 8 * (2 * d + 8)
    # a stack whose combine multiplies by the weights keeps the expert output too: 2 bf16 hidden states a row
    titan = lambda etp: qwen235(catalog, ep=16, etp=etp, stack="torchtitan", pp_virtual=None, pp=1)  # noqa: E731
    assert one(titan(2)) - one(titan(1)) == 8 * (2 * 2 * d + 8)
    # under Transformer Engine FP8 the experts' input is kept in FP8: 1 byte an element
    fp8 = lambda s: moe.moe_layer_bytes_per_token(s, lambda shape: 0.0, 2, fp8_saved=True)  # noqa: E731
    assert fp8(qwen235(catalog, ep=16, etp=2)) - fp8(qwen235(catalog, ep=16, etp=1)) == 8 * (d + 8)


def test_folded_layout_all_to_all_and_expert_collectives(catalog):
    s = qwen235(catalog)
    per_node, share = dp_layout(s)
    assert per_node == 4  # 8 GPUs of a stage in a node, tp 2
    # expert grid etp 1 - ep 32: an EP group is 32 consecutive ranks, 4 whole nodes, 8 EP ranks in each
    assert moe.ep_ranks_per_node(s, per_node) == 8
    assert moe.a2a_rows(s, 8) == (8 * 7 / 32, 8 * 24 / 32)  # k = 8 rows per token: 7/32 over NVLink, 24/32 over IB
    assert moe.ep_ranks_per_node(qwen235(catalog, ep=16, etp=2), per_node) == 4  # ep ranks 2 apart
    assert moe.ep_ranks_per_node(qwen235(catalog, ep=8, etp=2), per_node) == 4  # EP out of dp: 4 dp ranks a node
    # no expert TP collectives with etp 1; etp 2 gathers its pair's received rows: 2048 tokens x 8 x 2, bf16
    assert moe.expert_tp_buffer_bytes(s, 4096) == 0.0
    assert moe.expert_tp_buffer_bytes(qwen235(catalog, ep=16, etp=2), 4096) == 2 * 2048 * 8 * 4096 * 2
    # without EP, the allgather dispatcher gathers hidden states (etp 2 = tp: the micro-batch's 4096 tokens)
    assert moe.expert_tp_buffer_bytes(qwen235(catalog, ep=1, etp=2), 4096) == 4096 * 4096 * 2
    # expert gradients: ep 8 x etp 1 leaves edp 4 copies, etp x ep = 8 ranks apart: one per node
    s8 = qwen235(catalog, ep=8)
    assert moe.expert_dp_layout(s8, per_node, share)[:2] == (4, 1)
    assert moe.expert_dp_layout(s, per_node, share)[:2] == (1, 1)
    # folding drops the MLP's tensor-parallel all-gather/reduce-scatter: less TP traffic than expert TP = TP
    ln = links(s)
    from trainready.plan.performance import _moe_tp_s
    assert _moe_tp_s(s, 4096, ln) < _moe_tp_s(qwen235(catalog, ep=8, etp=2), 4096, ln)


def test_etp_defaults_follow_the_stack(catalog):
    kw = dict(model="qwen3-30b-a3b", gpu="h100-80gb", gpus=8, tp=2, ep=4)
    assert resolve(JobSpec(stack="megatron", **kw), catalog).expert_tp == 2  # Megatron-Core: etp = tp
    for stack in ("torchtitan", "hf-trainer", "deepspeed"):  # experts whole under EP
        assert resolve(JobSpec(stack=stack, **kw), catalog).expert_tp == 1
    assert resolve(JobSpec(stack="torchtitan", **{**kw, "ep": 1}), catalog).expert_tp == 2  # no EP: split tp ways
    assert resolve(JobSpec(stack="torchtitan", etp=2, **kw), catalog).expert_tp == 2  # given: kept
    dense = resolve(JobSpec(model="llama-2-13b", gpu="h100-80gb", gpus=8, tp=2), catalog)
    assert dense.expert_tp == 2 and moe.expert_shard_ratio(dense) == 1.0


@pytest.mark.parametrize("kw, message", [
    (dict(etp=3), r"--etp 3 must divide the 8 GPUs of a pipeline stage \(tp 2 x dp 4\) .* valid: 1, 2, 4, 8"),
    (dict(gpus=16, gpus_per_node=8, inter_node_gbps=400, etp=16),
     r"--etp 16 must divide .* stay inside a node of 8; valid: 1, 2, 4, 8"),
    (dict(ep=8, etp=2), r"--ep x --etp = 8 x 2 the 8 GPUs .* or --etp 1"),
    (dict(ep=3, etp=1), r"--ep 3 must divide the 128 experts"),
    # 24 GPUs on 8-GPU nodes, tp 1 x dp 24: etp 3 divides the stage but its group of ranks 6, 7, 8 spans two nodes
    (dict(gpus=24, gpus_per_node=8, inter_node_gbps=400, tp=1, ep=2, etp=3),
     r"--etp 3 must divide the 24 GPUs .* and a node's GPUs to stay inside a node of 8; valid: 1, 2, 4, 8$"),
])
def test_etp_validation(catalog, kw, message):
    with pytest.raises(UsageError, match=message):
        resolve(JobSpec(**{**dict(model="qwen3-30b-a3b", gpu="h100-80gb", gpus=8, tp=2), **kw}), catalog)


def test_etp_must_split_the_expert_ffn_whole(catalog):
    """Each expert TP rank takes expert_ffn / etp columns: 1100 = 4 x 275 splits 1, 2 or 4 ways, not 8."""
    odd = TOY.model_copy(update={"moe": TOY.moe.model_copy(update={"expert_ffn_hidden_size": 1100})})
    with pytest.raises(UsageError, match=r"--etp 8 must divide .* the 1100 columns .*; valid: 1, 2, 4$"):
        resolve(JobSpec(gpu="h100-80gb", gpus=8, etp=8), catalog, model=odd)
    assert resolve(JobSpec(gpu="h100-80gb", gpus=8, etp=4), catalog, model=odd).expert_tp == 4


def test_cli_etp():
    args = ("estimate", "--model", "qwen3-30b-a3b", "--gpu", "h100-80gb", "--gpus", "8", "--tp", "2", "--ep", "8")
    out = cli(*args, "--etp", "1", "--json")
    assert out.returncode == 0, out.stderr
    setup_json = json.loads(out.stdout)["setup"]
    assert (setup_json["ep"], setup_json["etp"], setup_json["dp"]) == (8, 1, 4)
    bad = cli(*args, "--etp", "2")
    assert bad.returncode == 2 and "--ep x --etp = 8 x 2" in bad.stderr and "Traceback" not in bad.stderr
    dense = cli("estimate", "--model", "llama-2-7b", "--gpu", "h100-80gb", "--gpus", "8", "--etp", "2")
    assert dense.returncode == 2 and "--etp 2 needs a mixture-of-experts model" in dense.stderr


def test_plan_tries_folded_expert_layouts(catalog):
    from trainready.plan.search import _parallel_options
    opts = [(t, p, e, et) for t, p, c, e, et in  # seq 4096: no context parallelism
            _parallel_options(setup(catalog, model="qwen3-235b-a22b", gpus=8), 32)]  # 256 GPUs; 94 layers: pp 1, 2
    assert all(et in (1, t) for t, _, e, et in opts) and all(et == t for t, _, e, et in opts if e == 1)
    assert all(128 % e == 0 and 256 // p % (e * et) == 0 for t, p, e, et in opts)  # each one a valid grid
    # the default stack keeps experts whole under EP: its EP degrees over tp 2 x dp 64 (past dp), expert TP = TP
    # at its largest only
    tp2 = {(e, et) for t, p, e, et in opts if (t, p) == (2, 2) and e > 1}
    assert tp2 == {(8, 1), (32, 1), (128, 1), (64, 2)}
    # Megatron's default is expert TP = TP: EP out of dp 64, and the folded layout at its largest
    mega = _parallel_options(setup(catalog, model="qwen3-235b-a22b", gpus=8, stack="megatron"), 32)
    assert {(e, et) for t, p, c, e, et in mega if (t, p) == (2, 2) and e > 1} == {(4, 2), (16, 2), (64, 2), (128, 1)}


def test_plan_finds_the_folded_layout_with_megatron(catalog):
    r = plan(PlanRequest(job=JobSpec(model="qwen3-235b-a22b", tokens=2e9, stack="megatron"),
                         instances=["p5en.48xlarge"], max_nodes=8), catalog)
    best = r.rows[0].estimate.setup
    assert best.etp == 1 and best.tp > 1 and best.ep > best.dp  # EP folded over TP and data-parallel ranks
    assert "--expert-tensor-parallel-size 1" in r.recipe.config


def test_tp_that_does_not_divide_a_node_is_refused_across_nodes():
    """tp consecutive ranks: tp 5 on 8-GPU nodes would put ranks 5-9 on two nodes, and the estimate priced
    every TP collective over NVLink; one node of 5 GPUs is fine."""
    from trainready.catalog import load_catalog
    from trainready.errors import UsageError
    from trainready.plan.job import JobSpec
    from trainready.plan.setup import resolve

    catalog = load_catalog()
    with pytest.raises(UsageError, match=r"--tp 5 does not divide the 8 GPUs of a node: .* valid: 1, 2, 4, 8$"):
        resolve(JobSpec(model="llama-2-13b", instance="p4d.24xlarge", gpus=40, tp=5), catalog)
    assert resolve(JobSpec(model="llama-2-13b", instance="p4d.24xlarge", gpus=5, tp=5), catalog).tp == 5
