"""--cuda-graphs: Megatron's per-layer CUDA graphs. A captured layer's kernels replay from its graph, so the host's
per-block launch floor goes; a dropless MoE layer's dispatch and experts stay eager. Refused on stacks whose graphs
are not modelled; Megatron-Core's own refusals (full recompute, moe recompute beside the graphed router) are the
megatron recipe's."""

import json

import pytest
from cloud_stubs import cli_run

from trainready.errors import UsageError
from trainready.plan.job import JobSpec
from trainready.plan.performance import estimate_step
from trainready.plan.recipes import framework_for, recipe_for
from trainready.plan.setup import resolve

SMALL = dict(model="llama-3.2-1b", instance="p5.48xlarge", stack="megatron", strategy="zero1", micro_batch=1,
             seq_len=1024, global_batch=64)  # a step the host's launches bound


def est(catalog, **kw):
    s = resolve(JobSpec(**{**SMALL, **kw}), catalog)
    return s, estimate_step(s)


def test_whole_layer_graphs_lift_the_launch_floor(catalog):
    _, eager = est(catalog)
    s, graphed = est(catalog, cuda_graphs=True)
    assert s.graphs_whole_layers
    assert eager.other_s > 0 and graphed.other_s == 0  # the host's launch stall, gone
    assert graphed.compute_s == pytest.approx(eager.compute_s)  # the GPU's own work is the same
    assert graphed.tokens_per_s > 1.2 * eager.tokens_per_s


def test_a_dropless_moe_layer_keeps_its_eager_part(catalog):
    kw = dict(model="qwen3-30b-a3b", ep=8, micro_batch=1, seq_len=256, global_batch=64)
    s, graphed = est(catalog, cuda_graphs=True, **kw)
    _, eager = est(catalog, **kw)
    assert not s.graphs_whole_layers
    assert graphed.step_s == pytest.approx(eager.step_s)


def test_refused_where_not_modelled(catalog):
    with pytest.raises(UsageError) as err:
        est(catalog, stack="torchtitan", strategy="zero3", cuda_graphs=True)
    assert "--cuda-graphs: stack torchtitan's CUDA graphs are not modelled" in str(err.value)
    assert "megatron" in str(err.value)


def test_the_megatron_recipe_says_which_graphs(catalog):
    dense = resolve(JobSpec(**{**SMALL, "cuda_graphs": True}), catalog)
    assert "--cuda-graph-impl transformer_engine" in recipe_for(dense, "megatron").config
    assert "--cuda-graph-scope" not in recipe_for(dense, "megatron").config  # the whole layer, Megatron's default
    moe = resolve(JobSpec(**{**SMALL, "model": "qwen3-30b-a3b", "ep": 8, "cuda_graphs": True}), catalog)
    assert "--cuda-graph-scope attn moe_router moe_preprocess" in recipe_for(moe, "megatron").config
    plain = resolve(JobSpec(**SMALL), catalog)
    assert "cuda-graph" not in recipe_for(plain, "megatron").config


@pytest.mark.parametrize("kw, said", [
    (dict(activation_checkpointing="full"), "full recompute only under a full-iteration CUDA graph"),
    (dict(model="qwen3-30b-a3b", ep=8, activation_checkpointing="selective", recompute_modules=["moe"]),
     "moe recompute beside the graphed MoE router"),
])
def test_megatron_core_refusals_are_the_recipes(catalog, kw, said):
    s = resolve(JobSpec(**{**SMALL, "cuda_graphs": True, **kw}), catalog)
    fw, why = framework_for(s, "megatron")
    assert fw is None and said in why


def test_megatron_core_itself_refuses_full_recompute_with_layer_graphs():
    """The rule the recipe's refusal states, from Megatron-Core 0.16.1's own TransformerConfig."""
    pytest.importorskip("megatron.core", reason="megatron-core is in the dev install (make .venv/.dev)")
    from megatron.core.transformer.transformer_config import TransformerConfig

    base = dict(num_layers=2, hidden_size=64, num_attention_heads=4, cuda_graph_impl="transformer_engine")
    TransformerConfig(**base)
    with pytest.raises(AssertionError, match="full recompute is only supported with full iteration CUDA graph"):
        TransformerConfig(**base, recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)


def test_cli_json_and_a_saved_job(tmp_path):
    args = ("-m", "llama-3.2-1b", "--instance", "p5.48xlarge", "--stack", "megatron", "--strategy", "zero1",
            "--micro-batch", "1", "--seq-len", "1024", "--global-batch", "64")
    r = cli_run("estimate", *args, "--cuda-graphs", "--json", "--save", str(tmp_path / "j.toml"))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["setup"]["cuda_graphs"] is True
    assert any(a.startswith("CUDA graphs (--cuda-graph-impl transformer_engine") for a in out["assumptions"])
    again = json.loads(cli_run("estimate", "--job", str(tmp_path / "j.toml"), "--json").stdout)
    assert again["setup"]["cuda_graphs"] is True
    off = json.loads(cli_run("estimate", "--job", str(tmp_path / "j.toml"), "--no-cuda-graphs", "--json").stdout)
    assert off["setup"]["cuda_graphs"] is False
    assert off["throughput"]["tokens_per_s"] < again["throughput"]["tokens_per_s"]
    bad = cli_run("plan", "-m", "llama-3.2-1b", "--tokens", "1e9", "--cuda-graphs")
    assert bad.returncode == 2 and "not modelled" in bad.stdout + bad.stderr


def test_a_moe_padded_to_capacity_is_captured_whole(catalog):
    """Token-drop routing padded to capacity has static shapes: Megatron captures the whole layer (the recipe pads,
    --moe-pad-expert-input-to-capacity, and names no scope), and its launch floor goes."""
    kw = dict(model="qwen3-30b-a3b", ep=8, micro_batch=1, seq_len=256, global_batch=64, moe_routing="capacity",
              capacity_factor=1.0)
    s, graphed = est(catalog, cuda_graphs=True, **kw)
    _, eager = est(catalog, **kw)
    assert s.graphs_whole_layers and graphed.other_s == 0 < eager.other_s
    config = recipe_for(s, "megatron").config
    assert "--moe-pad-expert-input-to-capacity" in config and "--cuda-graph-scope" not in config


def test_plan_says_what_the_graphs_leave_out():
    r = cli_run("plan", "-m", "llama-3.2-1b", "--tokens", "1e9", "--stack", "megatron", "--instances", "p5.48xlarge",
                "--seq-len", "1024", "--cuda-graphs", "--json")
    out = json.loads(r.stdout)
    assert r.returncode == 0 and all(row["estimate"]["setup"]["cuda_graphs"] for row in out["rows"])
    assert any("--cuda-graphs" in n and "not counted in GiB/GPU" in n for n in out["notes"])
