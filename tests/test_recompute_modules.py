"""Megatron's --recompute-modules (plan/recompute.py): what each module frees, what it runs again, the published
DeepSeek-V3 layout that needs them, and the usage errors."""

import json

import pytest
from cloud_stubs import cli_run

from trainready.errors import UsageError
from trainready.plan import moe
from trainready.plan.job import JobSpec
from trainready.plan.memory import activation_parts, estimate_memory
from trainready.plan.performance import estimate_step
from trainready.plan.recompute import published_modules
from trainready.plan.setup import resolve

GiB = 2**30


def dsv3(catalog, **kw):
    """DeepSeek-V3 on 1024 H100 as Megatron-MoE-ModelZoo runs it (best_practice/DeepSeekV3/run.sh: TP2 PP8 VPP4
    EP64, FP8 blockwise, DeepEP, EP all-to-all overlap, --recompute-modules mla_up_proj mlp), forced balance."""
    base = dict(model="deepseek-v3", instance="p5.48xlarge", gpus=1024, tp=2, pp=8, pp_virtual=4, ep=64, etp=1,
                strategy="zero1", micro_batch=1, global_batch=8192, seq_len=4096, precision="fp8",
                fp8_recipe="blockwise", stack="megatron", expert_load_imbalance=1.0, ep_dispatcher="deepep",
                ep_overlap=True, activation_checkpointing="selective", recompute_modules=["mla_up_proj", "mlp"])
    base.update(kw)
    return resolve(JobSpec(**base), catalog)


def saved(s) -> float:
    return activation_parts(s)[0]


def test_the_published_deepseek_v3_layout_fits_with_its_modules_and_not_without(catalog):
    with_modules = estimate_memory(dsv3(catalog))
    attention_core = estimate_memory(dsv3(catalog, recompute_modules=None))  # Megatron's default: core_attn
    card = 80e9 / GiB
    assert with_modules.peak / GiB < card < attention_core.peak / GiB
    # what mla_up_proj frees: Q, K (128 heads x 192) and V (128 x 128) in bf16, and the normalized latents
    # (1536 + 512), per token of every layer, split over TP 2
    per_token = 2 * (2 * 128 * 192 + 128 * 128 + 1536 + 512) / 2
    a, b = dsv3(catalog, recompute_modules=["mla_up_proj"]), dsv3(catalog, recompute_modules=["core_attn"])
    layers = a.stage_layers
    assert saved(b) - saved(a) >= per_token * 4096 * layers  # at least one micro-batch of the first stage


def test_each_module_frees_what_it_keeps_from_backward(catalog):
    qwen = dict(model="qwen3-30b-a3b", instance="p5.48xlarge", gpus=8, ep=8, strategy="zero1", micro_batch=1,
                stack="megatron", activation_checkpointing="selective", expert_load_imbalance=1.0)
    s = lambda mods: resolve(JobSpec(**qwen, recompute_modules=mods), catalog)  # noqa: E731
    base = saved(s(["core_attn"]))
    tokens, layers = 4096, 48
    d, f, k = 2048, 768, 8
    # moe_act: the activation output, the second expert GEMM's input: k rows x expert width, bf16
    assert base - saved(s(["moe_act"])) == pytest.approx(tokens * layers * k * f * 2)
    # layernorm: only the MoE layers' pre-MLP norm is a module of its own (GQA attention fuses its norm)
    assert base - saved(s(["layernorm"])) == pytest.approx(tokens * layers * d * 2)
    # moe frees the whole MoE part (more than moe_act), and its all-to-alls run again
    assert base - saved(s(["moe"])) > base - saved(s(["moe_act"]))
    assert moe.a2a_s(s(["moe"]), tokens, 8, 1e3) > moe.a2a_s(s(["core_attn"]), tokens, 8, 1e3)
    # a dense model: layernorm frees nothing (TE fuses both norms), mlp frees the MLP and its fused norm's output
    llama = dict(model="llama-3.1-8b", instance="p5.48xlarge", strategy="zero1", micro_batch=1, stack="megatron",
                 activation_checkpointing="selective")
    dense = lambda mods: resolve(JobSpec(**llama, recompute_modules=mods), catalog)  # noqa: E731
    assert saved(dense(["layernorm"])) == saved(dense(["core_attn"])) == saved(dense(None))
    freed = saved(dense(["core_attn"])) - saved(dense(["mlp"]))
    assert freed == pytest.approx(4096 * 32 * (3 * 14336 * 2 + 4096 * 2))


def test_recomputed_modules_cost_time_and_hardware_flops(catalog):
    llama = dict(model="llama-3.1-8b", instance="p5.48xlarge", strategy="zero1", micro_batch=1, stack="megatron",
                 activation_checkpointing="selective")
    default = estimate_step(resolve(JobSpec(**llama), catalog))
    mlp = estimate_step(resolve(JobSpec(**llama, recompute_modules=["mlp"]), catalog))
    both = estimate_step(resolve(JobSpec(**llama, recompute_modules=["core_attn", "mlp"]), catalog))
    none = estimate_step(resolve(JobSpec(**{**llama, "activation_checkpointing": "none"}), catalog))
    # without core_attn the attention is not run again; the MLP's GEMMs are
    assert none.step_s < default.step_s < both.step_s and none.step_s < mlp.step_s < both.step_s
    assert both.hfu_flops_per_token - none.hfu_flops_per_token == pytest.approx(
        (default.hfu_flops_per_token - none.hfu_flops_per_token) + 2 * 32 * 3 * 4096 * 14336)
    assert mlp.model_flops_per_token == none.model_flops_per_token  # MFU counts the model, not the recompute


@pytest.mark.parametrize("kw, words", [
    (dict(recompute_modules=["bogus"]), ["unknown module bogus", "mla_up_proj"]),
    (dict(recompute_modules=["mlp"], stack="torchtitan"), ["stack torchtitan", "--stack megatron"]),
    (dict(recompute_modules=["mlp"], activation_checkpointing="full"), ["needs --activation-checkpointing selective"]),
    (dict(recompute_modules=["mla_up_proj"]), ["needs multi-latent attention", "llama-3.1-8b"]),
    (dict(recompute_modules=["moe_act"]), ["mixture-of-experts", "dense"]),
    (dict(recompute_modules=["mlp"], method="lora"), ["full training", "lora"]),
    (dict(recompute_modules=[]), ["names no module"]),
])
def test_bad_module_lists_are_usage_errors_naming_the_valid_ones(catalog, kw, words):
    job = dict(model="llama-3.1-8b", instance="p5.48xlarge", strategy="zero1", stack="megatron",
               activation_checkpointing="selective")
    with pytest.raises(UsageError) as exc:
        resolve(JobSpec(**{**job, **kw}), catalog)
    for w in words:
        assert w in str(exc.value)


def test_cli_takes_the_list_reports_it_and_the_recipe_passes_it_on(tmp_path):
    args = ["estimate", "--model", "deepseek-v3", "--instance", "p5.48xlarge", "--gpus", "1024", "--tp", "2", "--pp",
            "8", "--pp-virtual", "4", "--ep", "64", "--etp", "1", "--strategy", "zero1", "--micro-batch", "1",
            "--global-batch", "8192", "--precision", "fp8", "--stack", "megatron", "--activation-checkpointing",
            "selective", "--recompute-modules", "mlp, mla_up_proj"]
    r = cli_run(*args, "--json")
    assert r.returncode == 0, r.stderr
    setup = json.loads(r.stdout)["setup"]
    assert setup["recompute_modules"] == ["mla_up_proj", "mlp"]  # Megatron's order
    assert setup["activation_checkpointing"] == "selective-attn"
    human = cli_run(*args, columns=80)
    assert "selective (mla_up_proj, mlp) recompute" in " ".join(human.stdout.split())
    bad = cli_run(*args[:-1], "mla_up_proj,[bold]x")
    assert bad.returncode == 2 and "unknown module [bold]x" in bad.stderr and "Traceback" not in bad.stderr
    # plan --save / estimate --save keep the list; estimate --job reads it back
    r = cli_run(*args, "--save", str(tmp_path / "job.toml"))
    assert r.returncode == 0, r.stderr
    assert "recompute_modules" in (tmp_path / "job.toml").read_text()
    back = cli_run("estimate", "--job", str(tmp_path / "job.toml"), "--json")
    assert json.loads(back.stdout)["setup"]["recompute_modules"] == ["mla_up_proj", "mlp"]
    # a checkpointing given on the command line replaces the file's list with it
    full = cli_run("estimate", "--job", str(tmp_path / "job.toml"), "--activation-checkpointing", "full", "--json")
    assert full.returncode == 0, full.stderr
    assert json.loads(full.stdout)["setup"]["recompute_modules"] is None


def test_published_lists_read_with_their_short_names():
    assert published_modules("selective:norm,act") == ["layernorm", "moe_act"]
    assert published_modules("selective:mla_up_proj,mlp") == ["mla_up_proj", "mlp"]
    assert published_modules("layernorm, moe_act") == ["layernorm", "moe_act"]


def test_plan_save_writes_its_row_s_list_not_the_file_s(tmp_path):
    job = tmp_path / "job.toml"
    r = cli_run("estimate", "--model", "qwen3-30b-a3b", "--instance", "p5.48xlarge", "--ep", "8", "--strategy", "zero1",
                "--stack", "megatron", "--activation-checkpointing", "selective", "--recompute-modules",
                "shared_experts", "--save", str(job))
    assert r.returncode == 0, r.stderr
    out = tmp_path / "best.toml"
    p = cli_run("plan", "--job", str(job), "--instances", "p5.48xlarge", "--save", str(out), "--json")
    assert p.returncode == 0, p.stderr
    row = json.loads(p.stdout)["rows"][0]["estimate"]
    back = cli_run("estimate", "--job", str(out), "--json")  # the row's checkpointing and list, not the file's
    assert back.returncode == 0, back.stderr
    again = json.loads(back.stdout)
    assert again["setup"]["recompute_modules"] == row["setup"]["recompute_modules"] != ["shared_experts"]
    assert again["setup"]["activation_checkpointing"] == row["setup"]["activation_checkpointing"]
    assert again["throughput"]["tokens_per_s"] == pytest.approx(row["throughput"]["tokens_per_s"])


def test_moe_act_frees_the_rank_s_share_under_expert_tp(catalog):
    """Expert TP splits the activation's width: each rank frees k x f / tp per token, never more than it keeps."""
    job = dict(model="mixtral-8x7b", instance="p5.48xlarge", tp=8, strategy="zero1", micro_batch=1, stack="megatron",
               activation_checkpointing="selective", expert_load_imbalance=1.0)
    s = lambda mods: resolve(JobSpec(**job, recompute_modules=mods), catalog)  # noqa: E731
    assert s(["moe_act"]).expert_tp == 8
    freed = saved(s(["core_attn"])) - saved(s(["moe_act"]))
    assert freed == pytest.approx(4096 * 32 * 2 * 14336 * 2 / 8)
    full = resolve(JobSpec(**{**job, "activation_checkpointing": "full"}), catalog)
    assert saved(full) < saved(s(["moe_act"]))


def test_mla_without_a_q_latent_recomputes_the_q_projection(catalog):
    from trainready.plan.model_spec import MLASpec
    from trainready.plan.performance import recompute_flops_per_token
    from trainready.plan.presets import preset

    v3 = preset("deepseek-v3")
    lite = v3.model_copy(update={"name": "no-q-latent", "mla": MLASpec(**{**v3.mla.model_dump(), "q_lora_rank": None})})
    job = dict(instance="p5.48xlarge", strategy="zero1", ep=8, micro_batch=1, stack="megatron",
               activation_checkpointing="selective", recompute_modules=["mla_up_proj"])
    s = resolve(JobSpec(model="deepseek-v3", **job), catalog, model=lite)
    a, h = lite.mla, lite.num_heads
    expected = 2 * lite.num_layers * (lite.hidden_size * h * a.qk_head_dim
                                      + a.kv_lora_rank * h * (a.qk_nope_head_dim + a.v_head_dim))
    assert recompute_flops_per_token(s) == pytest.approx(expected)


def test_delayed_fp8_with_moe_act_or_layernorm_is_one_megatron_refuses(catalog):
    from trainready.plan.recipes import framework_for

    job = dict(model="qwen3-30b-a3b", instance="p5.48xlarge", ep=8, strategy="zero1", stack="megatron",
               activation_checkpointing="selective", precision="fp8", recompute_modules=["layernorm", "moe_act"])
    fw, why = framework_for(resolve(JobSpec(**job), catalog), "megatron")
    assert fw is None and "delayed FP8 scaling" in why and "--fp8-recipe" in why
    ok = resolve(JobSpec(**{**job, "fp8_recipe": "blockwise"}), catalog)
    assert framework_for(ok, "megatron")[0] == "megatron"


def test_restating_the_file_s_stack_or_checkpointing_keeps_its_list(tmp_path):
    job = tmp_path / "job.toml"
    r = cli_run("estimate", "--model", "qwen3-30b-a3b", "--instance", "p5.48xlarge", "--ep", "8", "--strategy", "zero1",
                "--stack", "megatron", "--activation-checkpointing", "selective", "--recompute-modules", "moe_act",
                "--save", str(job))
    assert r.returncode == 0, r.stderr
    for extra in (["--stack", "megatron"], ["--activation-checkpointing", "selective"]):
        back = cli_run("estimate", "--job", str(job), *extra, "--json")
        assert json.loads(back.stdout)["setup"]["recompute_modules"] == ["moe_act"], extra
