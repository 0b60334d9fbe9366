"""--lora-targets (plan/lora_targets.py): which linear layers LoRA adapts, named as PEFT, Megatron or the planner
name them; what fewer adapters change (parameters, FLOPs, step time, activations); and the usage errors."""

import json

import pytest
from cloud_stubs import cli_run

from trainready.errors import UsageError
from trainready.plan.activations import ADAPTER_BYTES, layer_bytes_per_token, op_sac_matmuls
from trainready.plan.job import JobSpec
from trainready.plan.lora_targets import check_targets, peft_target_modules
from trainready.plan.memory import estimate_memory, param_counts
from trainready.plan.performance import estimate_step, model_flops_per_token
from trainready.plan.presets import preset
from trainready.plan.recipes import recipe_for
from trainready.plan.setup import resolve

LLAMA = preset("llama-3-8b")
ALL = ("q", "k", "v", "o", "gate", "up", "down")


def lora(catalog, **kw):
    """Llama 3 8B LoRA on 8 H100 as the DGX Cloud recipe runs it (rank 8, packed 4096-token sequences)."""
    base = dict(model="llama-3-8b", gpu="h100-80gb", gpus=8, method="lora", lora_rank=8, strategy="zero1",
                micro_batch=1, global_batch=32, seq_len=4096, precision="bf16", stack="megatron")
    base.update(kw)
    return resolve(JobSpec(**base), catalog)


@pytest.mark.parametrize("names, expected", [
    (["linear_qkv"], ("q", "k", "v")),  # Megatron's fused projection: its three parts
    (["v_proj", "q_proj"], ("q", "v")),  # PEFT's names, in the model's order
    (["V_PROJ"], ("v",)),
    (["attention"], ("q", "k", "v", "o")),
    (["linear_fc1", "linear_fc2"], ("gate", "up", "down")),
    (["all-linear"], None),  # every linear layer: the default, said as such
    (["attention", "mlp"], None),
    (["o", "output_proj", "linear_proj"], ("o",)),  # the same layer named three ways
])
def test_names_of_every_convention_map_onto_the_models_linears(names, expected):
    assert check_targets(names, LLAMA, "lora") == expected


def test_names_follow_the_model():
    gpt = preset("gpt3-175b")  # q, k and v in one module (c_attn), and an MLP that is not gated
    assert [n for n, _, _ in gpt.linear_layers()] == ["qkv", "o", "up", "down"]
    assert check_targets(["linear_fc1"], gpt, "lora") == ("up",)
    assert check_targets(["q_proj"], gpt, "lora") == check_targets(["linear_qkv"], gpt, "lora") == ("qkv",)
    assert check_targets(["c_attn", "out_proj"], gpt, "lora") == ("qkv", "o")
    assert check_targets(["linear_q_down_proj", "kv_b_proj"], preset("deepseek-v3"), "qlora") == ("q_a", "kv_b")
    assert check_targets(None, LLAMA, "lora") is None  # every linear layer (Setup.lora_targets None)
    assert check_targets(["ALL-LINEAR"], LLAMA, "lora") is None
    assert check_targets(None, LLAMA, "full") is None


@pytest.mark.parametrize("model, names, said", [
    ("gpt3-175b", ["gate_proj"], "not gated"),
    ("mixtral-8x7b", ["mlp"], "routed experts"),
    ("deepseek-v3", ["linear_qkv"], "latent attention"),
    ("llama-3-8b", ["qproj"], "q_proj"),  # the nearest name
    ("llama-3-8b", [], "names no module"),
    ("llama-3-8b", ["", "  "], "names no module"),
])
def test_a_name_the_model_lacks_is_a_usage_error_that_names_the_valid_ones(model, names, said):
    with pytest.raises(UsageError) as err:
        check_targets(names, preset(model), "lora")
    assert said in str(err.value)
    if said != "names no module":
        assert "linear layers:" in str(err.value)


def test_targets_with_full_training_are_refused():
    with pytest.raises(UsageError, match="--method lora"):
        check_targets(["q_proj"], LLAMA, "full")


def test_fewer_targets_fewer_adapters_and_flops(catalog):
    every, qkv = lora(catalog), lora(catalog, lora_targets=["linear_qkv"])
    d, kv, layers = LLAMA.hidden_size, LLAMA.kv_dim, LLAMA.num_layers
    per_layer = 8 * (3 * d + d + 2 * kv)  # rank 8: A (d x r) and B (r x out) on q, k and v
    assert LLAMA.lora_params_per_layer(8, qkv.lora_targets) == per_layer
    assert param_counts(qkv).trainable == layers * per_layer
    assert param_counts(every).trainable == layers * LLAMA.lora_params_per_layer(8) > param_counts(qkv).trainable
    # the MFU numerator: 4N for the frozen base, 6 per adapter parameter
    drop = layers * (LLAMA.lora_params_per_layer(8) - per_layer)
    assert model_flops_per_token(every) - model_flops_per_token(qkv) == pytest.approx(6 * drop)
    assert estimate_step(qkv).step_s < estimate_step(every).step_s


def test_all_linear_named_is_the_default(catalog):
    named, default = lora(catalog, lora_targets=["all-linear"]), lora(catalog)
    assert estimate_step(named).step_s == estimate_step(default).step_s
    assert estimate_memory(named).peak == estimate_memory(default).peak


def test_peft_saves_an_fp32_input_copy_only_for_the_adapted_linears():
    kw = dict(kernels="eager", residual_bytes=2, act_bytes=2, method="lora", fp32_adapters=True)
    every = layer_bytes_per_token(LLAMA, **kw)
    q_v = layer_bytes_per_token(LLAMA, **kw, lora_targets=("q", "v"))
    dropped = sum(i for n, i, _ in LLAMA.linear_layers() if n not in ("q", "v"))
    assert every - q_v == ADAPTER_BYTES * dropped


def test_the_op_policy_sees_adapters_only_after_adapted_linears():
    adapters = [a for *_, a in op_sac_matmuls(LLAMA, "lora", 16, lora_targets=("q",))]
    assert adapters == [False, True, True] + [False] * 6  # q, its A and B, then k v o gate up down
    gpt = preset("gpt3-175b")  # fused q/k/v (one module in its Hugging Face code): one adapter, whatever names it
    fused = op_sac_matmuls(gpt, "lora", 16, lora_targets=check_targets(["v_proj"], gpt, "lora"))
    assert [a for *_, a in fused] == [False, True, True, False, False, False]


def test_a_fused_qkv_module_carries_one_adapter_however_it_is_named(catalog):
    def mpt(targets):
        return resolve(JobSpec(model="mpt-7b", gpu="h100-80gb", gpus=8, method="lora", lora_targets=targets,
                               micro_batch=1, global_batch=32, seq_len=2048), catalog)
    one, three = mpt(["q_proj"]), mpt(["linear_qkv"])
    assert one.lora_targets == three.lora_targets == ("qkv",)
    assert estimate_step(one).step_s == estimate_step(three).step_s
    assert estimate_memory(one).peak == estimate_memory(three).peak
    m = one.model  # PEFT's LoRA on Wqkv: A of d x r, B of r x 3d
    assert m.lora_params_per_layer(16, one.lora_targets) == 16 * (m.hidden_size + 3 * m.hidden_size)


def test_peft_recipe_names_the_modules(catalog):
    s = lora(catalog, stack=None, strategy="zero3", lora_targets=["q_proj", "v_proj"])
    assert "target_modules=['q_proj', 'v_proj']" in " ".join(recipe_for(s, "deepspeed").notes)
    assert "target_modules='all-linear'" in " ".join(recipe_for(lora(catalog, stack=None, strategy="zero3"),
                                                                "deepspeed").notes)
    assert "target_modules='all-linear'" in " ".join(recipe_for(lora(catalog, stack=None, strategy="zero3",
                                                                     lora_targets=["all-linear"]), "deepspeed").notes)
    gpt = resolve(JobSpec(model="gpt3-1.3b", gpu="h100-80gb", gpus=8, method="lora", lora_targets=["attention"],
                          strategy="zero3", global_batch=32, seq_len=2048), catalog)
    assert "target_modules=['c_attn', 'attn.c_proj']" in " ".join(recipe_for(gpt, "deepspeed").notes)


def test_peft_names_of_other_families():
    opt = preset("llama-3-8b").model_copy(update={"family": "opt", "mlp": "gelu", "activation": "relu"})
    assert peft_target_modules(check_targets(["attention", "mlp"][:1] + ["fc1"], opt, "lora"), opt) \
        == "['q_proj', 'k_proj', 'v_proj', 'out_proj', 'fc1']"
    # a MoE model's shared experts by their parent's name: a bare gate_proj would match the routed experts too
    dsv3 = preset("deepseek-v3")
    assert peft_target_modules(check_targets(["mlp"], dsv3, "lora"), dsv3) == \
        "['shared_experts.gate_proj', 'shared_experts.up_proj', 'shared_experts.down_proj']"


ARGS = ("estimate", "--model", "llama-3-8b", "--gpu", "h100-80gb", "--gpus", "8", "--method", "lora",
        "--global-batch", "32", "--seq-len", "4096")


def test_cli_json_and_table_name_the_targets(tmp_path):
    out = cli_run(*ARGS, "--lora-targets", "q_proj, v_proj", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["setup"]["lora_targets"] == ["q", "v"]
    assert json.loads(cli_run(*ARGS, "--json").stdout)["setup"]["lora_targets"] is None  # every linear layer
    assert "lora r=16 on q, v" in cli_run(*ARGS, "--lora-targets", "q_proj,v_proj").stdout
    job = tmp_path / "job.toml"
    assert cli_run(*ARGS, "--lora-targets", "linear_qkv", "--save", job).returncode == 0
    again = cli_run("estimate", "--job", job, "--json")
    assert json.loads(again.stdout)["setup"]["lora_targets"] == ["q", "k", "v"]
    full = cli_run("estimate", "--job", job, "--method", "full", "--json")  # the file's targets go with its LoRA
    assert full.returncode == 0, full.stderr
    assert json.loads(full.stdout)["setup"]["lora_targets"] is None


@pytest.mark.parametrize("extra, said", [
    (("--lora-targets", "qproj"), "q_proj"),
    (("--lora-targets", "gate_proj", "--model", "gpt3-1.3b", "--seq-len", "2048"), "not gated"),
    (("--lora-targets", "q_proj", "--method", "full"), "--method lora"),
])
def test_cli_bad_targets_exit_2_with_the_valid_names(extra, said):
    out = cli_run(*ARGS, *extra)
    assert out.returncode == 2 and said in out.stderr and "Traceback" not in out.stderr, out.stderr
