"""Mixture-of-experts physics: expert parallelism in memory, all-to-alls, active-parameter
FLOPs, the --ep option and the plan's EP degrees."""

import json
import subprocess
import sys

import pytest

from trainready.errors import UsageError
from trainready.plan import efficiency as eff
from trainready.plan import moe
from trainready.plan.job import JobSpec
from trainready.plan.memory import estimate_memory, param_counts
from trainready.plan.model_spec import ModelSpec, MoESpec
from trainready.plan.performance import _dp_layout, estimate_step, links, model_flops_per_token
from trainready.plan.search import PlanRequest, plan
from trainready.plan.setup import resolve

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
    proc = subprocess.run([sys.executable, "-m", "trainready", *map(str, args)], capture_output=True, text=True,
                          env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
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
    t_in, t_out = (moe.a2a_call_s(s, tokens, _dp_layout(s)[0], links(s).intra_gbps) for s in (inside, across))
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


def test_mixtral_ep8_inside_a_node_beats_ep1(catalog):
    kw = dict(instance="p5.48xlarge", gpus=16, strategy="zero1", micro_batch=1, global_batch=256, seq_len=4096,
              activation_checkpointing="full")
    one, eight = (resolve(JobSpec(model="mixtral-8x7b", ep=ep, **kw), catalog) for ep in (1, 8))
    assert estimate_memory(eight).peak < estimate_memory(one).peak
    assert estimate_step(eight).tokens_per_s > estimate_step(one).tokens_per_s


def test_ep_validation(catalog):
    with pytest.raises(UsageError, match=r"--ep 3 must divide both the 16 experts .* valid: 1, 2, 4, 8"):
        setup(catalog, ep=3)
    with pytest.raises(UsageError, match="data-parallel size 4"):
        setup(catalog, ep=8, tp=2)  # dp 4
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
