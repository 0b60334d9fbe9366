"""The memory, speed and cost model against published formulas and physical sanity."""

import pytest

from trainready.plan.activations import korthikanti_layer_bytes, layer_bytes_per_token
from trainready.plan.estimate import estimate_setup
from trainready.plan.job import JobSpec
from trainready.plan.memory import estimate_memory
from trainready.plan.performance import estimate_step, model_flops_per_token
from trainready.plan.presets import preset
from trainready.plan.reliability import young_daly
from trainready.plan.setup import resolve


def setup(catalog, **kw):
    base = dict(model="llama-2-13b", instance="p4de.24xlarge", micro_batch=1)
    base.update(kw)
    return resolve(JobSpec(**base), catalog)


@pytest.mark.parametrize("name", ["gpt3-175b", "gpt3-2.7b"])
def test_activations_reproduce_korthikanti(name):
    m = preset(name)
    for s in (1024, 2048):
        ours = layer_bytes_per_token(m, kernels="fused", residual_bytes=2, act_bytes=2, dropout=True,
                                     flash=False, seq_len=s)
        assert ours == pytest.approx(korthikanti_layer_bytes(m, s))


def test_flash_and_no_dropout_drop_the_quadratic_term():
    m = preset("gpt3-175b")
    a = layer_bytes_per_token(m, kernels="fused", residual_bytes=2, act_bytes=2, seq_len=2048)
    b = layer_bytes_per_token(m, kernels="fused", residual_bytes=2, act_bytes=2, seq_len=8192)
    assert a == b == 32 * m.hidden_size  # Korthikanti's 34sbh minus the two dropout masks


def test_state_bytes_per_param(catalog):
    n = preset("llama-2-13b").param_count()
    ddp = estimate_memory(setup(catalog, strategy="ddp", gpus=8))
    assert ddp.states_full / n == pytest.approx(18, rel=1e-6)  # 16 persistent + 2 bf16 working copy
    z3 = estimate_memory(setup(catalog, strategy="zero3"))
    assert z3.states_full < 16 * n / 8 * 1.25  # 16/dp + gathered units
    pure = estimate_memory(setup(catalog, strategy="ddp", optimizer_dtype="bf16"))
    assert pure.states_full / n == pytest.approx(8, rel=1e-6)
    lora = estimate_memory(setup(catalog, strategy="ddp", method="lora"))
    assert 2 < lora.states_full / n < 2.1  # frozen bf16 base + adapters (0.5% of params, 16 bytes each)
    qlora = estimate_memory(setup(catalog, strategy="ddp", method="qlora"))
    assert qlora.states_full < lora.states_full * 0.4


def test_offload_moves_states_to_host(catalog):
    on = estimate_memory(setup(catalog, strategy="zero3"))
    off = estimate_memory(setup(catalog, strategy="zero3", offload="optimizer+params"))
    assert off.states_full < on.states_full / 3
    assert off.host_offloaded_per_gpu > 0 and off.host_per_node > on.host_per_node


def test_model_flops_per_token_is_6n_plus_attention(catalog):
    s = setup(catalog)
    m = s.model
    assert model_flops_per_token(s) == 6 * m.matmul_params() + 12 * m.num_layers * m.q_dim * s.seq_len


def test_speed_physics(catalog):
    base = estimate_step(setup(catalog, micro_batch=2))
    full = estimate_step(setup(catalog, micro_batch=2, activation_checkpointing="full"))
    assert full.tokens_per_s < base.tokens_per_s and full.hfu > full.mfu
    two = estimate_step(setup(catalog, micro_batch=2, gpus=16))
    assert base.tokens_per_s < two.tokens_per_s < 2 * base.tokens_per_s
    h100 = estimate_step(setup(catalog, instance="p5.48xlarge", micro_batch=2))
    fp8 = estimate_step(setup(catalog, instance="p5.48xlarge", micro_batch=2, precision="fp8"))
    assert h100.tokens_per_s > 2 * base.tokens_per_s and fp8.tokens_per_s > h100.tokens_per_s
    for st in (base, full, two, h100):
        assert 0.2 < st.mfu < 0.7


def test_slow_network_is_communication_bound(catalog):
    fast = estimate_step(setup(catalog, gpus=16, micro_batch=1))
    slow = estimate_step(setup(catalog, gpus=16, micro_batch=1, inter_node_gbps=10))
    assert slow.exposed_comm_s > 10 * fast.exposed_comm_s and slow.tokens_per_s < fast.tokens_per_s


def test_estimate_result_schema_keys(catalog):
    r = estimate_setup(setup(catalog, tokens=2e9)).model_dump()
    assert set(r["memory"]["per_gpu_gib"]) >= {"weights", "gradients", "optimizer", "activations", "other", "peak"}
    assert set(r["throughput"]) >= {"tokens_per_s", "tokens_per_s_per_gpu", "mfu", "step_time_s", "step_breakdown_s"}
    assert set(r["throughput"]["step_breakdown_s"]) == {"compute", "exposed_communication", "other"}
    assert r["schema_version"] == 1 and r["time"]["train_hours"] > 0
    assert 0 < r["throughput"]["mfu"] < 1
    assert r["cost"]["total_usd"] == pytest.approx(r["cost"]["usd_per_hour_total"] * r["time"]["train_hours"])
    parts = r["memory"]["per_gpu_gib"]
    assert parts["peak"] == pytest.approx(sum(v for k, v in parts.items() if k != "peak"))


def test_unknowns_are_null(catalog):
    r = estimate_setup(setup(catalog)).model_dump()  # no tokens
    assert r["time"]["train_hours"] is None and r["cost"]["total_usd"] is None
    assert r["cost"]["usd_per_hour"] > 0
    lam = estimate_setup(setup(catalog, instance="gpu_8x_h100_sxm5", tokens=1e9)).model_dump()
    assert lam["cost"]["spot_total_usd"] is None and lam["cost"]["total_usd"] > 0
    p5e = estimate_setup(setup(catalog, instance="p5e.48xlarge", tokens=1e9))
    assert p5e.cost.total_usd is None and any("no on-demand price" in w for w in p5e.warnings)


def test_spot_total_includes_rework(catalog):
    r = estimate_setup(setup(catalog, tokens=2e9))
    c = r.cost
    plain = c.spot_usd_per_hour * r.time.compute_hours
    assert c.spot_total_usd > plain and c.spot_overhead_fraction > 0
    assert c.spot_total_usd == pytest.approx(plain * (1 + c.spot_overhead_fraction))


def test_young_daly():
    assert young_daly(60, 24 * 3600) == pytest.approx((2 * 60 * 24 * 3600) ** 0.5 - 60)


def test_storage_plan_against_the_instance(catalog):
    r = estimate_setup(setup(catalog, model="llama-2-70b", instance="p4de.24xlarge", gpus=32, tokens=1e9))
    st = r.storage
    assert st.checkpoint_gb == pytest.approx(12 * preset("llama-2-70b").param_count() / 1e9)
    assert st.hot_tier_have_gb_per_node == 8000 and st.hot_tier_fits is True
    assert st.hot_tier_need_gb_per_node == pytest.approx(st.checkpoint_gb_per_node * 3)
    p3 = estimate_setup(setup(catalog, model="gpt3-1.3b", instance="p3.16xlarge", tokens=1e9))
    assert any("no local NVMe" in n for n in p3.storage.notes)
